package kernel

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// CloseAll deletes many devices in one request per namespace and leaves every other
// link alone: one of the administrator's in the group the search starts from, and one
// in the default group. Each device reports closed afterwards, as after Close.
func TestCloseAllDeletesOnlyItsDevices(t *testing.T) {
	prereqs(t)
	nsA, nsB := testNS(t, "ca"), testNS(t, "cb")
	var devs []*Device
	for k := range 60 {
		ns := nsA
		if k%3 == 0 {
			ns = nsB
		}
		devs = append(devs, open(t, Config{Name: uniq("c"), MTU: 1500, NetNS: ns}))
	}
	// (the namespaces exist once a device was opened in them)
	for _, ns := range []string{nsA, nsB} {
		for k, group := range []string{fmt.Sprint(firstBulkGroup), "0"} {
			name := fmt.Sprintf("keep%d", k)
			if out, err := ipCmd(t, "-n", ns, "tuntap", "add", "dev", name, "mode", "tun"); err != nil {
				t.Fatalf("%v %s", err, out)
			}
			if out, err := ipCmd(t, "-n", ns, "link", "set", name, "group", group); err != nil {
				t.Fatalf("%v %s", err, out)
			}
		}
	}
	start := time.Now()
	if err := CloseAll(devs); err != nil {
		t.Fatal(err)
	}
	t.Logf("60 devices in two namespaces deleted in %v", time.Since(start))
	for _, ns := range []string{nsA, nsB} {
		out, err := ipCmd(t, "-n", ns, "link", "show")
		if err != nil {
			t.Fatalf("%v %s", err, out)
		}
		for _, d := range devs {
			if strings.Contains(out, " "+d.Name()+":") {
				t.Errorf("%s still in %s:\n%s", d.Name(), ns, out)
			}
		}
		for _, keep := range []string{"keep0", "keep1"} {
			if !strings.Contains(out, " "+keep+":") {
				t.Errorf("%s deleted from %s:\n%s", keep, ns, out)
			}
		}
	}
	if _, err := devs[5].Write([][]byte{make([]byte, 40)}); err == nil {
		t.Error("Write on a device CloseAll closed succeeded")
	}
	if err := CloseAll(devs); err != nil { // closed already: nothing to do
		t.Fatal(err)
	}
}

// The batch deletion itself removes the devices, while their TUN file descriptors are
// still open (closing those would delete them one by one, as Close does).
func TestDeleteTogetherWithFilesOpen(t *testing.T) {
	prereqs(t)
	ns := testNS(t, "dt")
	var devs []*Device
	for range 10 {
		d := open(t, Config{Name: uniq("d"), MTU: 1500, NetNS: ns})
		if !d.beginClose() {
			t.Fatal("beginClose on a new device")
		}
		devs = append(devs, d)
	}
	if err := deleteTogether(devs); err != nil {
		t.Fatal(err)
	}
	out, err := ipCmd(t, "-n", ns, "link", "show")
	if err != nil {
		t.Fatalf("%v %s", err, out)
	}
	for _, d := range devs {
		if strings.Contains(out, " "+d.Name()+":") {
			t.Errorf("%s still there with its file open:\n%s", d.Name(), out)
		}
		if err := d.finishClose(); err != nil {
			t.Error(err)
		}
	}
}

// A namespace's devices share one thread in it for their calls (nsWorker): it runs
// in the namespace, lives while a device holds it, and after the last device inNetNS
// makes a thread of its own again, in the right namespace too.
func TestNamespaceWorker(t *testing.T) {
	prereqs(t)
	ns := testNS(t, "nw")
	d1 := open(t, Config{Name: uniq("nw"), MTU: 1500, NetNS: ns})
	d2 := open(t, Config{Name: uniq("nw"), MTU: 1500, NetNS: ns})
	nsIno := func() uint64 {
		var st unix.Stat_t
		if err := unix.Fstat(int(d1.ns), &st); err != nil {
			t.Fatal(err)
		}
		return st.Ino
	}()
	threadNS := func() (ino uint64, tid int) {
		t.Helper()
		var st unix.Stat_t
		if err := inNetNS(d1.ns, func() error {
			tid = unix.Gettid()
			return unix.Stat("/proc/thread-self/ns/net", &st)
		}); err != nil {
			t.Fatal(err)
		}
		return st.Ino, tid
	}
	w := lookupWorker(d1.ns)
	if w == nil || d1.worker != w || d2.worker != w {
		t.Fatalf("the two devices of one namespace do not share its worker: %p %p %p", w, d1.worker, d2.worker)
	}
	ino, tid1 := threadNS()
	_, tid2 := threadNS()
	if ino != nsIno || tid1 != tid2 {
		t.Fatalf("calls ran in namespace %d (want %d) on threads %d and %d (want one)", ino, nsIno, tid1, tid2)
	}
	d2.Close()
	if lookupWorker(d1.ns) != w {
		t.Fatal("the worker stopped while a device still holds it")
	}
	ns1 := d1.ns
	dup, err := unix.Dup(int(ns1)) // d1's handle closes with it
	if err != nil {
		t.Fatal(err)
	}
	d1.Close()
	if lookupWorker(ns1) != nil || lookupWorker(netns.NsHandle(dup)) != nil {
		t.Fatal("the worker outlived the namespace's last device")
	}
	var st unix.Stat_t
	if err := inNetNS(netns.NsHandle(dup), func() error { return unix.Stat("/proc/thread-self/ns/net", &st) }); err != nil || st.Ino != nsIno {
		t.Fatalf("inNetNS without a worker: namespace %d, %v; want %d", st.Ino, err, nsIno)
	}
	unix.Close(dup)
}

// Devices renamed since they were opened (by this package, or by ip link set name,
// seen by the watch) are still deleted together: the check that they are the devices
// they were goes by the names they have now.
func TestDeleteTogetherAfterRenames(t *testing.T) {
	prereqs(t)
	ns := testNS(t, "dr")
	var devs []*Device
	for range 3 {
		devs = append(devs, open(t, Config{Name: uniq("r"), MTU: 1500, NetNS: ns}))
	}
	ours, outside := uniq("ro"), uniq("rx")
	if err := devs[0].SetName(ours); err != nil {
		t.Fatal(err)
	}
	e := watch(devs[1])
	ipMust(t, "-n", ns, "link", "set", devs[1].Name(), "name", outside)
	await(t, e.links, "the new name", func(l Link) bool { return l.Name == outside })
	for _, d := range devs {
		if !d.beginClose() {
			t.Fatal("beginClose on a new device")
		}
	}
	if err := deleteTogether(devs); err != nil {
		t.Fatalf("renamed devices not deleted together: %v", err)
	}
	for _, d := range devs {
		if err := d.finishClose(); err != nil {
			t.Error(err)
		}
	}
	out, err := ipCmd(t, "-n", ns, "link", "show")
	if err != nil {
		t.Fatalf("%v %s", err, out)
	}
	for _, name := range []string{ours, outside, devs[2].Name()} {
		if strings.Contains(out, " "+name+":") {
			t.Errorf("%s still there:\n%s", name, out)
		}
	}
}
