package vm

import (
	"context"
	"errors"
	"net"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hugelgupf/p9/fsimpl/readdir"
	"github.com/hugelgupf/p9/fsimpl/templatefs"
	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"

	"ipoibfs/internal/testenv"
)

// The guest tests share one prepared image.
var (
	imageOnce sync.Once
	image     *Image
	imageErr  error
)

func prepared(t *testing.T) *Image {
	t.Helper()
	testenv.Short(t, "boots a QEMU guest (several seconds)")
	imageOnce.Do(func() { image, imageErr = Prepare() })
	if errors.Is(imageErr, ErrMissing) {
		testenv.Missing(t, imageErr.Error())
	}
	if imageErr != nil {
		t.Fatalf("Prepare: %v", imageErr)
	}
	return image
}

// testFS is a one-directory 9P2000.L file system: read-only files with fixed contents,
// and writable files whose writes fail with a chosen errno.
type testFS struct {
	names []string
	files map[string]*testFile
	qids  map[string]p9.QID
}

type testFile struct {
	templatefs.ReadOnlyFile
	templatefs.NilCloser
	p9.DefaultWalkGetAttr
	statFS

	qid      p9.QID
	content  string
	writeErr error // nil: read-only file
}

type statFS struct{}

func (statFS) StatFS() (p9.FSStat, error) {
	return p9.FSStat{Type: 0x01021997, BlockSize: 4096}, nil
}

var testMtime = uint64(time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC).Unix())

func newTestFS(content map[string]string, writeErrs map[string]error) *testFS {
	fs := &testFS{files: map[string]*testFile{}, qids: map[string]p9.QID{}}
	add := func(name string, f *testFile) {
		f.qid = p9.QID{Type: p9.TypeRegular, Path: uint64(len(fs.names) + 1)}
		fs.names = append(fs.names, name)
		fs.files[name] = f
	}
	for n, c := range content {
		add(n, &testFile{content: c})
	}
	for n, e := range writeErrs {
		add(n, &testFile{writeErr: e})
	}
	sort.Strings(fs.names)
	for n, f := range fs.files {
		fs.qids[n] = f.qid
	}
	return fs
}

func (fs *testFS) Attach() (p9.File, error) { return &testDir{fs: fs}, nil }

func (f *testFile) Walk(names []string) ([]p9.QID, p9.File, error) {
	if len(names) == 0 {
		return nil, f, nil
	}
	return nil, nil, linux.ENOTDIR
}

func (f *testFile) Open(mode p9.OpenFlags) (p9.QID, uint32, error) {
	if mode.Mode() != p9.ReadOnly && f.writeErr == nil {
		return p9.QID{}, 0, linux.EROFS
	}
	return f.qid, 0, nil
}

func (f *testFile) ReadAt(p []byte, off int64) (int, error) {
	if off >= int64(len(f.content)) {
		return 0, nil
	}
	return copy(p, f.content[off:]), nil
}

func (f *testFile) WriteAt(p []byte, off int64) (int, error) {
	if f.writeErr == nil {
		return 0, linux.EROFS
	}
	return 0, f.writeErr
}

// SetAttr accepts truncation (open with O_TRUNC) of the writable files.
func (f *testFile) SetAttr(valid p9.SetAttrMask, attr p9.SetAttr) error {
	if f.writeErr == nil {
		return linux.EROFS
	}
	return nil
}

func (f *testFile) GetAttr(req p9.AttrMask) (p9.QID, p9.AttrMask, p9.Attr, error) {
	mode := p9.FileMode(0o444)
	if f.writeErr != nil {
		mode = 0o644
	}
	return f.qid, req, p9.Attr{
		Mode: p9.ModeRegular | mode, NLink: 1, Size: uint64(len(f.content)),
		BlockSize: 4096, MTimeSeconds: testMtime, ATimeSeconds: testMtime, CTimeSeconds: testMtime,
	}, nil
}

type testDir struct {
	templatefs.ReadOnlyDir
	templatefs.NilCloser
	p9.DefaultWalkGetAttr
	statFS
	fs *testFS
}

var rootQID = p9.QID{Type: p9.TypeDir, Path: 0}

func (d *testDir) Walk(names []string) ([]p9.QID, p9.File, error) {
	switch len(names) {
	case 0:
		return nil, &testDir{fs: d.fs}, nil
	case 1:
		f, ok := d.fs.files[names[0]]
		if !ok {
			return nil, nil, linux.ENOENT
		}
		return []p9.QID{f.qid}, f, nil
	}
	return nil, nil, linux.ENOENT
}

func (d *testDir) Open(mode p9.OpenFlags) (p9.QID, uint32, error) {
	if mode.Mode() != p9.ReadOnly {
		return p9.QID{}, 0, linux.EISDIR
	}
	return rootQID, 0, nil
}

func (d *testDir) GetAttr(req p9.AttrMask) (p9.QID, p9.AttrMask, p9.Attr, error) {
	return rootQID, req, p9.Attr{Mode: p9.ModeDirectory | 0o755, NLink: 2, MTimeSeconds: testMtime}, nil
}

func (d *testDir) Readdir(offset uint64, count uint32) (p9.Dirents, error) {
	return readdir.Readdir(offset, count, d.fs.names, d.fs.qids)
}

// serve9P serves fs on 127.0.0.1 and returns the port.
func serve9P(t *testing.T, fs *testFS) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = p9.NewServer(fs).ServeContext(ctx, ln)
	}()
	t.Cleanup(func() { cancel(); ln.Close(); <-done })
	return ln.Addr().(*net.TCPAddr).Port
}

func run(t *testing.T, im *Image, port int, script string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	out, code, err := im.Run(ctx, port, script)
	t.Logf("boot+run: %v", time.Since(start).Round(time.Millisecond))
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return out, code
}

func TestGuestReadsFile(t *testing.T) {
	im := prepared(t)
	port := serve9P(t, newTestFS(map[string]string{"hello.txt": "hello from 9p\n"}, nil))
	out, code := run(t, im, port, "cat hello.txt\nls -l\necho done\n")
	if code != 0 {
		t.Fatalf("exit code %d, output:\n%s", code, out)
	}
	lines := strings.Split(out, "\n")
	if len(lines) < 3 || lines[0] != "hello from 9p" {
		t.Fatalf("cat: want first line %q, output:\n%s", "hello from 9p", out)
	}
	// busybox ls -l: "-r--r--r--    1 root     root            14 Jan  2  2024 hello.txt"
	ls := regexp.MustCompile(`(?m)^-r--r--r-- +1 root +root +14 .* hello\.txt$`)
	if !ls.MatchString(out) {
		t.Errorf("ls -l: no line matching %s in output:\n%s", ls, out)
	}
	if !strings.HasSuffix(out, "done\n") {
		t.Errorf("output does not end with %q:\n%q", "done\n", out)
	}
}

func TestGuestExitCode(t *testing.T) {
	im := prepared(t)
	port := serve9P(t, newTestFS(map[string]string{"f": "x"}, nil))
	out, code := run(t, im, port, "echo to-stdout\necho to-stderr >&2\ncat missing\nexit 7\n")
	if code != 7 {
		t.Errorf("exit code %d, want 7", code)
	}
	want := "to-stdout\nto-stderr\ncat: can't open 'missing': No such file or directory\n"
	if out != want {
		t.Errorf("output %q, want %q", out, want)
	}
}

// TestGuestWriteErrors pins the text busybox ash prints when a redirected echo's write
// fails with an errno from the server (see WriteError), and when the open fails.
func TestGuestWriteErrors(t *testing.T) {
	im := prepared(t)
	errs := map[string]syscall.Errno{"einval": syscall.EINVAL, "enodev": syscall.ENODEV, "enotuniq": syscall.ENOTUNIQ}
	writeErrs := map[string]error{}
	for n, e := range errs {
		writeErrs[n] = linux.Errno(e)
	}
	port := serve9P(t, newTestFS(map[string]string{"ro.txt": "x"}, writeErrs))
	out, code := run(t, im, port, "for f in einval enodev enotuniq; do echo 1 > $f; echo \"$f rc=$?\"; done\n"+
		"echo 1 > ro.txt\n")
	t.Logf("output:\n%s", out)
	if code != 1 {
		t.Errorf("exit code %d, want 1", code)
	}
	var want strings.Builder
	for _, n := range []string{"einval", "enodev", "enotuniq"} {
		want.WriteString(WriteError(errs[n]) + "\n" + n + " rc=1\n")
	}
	want.WriteString("/script.sh: line 2: can't create ro.txt: Read-only file system\n")
	if out != want.String() {
		t.Errorf("output:\n%s\nwant:\n%s", out, want.String())
	}
	if got := WriteError(syscall.ENOTUNIQ); got != "sh: write error: Name not unique on network" {
		t.Errorf("WriteError(ENOTUNIQ) = %q", got)
	}
}

// TestGuestNoServer checks that a mount failure comes back as an error with the console.
func TestGuestNoServer(t *testing.T) {
	im := prepared(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close() // nothing listens there now
	_, _, err = im.Run(context.Background(), port, "true")
	if err == nil || !strings.Contains(err.Error(), "guest setup failed: mount 9p") ||
		!strings.Contains(err.Error(), "Connection refused") {
		t.Fatalf("err %v, want a mount failure with the console's Connection refused", err)
	}
}

// TestGuestTimeout checks that a script that does not finish is stopped at the deadline.
func TestGuestTimeout(t *testing.T) {
	im := prepared(t)
	port := serve9P(t, newTestFS(map[string]string{"f": "x"}, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
	defer cancel()
	start := time.Now()
	_, _, err := im.Run(ctx, port, "echo started\nsleep 600\n")
	if err == nil || !strings.Contains(err.Error(), "timed out") {
		t.Fatalf("err %v, want a timeout", err)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("Run returned %v after the start, want soon after the 8 s deadline", d)
	}
}

func TestParseOutput(t *testing.T) {
	for _, c := range []struct {
		con, out string
		code     int
		ok       bool
	}{
		{"boot\nB\nhello\n\nE 3\n", "hello\n", 3, true},
		{"B\nno newline\nE 0\n", "no newline", 0, true},
		{"B\n\nE 0\n", "", 0, true},
		{"B\npartial", "partial", -1, false},
		{"nothing", "", -1, false},
	} {
		out, code, ok := parseOutput(c.con, "B", "E")
		if out != c.out || code != c.code || ok != c.ok {
			t.Errorf("parseOutput(%q) = %q, %d, %v; want %q, %d, %v", c.con, out, code, ok, c.out, c.code, c.ok)
		}
	}
}

func TestLoadOrder(t *testing.T) {
	// As in linux-image-6.1.0-56-amd64.
	deps := map[string][]string{
		"9p": {"9pnet", "fscache", "netfs"}, "9pnet": nil, "9pnet_fd": {"9pnet"},
		"fscache": {"netfs"}, "netfs": nil,
		"virtio": {"virtio_ring"}, "virtio_ring": nil,
		"virtio_pci":            {"virtio_ring", "virtio_pci_modern_dev", "virtio_pci_legacy_dev", "virtio"},
		"virtio_pci_legacy_dev": nil, "virtio_pci_modern_dev": nil,
		"virtio_net": {"virtio_ring", "virtio", "net_failover"}, "net_failover": {"failover"}, "failover": nil,
	}
	got, err := loadOrder(rootModules, deps)
	if err != nil {
		t.Fatal(err)
	}
	want := "virtio_ring virtio_pci_modern_dev virtio_pci_legacy_dev virtio virtio_pci " +
		"failover net_failover virtio_net 9pnet 9pnet_fd netfs fscache 9p"
	if s := strings.Join(got, " "); s != want {
		t.Errorf("order %s\nwant  %s", s, want)
	}
	delete(deps, "netfs")
	if _, err := loadOrder(rootModules, deps); err == nil || !strings.Contains(err.Error(), "netfs") {
		t.Errorf("missing module: err %v", err)
	}
}

func TestCPIO(t *testing.T) {
	var b strings.Builder
	w := newCPIOWriter(&b)
	w.Dir("bin", 0o755)
	w.File("bin/x", 0o644, []byte("abcde"))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	s := b.String()
	if len(s)%4 != 0 {
		t.Errorf("archive length %d not a multiple of 4", len(s))
	}
	// Header of bin/x: magic, ino 2, mode 0100644, uid, gid, nlink 1, mtime, size 5.
	if !strings.Contains(s, "070701"+"00000002"+"000081a4"+"00000000"+"00000000"+"00000001"+"00000000"+"00000005") {
		t.Errorf("no header for bin/x in %q", s)
	}
	if !strings.Contains(s, "bin/x\x00") || !strings.Contains(s, "abcde\x00\x00\x00") || !strings.Contains(s, "TRAILER!!!\x00") {
		t.Errorf("archive %q", s)
	}
}
