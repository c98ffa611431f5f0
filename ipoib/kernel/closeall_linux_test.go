package kernel

import (
	"fmt"
	"strings"
	"testing"
	"time"
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
