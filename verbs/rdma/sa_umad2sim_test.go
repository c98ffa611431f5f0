//go:build rdma && linux

package rdma

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"ipoibfs/internal/ibsimsa"
	"ipoibfs/internal/testenv"
	"ipoibfs/verbs"
	"ipoibfs/verbs/mad"
	"ipoibfs/verbs/sa"
	"ipoibfs/verbs/soft/sadb"
)

// The SA client of package sa, on this package's MAD agent, against unmodified OpenSM
// on ibsim: the test starts the fabric (internal/ibsimsa) and runs this test binary
// again as a helper process on node Hca2 under LD_PRELOAD=libumad2sim.so, which
// redirects libibumad to the simulator (it emulates no ibverbs device, so the helper
// opens the umad port alone: OpenMADPort). The helper runs saOps and prints what it
// got as JSON; the same saOps then run in this process against the soft fabric's SA
// (verbs/soft/sadb) for the same partitions.conf, and the two must agree.

// childEnv makes the test binary the umad2sim helper (see TestMain).
const childEnv = "IPOIBFS_RDMA_UMAD2SIM_HELPER"

const resultMarker = "SARESULT "

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(umad2simHelper()) // exits through exitProcess unless it fails early
	}
	goleak.VerifyTestMain(m) // every test leaves no goroutine behind (agents, CQs closed)
}

// saPartitions is partitions.conf for both SAs: mtu=4 for the Default group, since
// ibsim's ports are capped at 2048 (a 4096 group would refuse their joins).
const saPartitions = `Default=0xffff, ipoib, mtu=4 : ALL=full;
P1=0x8001, ipoib : ALL=full;
`

// The ibsim fabric (net.1sw3hca) as OpenSM configures it for saPartitions.
var (
	simGID1 = mustGID("fe80::10:1")
	simGID2 = mustGID("fe80::10:3")
	simGID3 = mustGID("fe80::10:5")
	simSA   = []sadb.Port{
		{GUID: 0x100001, GID: simGID1, LID: 1, IsSM: true, MTU: verbs.MTU2048, Rate: 3, PKeys: []verbs.PKey{0xffff, 0x8001}},
		{GUID: 0x100003, GID: simGID2, LID: 3, MTU: verbs.MTU2048, Rate: 3, PKeys: []verbs.PKey{0xffff, 0x8001}},
		{GUID: 0x100005, GID: simGID3, LID: 4, MTU: verbs.MTU2048, Rate: 3, PKeys: []verbs.PKey{0xffff, 0x8001}},
	}
	simGroups = []sadb.GroupParams{
		{MGID: mustGID("ff12:401b:ffff::ffff:ffff"), PKey: 0xffff, QKey: verbs.IPoIBQKey, MTU: verbs.MTU2048, Rate: 3, Scope: 2, PacketLifeTime: 18},
		{MGID: mustGID("ff12:401b:8001::ffff:ffff"), PKey: 0x8001, QKey: verbs.IPoIBQKey, MTU: verbs.MTU2048, Rate: 3, Scope: 2, PacketLifeTime: 18},
	}
)

func mustGID(s string) verbs.GID {
	g, err := verbs.ParseGID(s)
	if err != nil {
		panic(err)
	}
	return g
}

// result is one operation's answer: the value, or the error as the client says it.
type result[T any] struct {
	Val T      `json:",omitempty"`
	Err string `json:",omitempty"`
}

func res[T any](v T, err error) result[T] {
	if err != nil {
		var zero T
		return result[T]{Val: zero, Err: err.Error()}
	}
	return result[T]{Val: v}
}

// portView is what the port tells of itself.
type portView struct {
	State verbs.PortState
	LID   verbs.LID
	SMLID verbs.LID
	GID   verbs.GID
	PKeys []verbs.PKey // without the empty entries
}

// saRun is everything saOps asks and gets.
type saRun struct {
	Port            portView
	ClassPortInfo   result[mad.ClassPortInfo]
	GroupsAtStart   result[[]mad.MCMemberRecord]
	JoinDefault     result[mad.MCMemberRecord]
	Join8001        result[mad.MCMemberRecord]
	JoinTooBig      result[mad.MCMemberRecord]
	Path            result[mad.PathRecord]
	Path8001        result[mad.PathRecord]
	PathUnknownDGID result[mad.PathRecord]
	Leave8001       result[bool]
	LeaveAgain      result[bool]
	LeaveDefault    result[bool]
}

// saOps runs the operations an IPoIB port makes of its SA, from Hca2.
func saOps(ctx context.Context, p verbs.Port) saRun {
	c := &sa.Client{Port: p, Timeout: 500 * time.Millisecond, Retries: 2}
	var r saRun
	a := p.Attr()
	g, _ := p.GID(0)
	r.Port = portView{State: a.State, LID: a.LID, SMLID: a.SMLID, GID: g}
	for _, k := range p.PKeyTable() {
		if k.Valid() {
			r.Port.PKeys = append(r.Port.PKeys, k)
		}
	}
	bcast := func(pk verbs.PKey) mad.MCMemberRecord {
		mgid := mustGID(fmt.Sprintf("ff12:401b:%04x::ffff:ffff", uint16(pk)))
		return mad.MCMemberRecord{MGID: mgid, PortGID: g, PKey: pk, JoinState: mad.JoinFull}
	}
	J := mad.IPoIBBroadcastJoinMask
	r.ClassPortInfo = res(c.ClassPortInfo(ctx))
	r.GroupsAtStart = res(c.Groups(ctx))
	r.JoinDefault = res(c.Join(ctx, bcast(0xffff), J))
	r.Join8001 = res(c.Join(ctx, bcast(0x8001), J))
	big := bcast(0xffff)
	big.MTUSelector, big.MTU = 2, verbs.MTU4096
	r.JoinTooBig = res(c.Join(ctx, big, J|mad.CompMCMTUSelector|mad.CompMCMTU))
	r.Path = res(c.PathRecord(ctx, g, simGID3, 0xffff, 0))
	r.Path8001 = res(c.PathRecord(ctx, g, simGID3, 0x8001, 0))
	r.PathUnknownDGID = res(c.PathRecord(ctx, g, mustGID("fe80::10:9"), 0xffff, 0))
	r.Leave8001 = res(true, c.Leave(ctx, bcast(0x8001), J))
	r.LeaveAgain = res(true, c.Leave(ctx, bcast(0x8001), J))
	r.LeaveDefault = res(true, c.Leave(ctx, bcast(0xffff), J))
	return r
}

// helperResult is what the helper prints.
type helperResult struct {
	SA saRun
	// A Call to a LID nobody has: 100 ms timeout, 2 retries.
	TimeoutErr    string
	TimeoutMillis int64
}

// umad2simHelper is the helper process: saOps over OpenMADPort, then a Call that
// must time out, the result as one JSON line on stdout.
func umad2simHelper() int {
	p, err := OpenMADPort("", 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, "open umad port:", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	r := helperResult{SA: saOps(ctx, p)}
	req := mad.NewSARequest(mad.MethodGet, mad.AttrClassPortInfo, 0, 0)
	start := time.Now()
	if _, err := p.MAD().Call(ctx, 0x99, req.Bytes(), 100*time.Millisecond, 2); err != nil {
		r.TimeoutErr = err.Error()
		if !errors.Is(err, verbs.ErrTimeout) {
			r.TimeoutErr = "not a timeout: " + r.TimeoutErr
		}
	}
	r.TimeoutMillis = time.Since(start).Milliseconds()
	b, err := json.Marshal(r)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("%s%s\n", resultMarker, b)
	p.Close()
	exitProcess(0)
	return 0
}

// runHelper runs the helper on node host of fab and returns its result line.
func runHelper(t *testing.T, fab *ibsimsa.Fabric, host string) []byte {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := fab.Command(host, exe, "-test.run=^$")
	cmd.Env = append(cmd.Env, childEnv+"=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Signal(syscall.SIGQUIT) // the Go runtime prints every goroutine
		select {
		case <-done:
		case <-time.After(2 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		err = errors.New("killed after 20 s")
	}
	if err != nil {
		t.Fatalf("helper on %s: %v\nstdout: %s\nstderr: %s", host, err, stdout.String(), stderr.String())
	}
	if stderr.Len() > 0 {
		t.Logf("helper on %s, stderr:\n%s", host, stderr.String())
	}
	for _, l := range strings.Split(stdout.String(), "\n") {
		if s, ok := strings.CutPrefix(l, resultMarker); ok {
			return []byte(s)
		}
	}
	t.Fatalf("helper on %s printed no result\nstdout: %s\nstderr: %s", host, stdout.String(), stderr.String())
	return nil
}

func TestSAClientAgainstOpenSM(t *testing.T) {
	testenv.Short(t, "starts ibsim and OpenSM")
	fab := ibsimsa.Start(t, saPartitions)
	var hr helperResult
	line := runHelper(t, fab, ibsimsa.HostHca2)
	if err := json.Unmarshal(line, &hr); err != nil {
		t.Fatalf("helper result %s: %v", line, err)
	}
	got := hr.SA
	// Three tries of 100 ms each (plus the grace for the MAD layer's own notice,
	// which umad2sim never sends), then verbs.ErrTimeout.
	if !strings.Contains(hr.TimeoutErr, verbs.ErrTimeout.Error()) || strings.HasPrefix(hr.TimeoutErr, "not") ||
		hr.TimeoutMillis < 300 || hr.TimeoutMillis > 3000 {
		t.Errorf("Call to LID 0x99: %q after %d ms, want a timeout after 3 tries of 100 ms", hr.TimeoutErr, hr.TimeoutMillis)
	}

	db := sadb.New(simFabric(simSA))
	db.SetConfiguredGroups(simGroups)
	want := saOps(context.Background(), &sadbPort{db: db, self: simSA[1], sm: simSA[0].LID})

	// What the helper must have got from OpenSM on its own terms, so a comparison of
	// two identical failures cannot pass.
	if got.Port.State != verbs.PortActive || got.Port.LID != 3 || got.Port.SMLID != 1 || got.Port.GID != simGID2 {
		t.Errorf("umad port of Hca2: %+v", got.Port)
	}
	for name, e := range map[string]string{"ClassPortInfo": got.ClassPortInfo.Err, "JoinDefault": got.JoinDefault.Err,
		"Join8001": got.Join8001.Err, "Path": got.Path.Err, "Path8001": got.Path8001.Err, "Leave8001": got.Leave8001.Err,
		"LeaveDefault": got.LeaveDefault.Err} {
		if e != "" {
			t.Errorf("%s from OpenSM: %s", name, e)
		}
	}
	if got.JoinDefault.Val.MLID != 0xc000 || got.Join8001.Val.MLID != 0xc001 || got.JoinDefault.Val.QKey != verbs.IPoIBQKey {
		t.Errorf("broadcast joins: %+v, %+v", got.JoinDefault.Val, got.Join8001.Val)
	}
	if got.Path.Val.DLID != 4 || got.Path.Val.SLID != 3 {
		t.Errorf("path Hca2 -> Hca3: %+v", got.Path.Val)
	}
	if !strings.Contains(got.LeaveAgain.Err, "status") || !strings.Contains(got.JoinTooBig.Err, "status") || !strings.Contains(got.PathUnknownDGID.Err, "status") {
		t.Errorf("failing requests: leave again %q, join above the port MTU %q, path to an unknown GID %q",
			got.LeaveAgain.Err, got.JoinTooBig.Err, got.PathUnknownDGID.Err)
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("OpenSM through verbs/rdma differs from the soft SA (-soft +OpenSM):\n%s", d)
	}
	t.Logf("OpenSM: %s", line)
}

// simFabric is the sadb view of the ibsim fabric.
type simFabric []sadb.Port

func (f simFabric) PortByGID(g verbs.GID) (sadb.Port, bool) {
	for _, p := range f {
		if p.GID == g {
			return p, true
		}
	}
	return sadb.Port{}, false
}

func (f simFabric) PortByLID(l verbs.LID) (sadb.Port, bool) {
	for _, p := range f {
		if p.LID == l {
			return p, true
		}
	}
	return sadb.Port{}, false
}

// sadbPort is a verbs.Port whose MAD agent hands requests to a sadb.DB as the soft
// subnet manager does.
type sadbPort struct {
	db   *sadb.DB
	self sadb.Port
	sm   verbs.LID
}

func (p *sadbPort) Num() int { return 1 }
func (p *sadbPort) Attr() verbs.PortAttr {
	return verbs.PortAttr{State: verbs.PortActive, LID: p.self.LID, SMLID: p.sm, GUID: p.self.GUID, GIDPrefix: p.self.GID.Prefix()}
}
func (p *sadbPort) GID(i int) (verbs.GID, error) { return p.self.GID, nil }
func (p *sadbPort) PKeyTable() []verbs.PKey      { return p.self.PKeys }
func (p *sadbPort) FindPKey(k verbs.PKey) (int, bool) {
	return findPKey(p.self.PKeys, k)
}
func (p *sadbPort) Counters() verbs.PortCounters { return verbs.PortCounters{} }
func (p *sadbPort) MAD() verbs.MADAgent          { return p }

func (p *sadbPort) Call(ctx context.Context, dlid verbs.LID, req []byte, timeout time.Duration, retries int) ([]byte, error) {
	if resp := p.db.Handle(p.self, req); resp != nil {
		return resp, nil
	}
	return nil, verbs.ErrTimeout
}
func (p *sadbPort) Send(verbs.LID, verbs.QPN, []byte) error { return nil }
func (p *sadbPort) Register(uint8, verbs.MADHandler)        {}
