package wire

import (
	"bytes"
	"context"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"ipoibfs/internal/testenv"
	"ipoibfs/verbs"
)

// inetChecksum is the RFC 1071 checksum, written independently of pcap.go.
func inetChecksum(parts ...[]byte) uint16 {
	var all []byte
	for _, p := range parts {
		all = append(all, p...)
	}
	if len(all)%2 == 1 {
		all = append(all, 0)
	}
	var sum uint64
	for i := 0; i < len(all); i += 2 {
		sum += uint64(binary.BigEndian.Uint16(all[i:]))
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

// icmpEcho returns an IPoIB-encapsulated IPv4 ICMP echo request 10.0.0.1 -> 10.0.0.2.
func icmpEcho() []byte {
	data := []byte("ipoibfs-ping-123") // 16 bytes
	icmp := append([]byte{8, 0, 0, 0, 0x12, 0x34, 0x00, 0x01}, data...)
	binary.BigEndian.PutUint16(icmp[2:], inetChecksum(icmp))
	ip := []byte{0x45, 0, 0, 0, 0xbe, 0xef, 0x40, 0, 64, 1, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2}
	binary.BigEndian.PutUint16(ip[2:], uint16(len(ip)+len(icmp)))
	binary.BigEndian.PutUint16(ip[10:], inetChecksum(ip))
	return append(append([]byte{0x08, 0x00, 0x00, 0x00}, ip...), icmp...)
}

// ipoibARP returns an IPoIB ARP request from 10.0.0.1 (QPN 0x49, GID sgid) for 10.0.0.2.
func ipoibARP(sgid verbs.GID) []byte {
	b := []byte{0x08, 0x06, 0x00, 0x00, // IPoIB header
		0x00, 0x20, 0x08, 0x00, 20, 4, 0x00, 0x01} // htype 32, ptype IPv4, hlen 20, plen 4, request
	b = append(b, 0x00, 0x00, 0x00, 0x49) // sender hw: flags + QPN
	b = append(b, sgid[:]...)
	b = append(b, 10, 0, 0, 1)
	b = append(b, make([]byte, 20)...) // target hw unknown
	b = append(b, 10, 0, 0, 2)
	return b
}

type frame struct {
	sec, usec, incl, orig uint32
	data                  []byte
}

func readPcap(t *testing.T, b []byte) []frame {
	t.Helper()
	if len(b) < 24 {
		t.Fatalf("pcap too short: %d", len(b))
	}
	le := binary.LittleEndian
	hdr := []uint32{le.Uint32(b[0:]), uint32(le.Uint16(b[4:])), uint32(le.Uint16(b[6:])),
		le.Uint32(b[8:]), le.Uint32(b[12:]), le.Uint32(b[16:]), le.Uint32(b[20:])}
	if d := cmp.Diff([]uint32{0xa1b2c3d4, 2, 4, 0, 0, 262144, 1}, hdr); d != "" {
		t.Fatalf("global header (-want +got):\n%s", d)
	}
	var out []frame
	for b = b[24:]; len(b) > 0; {
		if len(b) < 16 {
			t.Fatalf("truncated record header")
		}
		f := frame{le.Uint32(b[0:]), le.Uint32(b[4:]), le.Uint32(b[8:]), le.Uint32(b[12:]), nil}
		if int(f.incl) > len(b)-16 || f.incl != f.orig {
			t.Fatalf("bad record lengths %d/%d", f.incl, f.orig)
		}
		f.data = b[16 : 16+f.incl]
		out = append(out, f)
		b = b[16+f.incl:]
	}
	return out
}

func TestPcapFraming(t *testing.T) {
	var buf bytes.Buffer
	w, err := NewPcapWriter(&buf)
	if err != nil {
		t.Fatal(err)
	}
	ts := time.Date(2026, 11, 22, 10, 0, 0, 123456789, time.UTC)
	odd := (&Packet{BTH: BTH{Opcode: OpRCSendOnly}, Payload: []byte{1, 2, 3}}).AppendTo(nil, gidA, gidB)
	ud := (&Packet{BTH: BTH{Opcode: OpUDSendOnly, PKey: 0xffff, DestQP: 0xffffff},
		DETH: DETH{QKey: 0xb1b, SrcQP: 0x49}, Payload: ipoibARP(gidA)}).AppendTo(nil, gidA, gidMC)
	if err := w.WritePacket(ts, gidA, gidB, odd); err != nil {
		t.Fatal(err)
	}
	if err := w.WritePacket(ts.Add(time.Second), gidA, gidMC, ud); err != nil {
		t.Fatal(err)
	}
	frames := readPcap(t, buf.Bytes())
	if len(frames) != 2 {
		t.Fatalf("%d frames", len(frames))
	}
	for i, c := range []struct {
		sgid, dgid verbs.GID
		ib         []byte
		dmac, smac string
		sec        uint32
	}{
		{gidA, gidB, odd, "020300000002", "020300000001", uint32(ts.Unix())},
		{gidA, gidMC, ud, "3333ffffffff", "020300000001", uint32(ts.Unix()) + 1},
	} {
		f := frames[i]
		if f.sec != c.sec || f.usec != 123456 {
			t.Errorf("frame %d: timestamp %d.%06d", i, f.sec, f.usec)
		}
		d := f.data
		if len(d) != 14+40+8+len(c.ib) {
			t.Fatalf("frame %d: %d bytes", i, len(d))
		}
		want := unhex(t, c.dmac+c.smac+"86dd")
		want = append(want, 0x60, 0, 0, 0)
		want = binary.BigEndian.AppendUint16(want, uint16(8+len(c.ib)))
		want = append(want, 17, 64)
		want = append(want, c.sgid[:]...)
		want = append(want, c.dgid[:]...)
		want = append(want, 0xc0, 0x00, 0x12, 0xb7)
		want = binary.BigEndian.AppendUint16(want, uint16(8+len(c.ib)))
		if !bytes.Equal(d[:60], want) {
			t.Fatalf("frame %d headers\n% x\nwant\n% x", i, d[:60], want)
		}
		if !bytes.Equal(d[62:], c.ib) {
			t.Fatalf("frame %d: IB packet differs", i)
		}
		// Verify the UDP checksum: the sum over pseudo header + datagram is 0.
		pseudo := append(append([]byte(nil), d[22:54]...), 0, 0, byte(len(d[54:])>>8), byte(len(d[54:])), 0, 0, 0, 17)
		if c := inetChecksum(pseudo, d[54:]); c != 0 {
			t.Fatalf("frame %d: UDP checksum does not verify (residual %#04x)", i, c)
		}
		if binary.BigEndian.Uint16(d[60:]) == 0 {
			t.Fatalf("frame %d: UDP checksum 0", i)
		}
	}
}

func TestGIDMAC(t *testing.T) {
	cases := []struct {
		gid  string
		want [6]byte
	}{
		{"fe80::2:c903:0:1", [6]byte{0x02, 0x03, 0, 0, 0, 0x01}},
		{"fe80::0011:2233:4455:6677", [6]byte{0x02, 0x33, 0x44, 0x55, 0x66, 0x77}},
		{"ff12:401b:ffff::ffff:ffff", [6]byte{0x33, 0x33, 0xff, 0xff, 0xff, 0xff}},
		{"ff12:601b:ffff::1:ff00:1", [6]byte{0x33, 0x33, 0xff, 0x00, 0x00, 0x01}},
	}
	for _, c := range cases {
		if got := GIDMAC(mustGID(t, c.gid)); got != c.want {
			t.Errorf("GIDMAC(%s) = % x, want % x", c.gid, got, c.want)
		}
	}
}

type errWriter struct{ n int }

func (e *errWriter) Write(p []byte) (int, error) {
	if e.n == 0 {
		return 0, os.ErrClosed
	}
	e.n--
	return len(p), nil
}

func TestPcapErrors(t *testing.T) {
	if _, err := NewPcapWriter(&errWriter{}); err == nil {
		t.Fatal("NewPcapWriter ignores the write error")
	}
	w, err := NewPcapWriter(&errWriter{n: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.WritePacket(time.Now(), gidA, gidB, make([]byte, 16)); err == nil {
		t.Fatal("WritePacket ignores the write error")
	}
	w, _ = NewPcapWriter(&bytes.Buffer{})
	if err := w.WritePacket(time.Now(), gidA, gidB, make([]byte, 65528)); err == nil {
		t.Fatal("WritePacket accepts an oversized packet")
	}
	if err := w.WritePacket(time.Now(), gidA, gidB, make([]byte, 65527)); err != nil {
		t.Fatalf("largest UDP payload: %v", err)
	}
}

// TestPcapConcurrent writes from several goroutines; every record must come out whole.
func TestPcapConcurrent(t *testing.T) {
	var buf bytes.Buffer
	w, err := NewPcapWriter(&buf)
	if err != nil {
		t.Fatal(err)
	}
	const writers, per = 4, 50
	var wg sync.WaitGroup
	for g := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				p := Packet{BTH: BTH{Opcode: OpUDSendOnly, DestQP: uint32(g), PSN: uint32(i)},
					Payload: bytes.Repeat([]byte{byte(g)}, 4*(i%30))}
				if err := w.WritePacket(time.Now(), gidA, gidB, p.AppendTo(nil, gidA, gidB)); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	frames := readPcap(t, buf.Bytes())
	if len(frames) != writers*per {
		t.Fatalf("%d frames, want %d", len(frames), writers*per)
	}
	for _, f := range frames {
		var p Packet
		if err := Parse(f.data[62:], &p); err != nil || !CheckICRC(f.data[62:], gidA, gidB) {
			t.Fatalf("interleaved record: %v", err)
		}
		for _, v := range p.Payload {
			if v != byte(p.BTH.DestQP) {
				t.Fatal("payload mixed between writers")
			}
		}
	}
}

func TestTshark(t *testing.T) {
	tshark := testenv.Tool(t, "tshark")
	sgid := mustGID(t, "fe80::2:c903:0:1")
	dgid := mustGID(t, "fe80::2:c903:0:2")
	mgid := mustGID(t, "ff12:401b:ffff::ffff:ffff")

	path := filepath.Join(t.TempDir(), "fabric.pcap")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w, err := NewPcapWriter(f)
	if err != nil {
		t.Fatal(err)
	}
	ts := time.Unix(1_800_000_000, 0)
	pkts := []struct {
		sgid, dgid verbs.GID
		p          Packet
	}{
		{sgid, dgid, Packet{BTH: BTH{Opcode: OpUDSendOnly, PKey: 0xffff, DestQP: 0x000048, PSN: 1},
			DETH: DETH{QKey: 0x00000b1b, SrcQP: 0x000049}, Payload: icmpEcho()}},
		{sgid, mgid, Packet{BTH: BTH{Opcode: OpUDSendOnly, PKey: 0xffff, DestQP: 0xffffff, PSN: 2},
			DETH: DETH{QKey: 0x00000b1b, SrcQP: 0x000049}, Payload: ipoibARP(sgid)}},
	}
	var icrcs []uint32
	for i, x := range pkts {
		ib := x.p.AppendTo(nil, x.sgid, x.dgid)
		icrcs = append(icrcs, binary.BigEndian.Uint32(ib[len(ib)-4:]))
		if err := w.WritePacket(ts.Add(time.Duration(i)*time.Millisecond), x.sgid, x.dgid, ib); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}

	fields := []string{
		"infiniband.bth.opcode", "infiniband.bth.destqp", "infiniband.bth.p_key",
		"infiniband.deth.q_key", "infiniband.deth.srcqp", "ipv6.src", "ipv6.dst", "udp.dstport",
		"udp.checksum.status", "ip.src", "ip.dst", "ip.checksum.status", "icmp.type",
		"icmp.checksum.status", "arp.hw.type", "arp.hw.size", "arp.opcode", "arp.src.proto_ipv4",
		"arp.dst.proto_ipv4", "infiniband.invariant.crc", "_ws.col.Protocol",
	}
	args := []string{"-n", "-r", path, "-o", "udp.check_checksum:TRUE", "-o", "ip.check_checksum:TRUE",
		"-T", "fields", "-E", "separator=/t", "-E", "occurrence=f"}
	for _, fl := range fields {
		args = append(args, "-e", fl)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, tshark, args...)
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir()) // no user preferences
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("tshark: %v\n%s", err, stderr.String())
	}
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("tshark printed %d lines:\n%s\nstderr: %s", len(lines), out, stderr.String())
	}
	got := make([]map[string]string, len(lines))
	for i, l := range lines {
		vals := strings.Split(l, "\t")
		if len(vals) != len(fields) {
			t.Fatalf("line %d has %d fields, want %d: %q", i, len(vals), len(fields), l)
		}
		got[i] = map[string]string{}
		for j, fl := range fields {
			got[i][fl] = vals[j]
		}
	}
	crcHex := func(v uint32) string { return "0x" + hex8(v) } // tshark reads the ICRC big-endian
	want := []map[string]string{
		{
			"infiniband.bth.opcode": "100", "infiniband.bth.destqp": "0x000048",
			"infiniband.bth.p_key": "65535", "infiniband.deth.q_key": "0x0000000000000b1b",
			"infiniband.deth.srcqp": "0x00000049", "ipv6.src": "fe80::2:c903:0:1",
			"ipv6.dst": "fe80::2:c903:0:2", "udp.dstport": "4791", "udp.checksum.status": "1",
			"ip.src": "10.0.0.1", "ip.dst": "10.0.0.2", "ip.checksum.status": "1", "icmp.type": "8",
			"icmp.checksum.status": "1", "arp.hw.type": "", "arp.hw.size": "", "arp.opcode": "",
			"arp.src.proto_ipv4": "", "arp.dst.proto_ipv4": "",
			"infiniband.invariant.crc": crcHex(icrcs[0]), "_ws.col.Protocol": "ICMP",
		},
		{
			"infiniband.bth.opcode": "100", "infiniband.bth.destqp": "0xffffff",
			"infiniband.bth.p_key": "65535", "infiniband.deth.q_key": "0x0000000000000b1b",
			"infiniband.deth.srcqp": "0x00000049", "ipv6.src": "fe80::2:c903:0:1",
			"ipv6.dst": "ff12:401b:ffff::ffff:ffff", "udp.dstport": "4791", "udp.checksum.status": "1",
			"ip.src": "", "ip.dst": "", "ip.checksum.status": "", "icmp.type": "",
			"icmp.checksum.status": "", "arp.hw.type": "32", "arp.hw.size": "20", "arp.opcode": "1",
			"arp.src.proto_ipv4": "10.0.0.1", "arp.dst.proto_ipv4": "10.0.0.2",
			"infiniband.invariant.crc": crcHex(icrcs[1]), "_ws.col.Protocol": "ARP",
		},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("tshark fields (-want +got):\n%s\nraw output:\n%s", d, out)
	}
}

func hex8(v uint32) string {
	const digits = "0123456789abcdef"
	b := make([]byte, 8)
	for i := 7; i >= 0; i-- {
		b[i] = digits[v&0xf]
		v >>= 4
	}
	return string(b)
}
