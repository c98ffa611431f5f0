package tests

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Two nodes configured by network-scripts files, as the vendor guide does it: ib0 and
// the partition interface ib0.8003 get their addresses, pings work over both; SIGHUP
// after an edit applies it; a bad file is reported with its line and changes nothing.
func TestIfcfgFiles(t *testing.T) {
	requireE2E(t)
	conf := filepath.Join(t.TempDir(), "partitions.conf")
	if err := os.WriteFile(conf, []byte("Default=0x7fff, ipoib : ALL=full;\nP3=0x8003, ipoib : ALL=full;\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	dirs := map[string]string{}
	for k, n := range []string{"ia", "ib"} {
		d := t.TempDir()
		dirs[n] = d
		files := map[string]string{
			"ifcfg-ib0":      "DEVICE=ib0\nTYPE=InfiniBand\nONBOOT=yes\nBOOTPROTO=static\nIPADDR=10.97.0." + string(rune('1'+k)) + "\nPREFIX=24\n",
			"ifcfg-ib0.8003": "DEVICE=ib0.8003\nTYPE=InfiniBand\nONBOOT=yes\nPKEY=yes\nPKEY_ID=3\nPHYSDEV=ib0\nIPADDR='10.98.0." + string(rune('1'+k)) + "'\nNETMASK=255.255.255.0\n",
		}
		for f, text := range files {
			if err := os.WriteFile(filepath.Join(d, f), []byte(text), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	nsA, nsB := netns(t, "ia"), netns(t, "ib")
	a := startDaemon(t, "ia", "-sm", "127.0.1.97:4791", "-netns", nsA, "-partitions", conf, "-config", dirs["ia"])
	startDaemon(t, "ib", "-fabric", "127.0.1.97:4791", "-listen", "127.0.1.98:4791", "-netns", nsB, "-config", dirs["ib"])
	for _, ns := range []string{nsA, nsB} {
		waitLink(t, ns, "ib0")
		waitLink(t, ns, "ib0.8003")
	}
	mustRun(t, "ip", "netns", "exec", nsA, "ping", "-c", "3", "-i", "0.2", "-W", "2", "10.97.0.2")
	mustRun(t, "ip", "netns", "exec", nsA, "ping", "-c", "3", "-i", "0.2", "-W", "2", "10.98.0.2")

	// An edit and a bad new file, then SIGHUP: the edit applies, the bad file does not.
	if err := os.WriteFile(filepath.Join(dirs["ia"], "ifcfg-ib0"), []byte("DEVICE=ib0\nIPADDR=10.97.0.11\nPREFIX=24\nMTU=1500\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dirs["ia"], "ifcfg-ib0.8005"), []byte("TYPE=InfiniBand\nPKEY=yes\nPKEY_ID=zz\nPHYSDEV=ib0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := a.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the edit applied", func() bool {
		out := ipOut(t, nsA, "addr", "show", "dev", "ib0")
		return strings.Contains(out, "mtu 1500") && strings.Contains(out, "10.97.0.11/24") && !strings.Contains(out, "10.97.0.1/24")
	})
	waitUntil(t, "the bad file in the log", func() bool {
		return strings.Contains(a.log.String(), `ifcfg-ib0.8005:3: PKEY_ID: \"zz\" is not a P_Key; the file is not applied`)
	})
	if _, err := run(t, 5*time.Second, "ip", "-n", nsA, "link", "show", "ib0.8005"); err == nil {
		t.Error("the bad file made ib0.8005")
	}
	mustRun(t, "ip", "netns", "exec", nsB, "ping", "-c", "2", "-i", "0.2", "-W", "2", "10.97.0.11")
}

// The installer-style file: IPADDR_ib0=10.4.'*'.'*' takes its last two octets from the
// namespace's eth0.
func TestIfcfgInstallerFile(t *testing.T) {
	requireE2E(t)
	ns := netns(t, "ii")
	mustRun(t, "ip", "netns", "add", ns)
	mustRun(t, "ip", "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0p")
	mustRun(t, "ip", "-n", ns, "addr", "add", "192.168.3.7/24", "dev", "eth0")
	file := filepath.Join(t.TempDir(), "openib.conf")
	if err := os.WriteFile(file, []byte("IPADDR_ib0=10.4.'*'.'*'\nNETMASK_ib0=255.255.0.0\nONBOOT_ib0=1\nLAN_INTERFACE_ib0=\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	startDaemon(t, "ii", "-netns", ns, "-config", file)
	waitLink(t, ns, "ib0")
	waitUntil(t, "10.4.3.7/16 on ib0", func() bool {
		return strings.Contains(ipOut(t, ns, "addr", "show", "dev", "ib0"), "inet 10.4.3.7/16")
	})
}
