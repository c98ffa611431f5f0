package soft

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"ipoibfs/verbs"
	"ipoibfs/verbs/mad"
	"ipoibfs/verbs/sa"
	"ipoibfs/verbs/wire"
)

var (
	testKey  = bytes.Repeat([]byte("k3y!"), 8)
	otherKey = bytes.Repeat([]byte("n0pe"), 8)
)

func anyDest(verbs.GUID) bool { return true }

// Every way a message can be wrong is refused with its reason; a good one is accepted
// once.
func TestFabricAuthSealOpen(t *testing.T) {
	sender := newFabricAuth(testKey, 0xa, nil)
	recv := newFabricAuth(testKey, 0xb, nil)
	mad := bytes.Repeat([]byte{0x42}, 256)
	msg := sender.seal(mad, 1, 0xb)
	if len(msg) != len(mad)+authTrailerLen {
		t.Fatalf("sealed length %d", len(msg))
	}
	forB := func(g verbs.GUID) bool { return g == 0xb }
	// Everything before acceptance, so the replay window is still empty for them.
	altered := func(k int) []byte { b := bytes.Clone(msg); b[k] ^= 1; return b }
	for _, c := range []struct {
		what string
		b    []byte
		qp   uint8
		want error
	}{
		{"a MAD byte altered", altered(10), 1, errAuthMAC},
		{"the sender GUID altered", altered(len(mad)), 1, errAuthMAC},
		{"the sequence altered", altered(len(mad) + 20), 1, errAuthMAC},
		{"the MAC altered", altered(len(msg) - 1), 1, errAuthMAC},
		{"truncated by one byte", msg[:len(msg)-1], 1, errAuthMAC},
		{"stripped (a bare 256-byte MAD)", mad, 1, errAuthMAC},
		{"shorter than a trailer", msg[:authTrailerLen-1], 1, errAuthShort},
		{"sent on QP1, replayed on QP0", msg, 0, errAuthMAC},
	} {
		if _, _, err := recv.open(c.b, c.qp, forB, nil); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.what, err, c.want)
		}
	}
	if _, _, err := newFabricAuth(otherKey, 0xb, nil).open(msg, 1, forB, nil); !errors.Is(err, errAuthMAC) {
		t.Errorf("other key: %v", err)
	}
	if _, _, err := recv.open(msg, 1, func(g verbs.GUID) bool { return g == 0xc }, nil); !errors.Is(err, errAuthDest) {
		t.Errorf("addressed to another port: %v", err)
	}
	// Signed as a port the sender is not: refused before its window moves.
	if _, _, err := recv.open(msg, 1, forB, func(g verbs.GUID, _ []byte) bool { return g == 0xe }); !errors.Is(err, errAuthSigner) {
		t.Errorf("signed as another port than the sender's: %v, want %v", err, errAuthSigner)
	}
	got, signer, err := recv.open(msg, 1, forB, func(g verbs.GUID, _ []byte) bool { return g == 0xa })
	if err != nil || !bytes.Equal(got, mad) || signer != 0xa {
		t.Fatalf("good message: %v, signed by %#x", err, uint64(signer))
	}
	if _, _, err := recv.open(msg, 1, forB, nil); !errors.Is(err, errAuthReplay) {
		t.Errorf("replay: %v, want %v", err, errAuthReplay)
	}
}

// stepClock is a clock that moves on by step at each reading.
func stepClock(t0 time.Time, step time.Duration) func() time.Time {
	var mu sync.Mutex
	now := t0
	return func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		now = now.Add(step)
		return now
	}
}

// The replay window accepts each message once, in any order within a second of the
// sender's time and the last 64 accepted, and nothing older.
func TestFabricAuthReplayWindow(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	sender := newFabricAuth(testKey, 0xa, stepClock(t0, time.Millisecond)) // a message a millisecond
	recv := newFabricAuth(testKey, 0xb, func() time.Time { return t0 })
	var msgs [][]byte
	for k := range 2000 {
		msgs = append(msgs, sender.seal([]byte{byte(k)}, 0, 0xb))
	}
	open := func(k int) error { _, _, err := recv.open(msgs[k], 0, anyDest, nil); return err }
	if err := open(80); err != nil {
		t.Fatal(err)
	}
	for _, k := range []int{79, 50, 17, 16} { // older, out of order
		if err := open(k); err != nil {
			t.Errorf("message %d within the window: %v", k, err)
		}
		if err := open(k); !errors.Is(err, errAuthReplay) {
			t.Errorf("message %d again: %v", k, err)
		}
	}
	if err := open(1100); err != nil {
		t.Errorf("newest message: %v", err)
	}
	if err := open(99); !errors.Is(err, errAuthReplay) { // 1001 ms before the top
		t.Errorf("message 99, sealed more than a second before the newest: %v", err)
	}
	if err := open(101); err != nil { // 999 ms before: inside, never seen
		t.Errorf("message 101, inside the moved window: %v", err)
	}
	// 64 remembered: with 64 newer ones accepted (every other one), an older one never
	// seen is refused, and the window stays as it was.
	last := 0
	for k := 1102; k < 1102+2*authWindow; k += 2 {
		if err := open(k); err != nil {
			t.Fatalf("message %d: %v", k, err)
		}
		last = k
	}
	w := recv.peers[0xa]
	oldest := last - 2*(authWindow-1)
	kept, floor := slices.Clone(w.recent), w.floor
	if err := open(oldest - 1); !errors.Is(err, errAuthReplay) {
		t.Errorf("message %d, older than the 64 remembered: %v", oldest-1, err)
	}
	if !slices.Equal(w.recent, kept) || w.floor != floor {
		t.Errorf("a refused message changed the window: %d kept (was %d), floor %d (was %d)", len(w.recent), len(kept), w.floor, floor)
	}
	if err := open(oldest + 1); err != nil { // inside what it keeps, never seen
		t.Errorf("message %d: %v", oldest+1, err)
	}
	if err := open(last + 1); err != nil {
		t.Errorf("the next message: %v", err)
	}
	// A message signed ahead of the receiver's clock by more than the skew is refused,
	// and does not hold the window above the sender's real messages.
	ahead := newFabricAuth(testKey, 0xa, func() time.Time { return t0.Add(time.Hour) })
	if _, _, err := recv.open(ahead.seal([]byte("x"), 0, 0xb), 0, anyDest, nil); !errors.Is(err, errAuthStale) {
		t.Errorf("a message signed an hour ahead: %v, want %v", err, errAuthStale)
	}
	if err := open(last + 2); err != nil {
		t.Errorf("the next message after one signed ahead: %v", err)
	}
}

// A sender a receiver has no state for is believed only within the clock window and
// for what it sealed after the receiver started: a sender up for an hour is believed by
// a receiver that starts now (it was refused for good), an old captured message
// replayed to a restarted receiver is not, nor what a forgotten sender sent before.
func TestFabricAuthFirstContactFreshness(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	clock := func() time.Time { return now }
	booted := time.Now() // the sender's boot, an hour before now on its clock
	up := newFabricAuth(testKey, 0xa, func() time.Time { return now.Add(-time.Hour).Add(time.Since(booted)) })
	captured := up.seal([]byte("x"), 0, 0xb) // sealed an hour ago
	booted = booted.Add(-time.Hour)          // its clock now reads now
	recv := newFabricAuth(testKey, 0xb, clock)
	if _, _, err := recv.open(captured, 0, anyDest, nil); !errors.Is(err, errAuthStale) {
		t.Errorf("an hour-old first message: %v, want %v", err, errAuthStale)
	}
	if _, _, err := recv.open(up.seal([]byte("x"), 0, 0xb), 0, anyDest, nil); err != nil {
		t.Errorf("a message sealed now by a sender up for an hour: %v", err)
	}
	for _, c := range []struct {
		ago  time.Duration
		want error
	}{{3 * time.Second, errAuthStale}, {time.Second, nil}} {
		s := newFabricAuth(testKey, 0xc, func() time.Time { return now.Add(-c.ago) })
		r := newFabricAuth(testKey, 0xb, clock)
		if _, _, err := r.open(s.seal([]byte("x"), 0, 0xb), 0, anyDest, nil); !errors.Is(err, c.want) {
			t.Errorf("a first message sealed %v before the receiver started: %v, want %v", c.ago, err, c.want)
		}
	}
	// A forgotten sender's messages are not believed again as a first message.
	r := newFabricAuth(testKey, 0xb, clock)
	msg := newFabricAuth(testKey, 0x10, clock).seal([]byte("x"), 0, 0xb)
	if _, _, err := r.open(msg, 0, anyDest, nil); err != nil {
		t.Fatal(err)
	}
	top := r.peers[0x10].top
	for g := verbs.GUID(0x1000); len(r.peers) < authMaxPeers; g++ {
		r.peers[g] = &replayWindow{top: top} // whichever goes, the floor is the same
	}
	later := newFabricAuth(testKey, 0x20, func() time.Time { return now.Add(time.Millisecond) })
	if _, _, err := r.open(later.seal([]byte("x"), 0, 0xb), 0, anyDest, nil); err != nil || len(r.peers) != authMaxPeers {
		t.Fatalf("a new sender with the table full: %v, %d senders kept", err, len(r.peers))
	}
	// A new sender's first message at or below the top of the one forgotten for it is
	// refused, not taken with a window that refuses its next.
	for _, w := range r.peers { // whichever goes, its top is above the new one's
		w.top = top + uint64(time.Second)
	}
	early := newFabricAuth(testKey, 0x30, func() time.Time { return now.Add(time.Millisecond) })
	if _, _, err := r.open(early.seal([]byte("x"), 0, 0xb), 0, anyDest, nil); !errors.Is(err, errAuthStale) {
		t.Errorf("a first message below the forgotten sender's top: %v, want %v", err, errAuthStale)
	}
	delete(r.peers, 0x10) // as if it was the one forgotten
	if _, _, err := r.open(msg, 0, anyDest, nil); !errors.Is(err, errAuthStale) {
		t.Errorf("a forgotten sender's message replayed: %v, want %v", err, errAuthStale)
	}
}

func FuzzFabricAuthOpen(f *testing.F) {
	s := newFabricAuth(testKey, 0xa, nil)
	f.Add(s.seal([]byte("seed"), 1, 0xb))
	f.Add([]byte{})
	f.Add(bytes.Repeat([]byte{0}, authTrailerLen))
	f.Fuzz(func(t *testing.T, b []byte) {
		r := newFabricAuth(testKey, 0xb, nil)
		mad, signer, err := r.open(b, 1, anyDest, nil)
		if err == nil && (len(mad) != len(b)-authTrailerLen || !bytes.Equal(mad, b[:len(mad)]) ||
			signer != verbs.GUID(binary.BigEndian.Uint64(b[len(mad):]))) {
			t.Fatalf("accepted %x as %x", b, mad)
		}
	})
}

// keyedFabric starts an SM and nodes sharing key; extra nodes join with their own keys.
func keyedFabric(t *testing.T, key []byte, names []string, strangers map[string][]byte) (*HCA, []*HCA, []*HCA) {
	t.Helper()
	n := NewMemNetwork()
	smh, err := New(Config{Name: "sm", Network: n, HostSM: true, Heartbeat: testHB, FabricKey: key})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { smh.Close() })
	start := func(name string, k []byte) *HCA {
		h, err := New(Config{Name: name, Network: n, SM: smh.Endpoint(1), Heartbeat: testHB, FabricKey: k})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close() })
		return h
	}
	var nodes, others []*HCA
	for _, name := range names {
		nodes = append(nodes, start(name, key))
	}
	for name, k := range strangers {
		others = append(others, start(name, k))
	}
	for _, h := range append([]*HCA{smh}, nodes...) {
		waitFor(t, h.Name()+" ACTIVE", func() bool { return h.SoftPort(1).Attr().State == verbs.PortActive })
	}
	return smh, nodes, others
}

// Two nodes with the fabric's key come up and exchange datagrams and SA queries; a node
// with another key, and one with none, never become ACTIVE, and the subnet manager
// counts what it dropped from them.
func TestFabricKeyAdmitsOnlyKeyHolders(t *testing.T) {
	smh, nodes, strangers := keyedFabric(t, testKey, []string{"a", "b"}, map[string][]byte{"wrongkey": otherKey, "nokey": nil})
	a, b := newUD(t, nodes[0], 0, 0x0b1b), newUD(t, nodes[1], 0, 0x0b1b)
	a.send(t, b.lid(), b.qp.Num(), 0x0b1b, []byte("hello"))
	if _, ok := b.recv(t, 2*time.Second); !ok {
		t.Fatal("no datagram between key holders")
	}
	pa := nodes[0].SoftPort(1)
	ga, _ := pa.GID(0)
	gb, _ := nodes[1].SoftPort(1).GID(0)
	if _, err := (&sa.Client{Port: pa}).PathRecord(context.Background(), ga, gb, 0xffff, 0); err != nil {
		t.Fatalf("SA path query between key holders: %v", err)
	}
	waitFor(t, "the SM to count rejected hellos", func() bool { return smh.SM().AuthFailures() >= 6 })
	for _, h := range strangers {
		if s := h.SoftPort(1).Attr().State; s == verbs.PortActive {
			t.Errorf("%s became ACTIVE without the fabric's key", h.Name())
		}
	}
	if c := pa.Counters(); c.AuthFailures != 0 {
		t.Errorf("a key holder rejected %d messages", c.AuthFailures)
	}
}

// Forged management messages that claim a member's address (as a spoofed UDP source
// would) are dropped and counted, and change nothing: an SA delete of a's broadcast
// membership, and a control message reconfiguring b.
func TestFabricKeyForgedMessagesChangeNothing(t *testing.T) {
	smh, nodes, _ := keyedFabric(t, testKey, []string{"a", "b"}, nil)
	ctx := context.Background()
	bcast := mustGID(t, "ff12:401b:ffff::ffff:ffff")
	pa, pb := nodes[0].SoftPort(1), nodes[1].SoftPort(1)
	ga, _ := pa.GID(0)
	if _, err := (&sa.Client{Port: pa}).Join(ctx, mad.MCMemberRecord{MGID: bcast, PortGID: ga, PKey: 0xffff, JoinState: mad.JoinFull}, mad.IPoIBBroadcastJoinMask); err != nil {
		t.Fatal(err)
	}
	members := func() int {
		for _, g := range smh.SM().DB().Groups() {
			if g.MGID == bcast {
				return len(g.Members)
			}
		}
		return 0
	}
	if members() != 1 {
		t.Fatalf("broadcast group members %d after a's join", members())
	}
	smPort := smh.SoftPort(1)
	smGID, _ := smPort.GID(0)
	leave := mad.NewSARequest(mad.MethodDelete, mad.AttrMCMemberRecord, 77, mad.LeaveMask)
	rec := mad.MCMemberRecord{MGID: bcast, PortGID: ga, JoinState: mad.JoinFull}
	rec.Marshal(leave.Data[:])
	bare := leave.Bytes()
	forger := newFabricAuth(otherKey, pa.guid, nil)
	// b holds the key, but signs as itself: it does not act as a.
	holder := newFabricAuth(testKey, pb.guid, nil)
	smBefore := smh.SM().AuthFailures()
	for _, payload := range [][]byte{bare, forger.seal(bare, 1, smPort.guid), holder.seal(bare, 1, smPort.guid)} {
		pkt := wire.Packet{BTH: wire.BTH{Opcode: wire.OpUDSendOnly, PKey: 0xffff, DestQP: uint32(verbs.GSIQPN)},
			DETH: wire.DETH{QKey: verbs.GSIQKey, SrcQP: uint32(verbs.GSIQPN)}, Payload: payload}
		smPort.receive([]Datagram{{Addr: pa.ep.Addr(), Data: pkt.AppendTo(nil, ga, smGID)}}, true)
	}
	// A forged configuration for b: down, LID 0x99.
	cfg := ctlConfig{LID: 0x99, SMLID: 0x99, State: verbs.PortDown, ActiveMTU: verbs.MTU256, PKeys: []verbs.PKey{0x8123}}
	body := cfg.append(putCtlHeader(nil, ctlAttrConfig, 0))
	bBefore := pb.AuthFailures()
	lid := pb.Attr().LID
	for _, payload := range [][]byte{body, forger.seal(body, 0, pb.guid)} {
		pkt := wire.Packet{BTH: wire.BTH{Opcode: wire.OpUDSendOnly, PKey: uint16(verbs.DefaultPKey)}, Payload: payload}
		pb.receive([]Datagram{{Addr: smh.Endpoint(1), Data: pkt.AppendTo(nil, verbs.GID{}, verbs.GID{})}}, true)
	}
	// And a hello b signs claiming a's port GUID.
	hello := ctlHello{NodeGUID: pa.guid, PortGUID: pa.guid, PortNum: 1, NumPorts: 1, MaxMTU: verbs.MTU4096, Width: 4, LaneMbps: 10000}
	hb := holder.seal(hello.append(putCtlHeader(nil, ctlAttrHello, 0)), 0, 0)
	hpkt := wire.Packet{BTH: wire.BTH{Opcode: wire.OpUDSendOnly, PKey: uint16(verbs.DefaultPKey)}, Payload: hb}
	smPort.receive([]Datagram{{Addr: pb.ep.Addr(), Data: hpkt.AppendTo(nil, verbs.GID{}, verbs.GID{})}}, true)
	if got := smh.SM().AuthFailures() - smBefore; got != 4 {
		t.Errorf("SM counted %d forged SA deletes and hellos, want 4", got)
	}
	if got := pb.AuthFailures() - bBefore; got != 2 {
		t.Errorf("b counted %d forged control messages, want 2", got)
	}
	if members() != 1 {
		t.Errorf("a's membership was deleted by a forged leave")
	}
	if a := pb.Attr(); a.State != verbs.PortActive || a.LID != lid {
		t.Errorf("b reconfigured by a forged message: %+v", a)
	}
	if c := pb.Counters(); c.AuthFailures != pb.AuthFailures() {
		t.Errorf("port counters %d, AuthFailures %d", c.AuthFailures, pb.AuthFailures())
	}
}

// A key shorter than MinFabricKeyLen is refused.
func TestFabricKeyTooShort(t *testing.T) {
	_, err := New(Config{Name: "x", Network: NewMemNetwork(), HostSM: true, FabricKey: []byte("short")})
	if err == nil {
		t.Fatal("a 5-byte key was accepted")
	}
}

// A key holder signing control messages as another port cannot move that port's
// replay window: a Config signed as the subnet manager from another address, and a
// hello signed as one port registering another, are refused before their sequences
// are recorded. Recorded, their sequences (minutes ahead) would have had the real
// port's and the subnet manager's messages refused as replays until the clock caught
// up.
func TestFabricKeyControlWindowsStayTheSigners(t *testing.T) {
	smh, nodes, _ := keyedFabric(t, testKey, []string{"a", "b"}, nil)
	pa, pb, smPort := nodes[0].SoftPort(1), nodes[1].SoftPort(1), smh.SoftPort(1)
	ahead := func() time.Time { return time.Now().Add(4 * time.Minute) }
	ctlPkt := func(payload []byte) []byte {
		pkt := wire.Packet{BTH: wire.BTH{Opcode: wire.OpUDSendOnly, PKey: uint16(verbs.DefaultPKey)}, Payload: payload}
		return pkt.AppendTo(nil, verbs.GID{}, verbs.GID{})
	}
	// As the subnet manager, to b, from a's address.
	cfg := ctlConfig{LID: 0x99, SMLID: 0x99, State: verbs.PortDown, ActiveMTU: verbs.MTU256, PKeys: []verbs.PKey{0x8123}}
	asSM := newFabricAuth(testKey, smPort.guid, ahead)
	bBefore := pb.AuthFailures()
	pb.receive([]Datagram{{Addr: pa.ep.Addr(), Data: ctlPkt(asSM.seal(cfg.append(putCtlHeader(nil, ctlAttrConfig, 0)), 0, pb.guid))}}, true)
	if got := pb.AuthFailures() - bBefore; got != 1 {
		t.Errorf("b counted %d control messages signed as the SM from elsewhere, want 1", got)
	}
	// As a, registering b, at the subnet manager.
	hello := ctlHello{NodeGUID: pb.guid, PortGUID: pb.guid, PortNum: 1, NumPorts: 1, MaxMTU: verbs.MTU4096, Width: 4, LaneMbps: 10000}
	asA := newFabricAuth(testKey, pa.guid, ahead)
	smPort.receive([]Datagram{{Addr: pb.ep.Addr(), Data: ctlPkt(asA.seal(hello.append(putCtlHeader(nil, ctlAttrHello, 0)), 0, 0))}}, true)

	// Messages the real signers make now are still taken.
	body := cfg.append(putCtlHeader(nil, ctlAttrConfig, 0))
	if _, _, err := pb.auth.open(newFabricAuth(testKey, smPort.guid, nil).seal(body, 0, pb.guid), 0, pb.ctlForUs, pb.ctlSigner(smh.Endpoint(1))); err != nil {
		t.Errorf("a control message the SM signs now, at b: %v", err)
	}
	ownHello := ctlHello{NodeGUID: pa.guid, PortGUID: pa.guid, PortNum: 1, NumPorts: 1, MaxMTU: verbs.MTU4096, Width: 4, LaneMbps: 10000}
	hb := newFabricAuth(testKey, pa.guid, nil).seal(ownHello.append(putCtlHeader(nil, ctlAttrHello, 0)), 0, 0)
	if _, _, err := smPort.auth.open(hb, 0, smPort.ctlForUs, smPort.ctlSigner(pa.ep.Addr())); err != nil {
		t.Errorf("a hello a signs now, at the SM: %v", err)
	}
	if a := pb.Attr(); a.State != verbs.PortActive {
		t.Errorf("b reconfigured: %+v", a)
	}
}
