package ninep

import (
	"errors"
	"io"
	"os"
	"strings"
	"syscall"

	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"
)

// Client is a small 9P2000.L client for tools and tests: whole-file reads and writes by
// path, like cat and echo. Errors the server sent are syscall.Errno values, so
// errors.Is(err, syscall.EINVAL) works.
type Client struct {
	c    *p9.Client
	root p9.File
}

// NewClient negotiates 9P2000.L on conn and attaches to the root of the tree.
func NewClient(conn io.ReadWriteCloser) (*Client, error) {
	c, err := p9.NewClient(conn, p9.WithMessageSize(64<<10))
	if err != nil {
		return nil, sysErr(err)
	}
	root, err := c.Attach("/")
	if err != nil {
		c.Close()
		return nil, sysErr(err)
	}
	return &Client{c: c, root: root}, nil
}

// Close clunks the root and closes the connection.
func (c *Client) Close() error {
	c.root.Close()
	return c.c.Close()
}

func sysErr(err error) error {
	var le linux.Errno
	if errors.As(err, &le) {
		return syscall.Errno(le)
	}
	return err
}

func (c *Client) walk(path string) (p9.File, error) {
	var names []string
	for _, n := range strings.Split(path, "/") {
		if n != "" {
			names = append(names, n)
		}
	}
	_, f, err := c.root.Walk(names)
	return f, sysErr(err)
}

// ReadFile opens path read-only and reads it to the end.
func (c *Client) ReadFile(path string) ([]byte, error) {
	f, err := c.walk(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if _, _, err := f.Open(p9.ReadOnly); err != nil {
		return nil, sysErr(err)
	}
	var out []byte
	buf := make([]byte, 32<<10)
	for {
		n, err := f.ReadAt(buf, int64(len(out)))
		out = append(out, buf[:n]...)
		if errors.Is(err, io.EOF) || (err == nil && n == 0) {
			return out, nil
		}
		if err != nil {
			return out, sysErr(err)
		}
	}
}

// WriteFile opens path write-only, writes data in one write call (split by the message
// size if larger) and clunks the fid. It returns the first error: of the open, of the
// write, or of the clunk (where sm/partitions reports a rejected configuration).
func (c *Client) WriteFile(path string, data []byte) error {
	f, err := c.walk(path)
	if err != nil {
		return err
	}
	if _, _, err := f.Open(p9.WriteOnly); err != nil {
		f.Close()
		return sysErr(err)
	}
	// A store takes at most a page and answers short, as on sysfs: the rest is
	// written as write(2) in a loop writes it (each part a store of its own).
	var werr error
	for off := 0; off < len(data) && werr == nil; {
		var k int
		k, werr = f.WriteAt(data[off:], int64(off))
		if werr == nil && k == 0 {
			werr = io.ErrShortWrite
		}
		off += k
	}
	cerr := f.Close()
	if werr != nil {
		return sysErr(werr)
	}
	return sysErr(cerr)
}

// Stat returns a path's type and permission bits.
func (c *Client) Stat(path string) (os.FileMode, error) {
	f, err := c.walk(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	_, _, a, err := f.GetAttr(p9.AttrMask{Mode: true})
	if err != nil {
		return 0, sysErr(err)
	}
	m := os.FileMode(a.Mode.Permissions())
	if a.Mode.IsDir() {
		m |= os.ModeDir
	}
	return m, nil
}

// ReadDir lists a directory's entry names in server order.
func (c *Client) ReadDir(path string) ([]string, error) {
	f, err := c.walk(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if _, _, err := f.Open(p9.ReadOnly); err != nil {
		return nil, sysErr(err)
	}
	var names []string
	var off uint64
	for {
		ds, err := f.Readdir(off, 32<<10)
		if err != nil {
			return names, sysErr(err)
		}
		if len(ds) == 0 {
			return names, nil
		}
		for _, d := range ds {
			names = append(names, d.Name)
			off = d.Offset
		}
	}
}
