package ipoib

// A static check of the lock order written in doc.go ("Locking").
//
// The package's Go files (those of the default build) are type-checked, and every
// function and function literal is walked statement by statement with the set of this
// package's mutexes it may hold at each point (Lock/RLock add, Unlock/RUnlock remove, a
// deferred Unlock keeps the lock to the end; branches that return are dropped, the others
// merged). A call to a function of this package stands for every lock and callout the
// callee may take, transitively; so do calls of the closures a function hands back for
// after unlocking (setMTULocked's act, a bond's acts): a closure value is followed to the
// function literals and method values assigned to it, returned by the function it came
// from, or appended to it. A function literal called on the spot, deferred, or passed to
// a call is taken as run there; one started with go runs with no lock.
//
// From that it checks:
//   - every pair of locks that nest follows lockOrder, the order doc.go gives; the only
//     pair of one class is Interface.mu of a child, then of its parent, which the check
//     recognises as a call on "X.parent";
//   - the callouts (calls into code that is not this package's) are made under no lock
//     but those calloutAllowed lists: Host methods (the kernel device), Devices and
//     BondDevices (its maker), the SA client, and the blocking CM calls (Connect,
//     Disconnect);
//   - lockExceptions, the documented exceptions, each still happens (so that the doc and
//     this list are updated when one goes away).
//
// Limits. Locks are classes (type and field), not instances: Interface.mu of two
// interfaces is one lock here, hence the parent rule. Calls through values the walk
// cannot resolve (interfaces of other packages, function fields such as cmStop, and
// closures that come from parameters) are not followed; which locks the implementations
// of Devices and BondDevices take is written in calloutLocks (cmd/ipoibfs's call back
// Interface and Bond methods), and Host implementations are assumed to call nothing of
// this package. Conditions are ignored: a call under "if h != nil" counts even where h
// is always nil (a new child's host, lockExceptions says where). Waits (WaitGroup,
// channels) are not locks and are not checked.
//
// TestLockOrderChecker runs the same check on a small package with known mistakes, so
// that a checker gone blind fails too.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"ipoibfs/internal/testenv"
)

// lockOrder is doc.go's order, outermost first.
var lockOrder = []string{
	"Interface.childOps",
	"Bonds.mu",
	"Bond.hostMu",
	"Bond.mu",
	"Engine.mu",
	"Interface.upMu",
	"Interface.hostMu",
	"rxState.mu",
	"txLane.mu",
	"Interface.mu",
	"Interface.rxMu",
	"Interface.dmu",
	"Interface.leaveMu",
	"Interface.loopMu",
	"ratelimit.mu",
}

// calloutAllowed lists, per kind of callout, the locks it may be made under.
var calloutAllowed = map[string][]string{
	"Host":        {"Interface.childOps", "Interface.upMu", "Bond.hostMu", "Interface.hostMu", "rxState.mu", "Interface.rxMu"}, // rxState.mu: Deliver, in order; rxMu: from the receive buffers
	"Devices":     {"Interface.childOps"},
	"BondDevices": {"Bonds.mu"},
	"SA":          nil,
	"CM":          nil, // Connect and Disconnect wait for the peer
}

// calloutLocks are the locks the implementations of a callout take in this package
// (cmd/ipoibfs's bridges call Interface methods from Create and Delete, its bond bridges
// Bond methods from CreateBond).
var calloutLocks = map[string][]string{
	"Devices":     {"Interface.mu", "Interface.rxMu", "Interface.dmu"},
	"BondDevices": {"Bond.mu"},
}

// lockException is a documented departure: what (a lock taken or a kind of callout
// made) while held is held, in holder (the function holding it).
type lockException struct {
	held, what, holder string
	why                string
}

var lockExceptions = []lockException{
	{"Bond.mu", "Host", "Bond.Enslave",
		"the slave's SetMTU and SetUp call the slave's own host (its kernel device), which calls nothing of the engine"},
	{"Bond.mu", "Host", "Bond.SetMTU",
		"the slaves' SetMTU call the slaves' own hosts, as in Enslave"},
}

func TestLockOrder(t *testing.T) {
	exports, self := goListExport(t, ".")
	fset := token.NewFileSet()
	var files []*ast.File
	for _, name := range self.GoFiles {
		f, err := parser.ParseFile(fset, filepath.Join(self.Dir, name), nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	lc := newLockChecker(t, fset, self.ImportPath, files, exports)
	lc.run()
	t.Log("lock pairs (held -> taken, by the function holding the first):\n" + lc.table())

	// The walk must see what is known to be there, or it is blind.
	for _, want := range []struct{ held, what, holder string }{
		{"txLane.mu", "Interface.dmu", "Interface.transmit"},
		{"Interface.mu", "Interface.dmu", "Interface.SetMode"},
		{"Interface.rxMu", "Interface.dmu", "Interface.restartQP"}, // through setLocked
		{"Engine.mu", "Interface.mu", "Interface.deleteChild"},
		{"Interface.childOps", "Engine.mu", "Interface.newChild"},
		{"Bond.mu", "Interface.mu", "Bond.miiCheck"},
		{"Bond.mu", "Engine.mu", "Bond.releaseGone"},
		{"Interface.mu", "Interface.leaveMu", "Interface.mcastRound"},
		{"Bond.mu", "Host", "Bond.Enslave"},                     // through a returned closure (act)
		{"Interface.childOps", "Devices", "Interface.newChild"}, // a callout
		{"rxState.mu", "Host", "Interface.rxHandler"},           // under a TryLock
	} {
		if !lc.seen(want.held, want.what, want.holder) {
			t.Errorf("the check does not see %s taken under %s in %s: it has gone blind", want.what, want.held, want.holder)
		}
	}
	for _, v := range lc.violations(lockOrder, calloutAllowed, lockExceptions) {
		t.Error(v)
	}
}

// TestLockOrderChecker runs the check on a package with a reversed pair, a host call
// under Interface.mu through a returned closure, a recursive lock and a lock taken by a
// callout's implementation out of order; and on correct code next to them.
func TestLockOrderChecker(t *testing.T) {
	const src = `package fake

import "sync"

type Host interface{ Deliver([][]byte) }
type Devices interface{ Create(*Interface) error }
type Engine struct {
	mu   sync.Mutex
	devs Devices
}
type Interface struct {
	e      *Engine
	parent *Interface
	mu     sync.Mutex
	host   Host
}

func (e *Engine) Interfaces() []*Interface { e.mu.Lock(); defer e.mu.Unlock(); return nil }

func (i *Interface) IsUp() bool { i.mu.Lock(); defer i.mu.Unlock(); return true }

func (i *Interface) actLocked() func() {
	h := i.host
	return func() {
		if h != nil {
			h.Deliver(nil)
		}
	}
}

func (i *Interface) reversed() { i.mu.Lock(); defer i.mu.Unlock(); i.e.Interfaces() }

func (i *Interface) hostUnderLock() {
	i.mu.Lock()
	var acts []func()
	acts = append(acts, i.actLocked())
	for _, a := range acts {
		a()
	}
	i.mu.Unlock()
}

func (i *Interface) recursive() { i.mu.Lock(); _ = i.IsUp(); i.mu.Unlock() }

func (i *Interface) deviceUnderLock() { i.mu.Lock(); _ = i.e.devs.Create(i); i.mu.Unlock() }

func (i *Interface) good(x bool) {
	i.mu.Lock()
	if x {
		i.mu.Unlock()
		return
	}
	up := i.parent.IsUp()
	act := i.actLocked()
	i.mu.Unlock()
	if up {
		act()
	}
	i.e.Interfaces()
}
`
	exports, _ := goListExport(t, "sync")
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "fake.go", src, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	lc := newLockChecker(t, fset, "fake", []*ast.File{f}, exports)
	lc.run()
	got := lc.violations([]string{"Engine.mu", "Interface.mu", "Interface.rxMu", "Interface.dmu"},
		map[string][]string{"Host": nil, "Devices": nil}, nil)
	for _, want := range []string{
		"Interface.mu then Engine.mu in Interface.reversed",
		"Host called under Interface.mu in Interface.hostUnderLock",
		"Interface.mu taken again under Interface.mu in Interface.recursive",
		"Devices called under Interface.mu in Interface.deviceUnderLock",
	} {
		if !slices.ContainsFunc(got, func(v string) bool { return strings.HasPrefix(v, want) }) {
			t.Errorf("not reported: %s", want)
		}
	}
	if len(got) != 5 { // the fourth also takes Interface.mu again (calloutLocks)
		t.Errorf("%d violations, want 5:\n%s", len(got), strings.Join(got, "\n"))
	}
	for _, v := range got {
		if strings.Contains(v, ".good") {
			t.Errorf("correct code reported: %s", v)
		}
	}
}

// ---- loading ----

type listedPkg struct {
	ImportPath string
	Dir        string
	GoFiles    []string
	Export     string
}

// goListExport returns the export data files of a package and its dependencies (go
// list -export), and the package itself.
func goListExport(t *testing.T, pkg string) (map[string]string, listedPkg) {
	t.Helper()
	goTool := testenv.Tool(t, "go")
	cmd := exec.Command(goTool, "list", "-export", "-deps", "-json=ImportPath,Dir,GoFiles,Export", pkg)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.Bytes())
	}
	exports := map[string]string{}
	var last listedPkg
	for dec := json.NewDecoder(bytes.NewReader(out)); ; {
		var p listedPkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if p.Export != "" {
			exports[p.ImportPath] = p.Export
		}
		last = p // -deps lists the package itself last
	}
	return exports, last
}

// ---- the checker ----

type lockChecker struct {
	t    *testing.T
	fset *token.FileSet
	pkg  *types.Package
	info *types.Info

	decls    map[*types.Func]*ast.FuncDecl
	lits     []*ast.FuncLit
	assigns  map[*types.Var][]ast.Expr // values assigned to a variable
	rangeOf  map[*types.Var]ast.Expr   // a range loop's value variable: the ranged slice
	returned map[ast.Node][]ast.Node   // closures a function returns
	sums     map[ast.Node]*lockSummary
	grew     bool

	// Found by the final walk: pairs (held, what) per holder, with a witness.
	pairs map[[3]string]string
	// Calls under a lock of the same class: recv is the call's receiver.
	same []sameLock
}

type sameLock struct {
	class, holder, recv, witness string
}

// lockSummary is what calling a function may do: locks it takes and callouts it makes,
// each with how (a chain of calls).
type lockSummary struct {
	locks    map[string]string
	callouts map[string]string
}

func newLockChecker(t *testing.T, fset *token.FileSet, path string, files []*ast.File, exports map[string]string) *lockChecker {
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		f, ok := exports[path]
		if !ok {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(f)
	})
	info := &types.Info{
		Types:      map[ast.Expr]types.TypeAndValue{},
		Defs:       map[*ast.Ident]types.Object{},
		Uses:       map[*ast.Ident]types.Object{},
		Selections: map[*ast.SelectorExpr]*types.Selection{},
	}
	pkg, err := (&types.Config{Importer: imp}).Check(path, fset, files, info)
	if err != nil {
		t.Fatalf("type-checking %s: %v", path, err)
	}
	lc := &lockChecker{t: t, fset: fset, pkg: pkg, info: info,
		decls: map[*types.Func]*ast.FuncDecl{}, assigns: map[*types.Var][]ast.Expr{},
		rangeOf: map[*types.Var]ast.Expr{}, returned: map[ast.Node][]ast.Node{},
		sums: map[ast.Node]*lockSummary{}, pairs: map[[3]string]string{}}
	for _, f := range files {
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Body != nil {
				lc.decls[info.Defs[fd.Name].(*types.Func)] = fd
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.FuncLit:
				lc.lits = append(lc.lits, n)
			case *ast.AssignStmt:
				if len(n.Lhs) == len(n.Rhs) {
					for k, l := range n.Lhs {
						if v := lc.varOf(l); v != nil {
							lc.assigns[v] = append(lc.assigns[v], n.Rhs[k])
						}
					}
				}
			case *ast.ValueSpec:
				if len(n.Names) == len(n.Values) {
					for k, id := range n.Names {
						if v, ok := info.Defs[id].(*types.Var); ok {
							lc.assigns[v] = append(lc.assigns[v], n.Values[k])
						}
					}
				}
			case *ast.RangeStmt:
				if n.Value != nil {
					if v := lc.varOf(n.Value); v != nil {
						lc.rangeOf[v] = n.X
					}
				}
			}
			return true
		})
	}
	return lc
}

func (lc *lockChecker) varOf(e ast.Expr) *types.Var {
	id, ok := ast.Unparen(e).(*ast.Ident)
	if !ok {
		return nil
	}
	if v, ok := lc.info.Defs[id].(*types.Var); ok {
		return v
	}
	v, _ := lc.info.Uses[id].(*types.Var)
	return v
}

func (lc *lockChecker) pos(p token.Pos) string {
	q := lc.fset.Position(p)
	return fmt.Sprintf("%s:%d", filepath.Base(q.Filename), q.Line)
}

// funcs lists every function and function literal, in source order.
func (lc *lockChecker) funcs() []ast.Node {
	var out []ast.Node
	for _, d := range lc.decls {
		out = append(out, d)
	}
	for _, l := range lc.lits {
		out = append(out, l)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Pos() < out[b].Pos() })
	return out
}

func (lc *lockChecker) name(fn ast.Node) string {
	switch fn := fn.(type) {
	case *ast.FuncDecl:
		if fn.Recv != nil && len(fn.Recv.List) > 0 {
			return typeName(lc.info.Types[fn.Recv.List[0].Type].Type) + "." + fn.Name.Name
		}
		return fn.Name.Name
	case *ast.FuncLit:
		return "func@" + lc.pos(fn.Pos())
	}
	return "?"
}

// typeName is the name of a (pointer to a) named type, "" for others.
func typeName(t types.Type) string {
	if p, ok := t.(*types.Pointer); ok {
		t = p.Elem()
	}
	if n, ok := t.(*types.Named); ok {
		return n.Obj().Name()
	}
	return ""
}

func (lc *lockChecker) run() {
	// Summaries to a fixed point (calls can be recursive: SetUp of the children).
	for first := true; first || lc.grew; first = false {
		lc.grew = false
		for _, fn := range lc.funcs() {
			w := &lockWalker{lc: lc, fn: fn, sum: lc.summary(fn)}
			w.body(fn, heldLocks{})
		}
	}
	// Then every function once more, recording what is taken under what.
	for _, fn := range lc.funcs() {
		w := &lockWalker{lc: lc, fn: fn, sum: &lockSummary{locks: map[string]string{}, callouts: map[string]string{}}, record: true}
		w.body(fn, heldLocks{})
	}
}

func (lc *lockChecker) summary(fn ast.Node) *lockSummary {
	s := lc.sums[fn]
	if s == nil {
		s = &lockSummary{locks: map[string]string{}, callouts: map[string]string{}}
		lc.sums[fn] = s
	}
	return s
}

// returnedClosures are the closures fn returns (func or []func results).
func (lc *lockChecker) returnedClosures(fn ast.Node) []ast.Node {
	if out, ok := lc.returned[fn]; ok {
		return out
	}
	lc.returned[fn] = nil // a recursive return adds nothing
	var body *ast.BlockStmt
	switch fn := fn.(type) {
	case *ast.FuncDecl:
		body = fn.Body
	case *ast.FuncLit:
		body = fn.Body
	}
	var out []ast.Node
	ast.Inspect(body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncLit:
			return false // its returns are its own
		case *ast.ReturnStmt:
			for _, r := range n.Results {
				out = append(out, lc.closures(r, map[*types.Var]bool{})...)
			}
		}
		return true
	})
	lc.returned[fn] = out
	return out
}

// closures resolves a value of function type (or a slice of them) to the function
// literals and functions of this package it can hold.
func (lc *lockChecker) closures(e ast.Expr, seen map[*types.Var]bool) []ast.Node {
	switch e := ast.Unparen(e).(type) {
	case *ast.FuncLit:
		return []ast.Node{e}
	case *ast.Ident:
		switch o := lc.info.Uses[e].(type) {
		case *types.Func:
			if d := lc.decls[o]; d != nil {
				return []ast.Node{d}
			}
		case *types.Var:
			if seen[o] {
				return nil
			}
			seen[o] = true
			var out []ast.Node
			for _, v := range lc.assigns[o] {
				out = append(out, lc.closures(v, seen)...)
			}
			if x, ok := lc.rangeOf[o]; ok {
				out = append(out, lc.closures(x, seen)...)
			}
			return out
		}
	case *ast.SelectorExpr:
		if s := lc.info.Selections[e]; s != nil && s.Kind() != types.FieldVal {
			if d := lc.decls[s.Obj().(*types.Func)]; d != nil {
				return []ast.Node{d} // a method value: next.announce
			}
		}
	case *ast.CompositeLit:
		var out []ast.Node
		for _, el := range e.Elts {
			if kv, ok := el.(*ast.KeyValueExpr); ok {
				el = kv.Value
			}
			out = append(out, lc.closures(el, seen)...)
		}
		return out
	case *ast.CallExpr:
		if id, ok := ast.Unparen(e.Fun).(*ast.Ident); ok {
			if b, ok := lc.info.Uses[id].(*types.Builtin); ok && b.Name() == "append" {
				var out []ast.Node
				for _, a := range e.Args {
					out = append(out, lc.closures(a, seen)...)
				}
				return out
			}
		}
		if d := lc.callee(e); d != nil {
			return lc.returnedClosures(d)
		}
	}
	return nil
}

// callee is the function of this package a call calls statically, nil for others.
func (lc *lockChecker) callee(c *ast.CallExpr) *ast.FuncDecl {
	var obj types.Object
	switch f := ast.Unparen(c.Fun).(type) {
	case *ast.Ident:
		obj = lc.info.Uses[f]
	case *ast.SelectorExpr:
		if s := lc.info.Selections[f]; s != nil {
			if s.Kind() == types.FieldVal {
				return nil
			}
			obj = s.Obj()
		} else {
			obj = lc.info.Uses[f.Sel]
		}
	}
	if fn, ok := obj.(*types.Func); ok {
		return lc.decls[fn]
	}
	return nil
}

// calloutKind classifies a call into code of another kind: "" for none.
func (lc *lockChecker) calloutKind(c *ast.CallExpr) (string, string) {
	sel, ok := ast.Unparen(c.Fun).(*ast.SelectorExpr)
	if !ok {
		return "", ""
	}
	s := lc.info.Selections[sel]
	if s == nil || s.Kind() != types.MethodVal {
		return "", ""
	}
	recv := lc.info.Types[sel.X].Type
	if p, ok := recv.(*types.Pointer); ok {
		recv = p.Elem()
	}
	n, ok := recv.(*types.Named)
	if !ok {
		return "", ""
	}
	name := n.Obj().Name()
	if n.Obj().Pkg() == lc.pkg && types.IsInterface(n) {
		switch name {
		case "Host", "AdminHost", "TxQueueHost", "LinkLocalHost", "FrameHost":
			return "Host", name + "." + sel.Sel.Name
		case "Devices", "BondDevices":
			return name, name + "." + sel.Sel.Name
		case "saClient":
			return "SA", "sa." + sel.Sel.Name
		}
	}
	if p := n.Obj().Pkg(); p != nil && strings.HasSuffix(p.Path(), "verbs/cm") &&
		(name == "Manager" || name == "Conn") && (sel.Sel.Name == "Connect" || sel.Sel.Name == "Disconnect") {
		return "CM", "cm." + name + "." + sel.Sel.Name
	}
	return "", ""
}

// lockOp recognises X.Lock(), X.Unlock() and their RW forms on a mutex of this
// package: the lock class ("Interface.mu") and whether it is taken.
func (lc *lockChecker) lockOp(c *ast.CallExpr) (class, recv string, take, ok bool) {
	sel, isSel := ast.Unparen(c.Fun).(*ast.SelectorExpr)
	if !isSel {
		return
	}
	s := lc.info.Selections[sel]
	if s == nil || s.Kind() != types.MethodVal {
		return
	}
	m := s.Obj().(*types.Func)
	if m.Pkg() == nil || m.Pkg().Path() != "sync" {
		return
	}
	switch rn := typeName(s.Recv()); {
	case rn != "Mutex" && rn != "RWMutex":
		return
	}
	switch sel.Sel.Name {
	case "Lock", "RLock", "TryLock", "TryRLock": // a TryLock's failing branch is assumed to return, not checked
		take = true
	case "Unlock", "RUnlock":
	default:
		return
	}
	x := ast.Unparen(sel.X)
	if fx, isField := x.(*ast.SelectorExpr); isField {
		if fs := lc.info.Selections[fx]; fs != nil && fs.Kind() == types.FieldVal {
			return typeName(fs.Recv()) + "." + fx.Sel.Name, types.ExprString(fx.X), take, true
		}
	}
	return types.ExprString(x), "", take, true
}

// ---- the walk ----

// heldLocks maps a held lock class to where it was taken.
type heldLocks map[string]string

func (h heldLocks) clone() heldLocks {
	c := make(heldLocks, len(h))
	for k, v := range h {
		c[k] = v
	}
	return c
}

func (h heldLocks) merge(o heldLocks) {
	for k, v := range o {
		if _, ok := h[k]; !ok {
			h[k] = v
		}
	}
}

type lockWalker struct {
	lc     *lockChecker
	fn     ast.Node // the function walked (the holder of what it takes)
	sum    *lockSummary
	record bool
	// Lock sets at break and continue statements, innermost loop or switch last.
	jumps []*jumpSet
}

type jumpSet struct {
	held heldLocks
	any  bool
}

func (w *lockWalker) body(fn ast.Node, h heldLocks) {
	switch fn := fn.(type) {
	case *ast.FuncDecl:
		w.block(fn.Body.List, h)
	case *ast.FuncLit:
		w.block(fn.Body.List, h)
	}
}

// block walks statements; it returns the locks held after them, or terminated when
// every way through returns (or jumps).
func (w *lockWalker) block(list []ast.Stmt, h heldLocks) (heldLocks, bool) {
	for _, s := range list {
		var term bool
		if h, term = w.stmt(s, h); term {
			return h, true
		}
	}
	return h, false
}

func (w *lockWalker) stmt(s ast.Stmt, h heldLocks) (heldLocks, bool) {
	switch s := s.(type) {
	case *ast.ExprStmt:
		w.expr(s.X, h)
	case *ast.AssignStmt:
		for _, e := range s.Rhs {
			w.expr(e, h)
		}
		for _, e := range s.Lhs {
			w.expr(e, h)
		}
	case *ast.DeclStmt:
		w.expr(s, h)
	case *ast.IncDecStmt:
		w.expr(s.X, h)
	case *ast.SendStmt:
		w.expr(s.Chan, h)
		w.expr(s.Value, h)
	case *ast.ReturnStmt:
		for _, e := range s.Results {
			w.expr(e, h)
		}
		return h, true
	case *ast.BranchStmt:
		if s.Tok == token.BREAK || s.Tok == token.CONTINUE {
			if n := len(w.jumps); n > 0 {
				w.jumps[n-1].held.merge(h)
				w.jumps[n-1].any = true
			}
		}
		return h, true
	case *ast.BlockStmt:
		return w.block(s.List, h)
	case *ast.LabeledStmt:
		return w.stmt(s.Stmt, h)
	case *ast.IfStmt:
		if s.Init != nil {
			h, _ = w.stmt(s.Init, h)
		}
		w.expr(s.Cond, h)
		th, tt := w.block(s.Body.List, h.clone())
		eh, et := h.clone(), false
		if s.Else != nil {
			eh, et = w.stmt(s.Else, h.clone())
		}
		switch {
		case tt && et:
			return h, true
		case tt:
			return eh, false
		case et:
			return th, false
		}
		th.merge(eh)
		return th, false
	case *ast.ForStmt:
		if s.Init != nil {
			h, _ = w.stmt(s.Init, h)
		}
		if s.Cond != nil {
			w.expr(s.Cond, h)
		}
		return w.loop(s.Body, s.Post, h), false
	case *ast.RangeStmt:
		w.expr(s.X, h)
		return w.loop(s.Body, nil, h), false
	case *ast.SwitchStmt:
		if s.Init != nil {
			h, _ = w.stmt(s.Init, h)
		}
		if s.Tag != nil {
			w.expr(s.Tag, h)
		}
		return w.clauses(s.Body, h)
	case *ast.TypeSwitchStmt:
		if s.Init != nil {
			h, _ = w.stmt(s.Init, h)
		}
		h, _ = w.stmt(s.Assign, h)
		return w.clauses(s.Body, h)
	case *ast.SelectStmt:
		return w.clauses(s.Body, h)
	case *ast.GoStmt:
		// The goroutine holds nothing (a literal is walked on its own); only the
		// arguments are evaluated here.
		for _, a := range s.Call.Args {
			w.expr(a, h)
		}
		if sel, ok := s.Call.Fun.(*ast.SelectorExpr); ok {
			w.expr(sel.X, h)
		}
	case *ast.DeferStmt:
		if _, _, take, ok := w.lc.lockOp(s.Call); ok && !take {
			break // the lock stays held to the end
		}
		w.call(s.Call, h) // as if run here: defer func() { mu.Unlock(); run(acts) }()
	}
	return h, false
}

// loop walks a loop body once: what it holds after may be what it held before, at
// the end of the body, or at a break or continue.
func (w *lockWalker) loop(body *ast.BlockStmt, post ast.Stmt, h heldLocks) heldLocks {
	w.jumps = append(w.jumps, &jumpSet{held: heldLocks{}})
	bh, bt := w.block(body.List, h.clone())
	if post != nil && !bt {
		w.stmt(post, bh)
	}
	out := h.clone()
	if !bt {
		out.merge(bh)
	}
	out.merge(w.jumps[len(w.jumps)-1].held)
	w.jumps = w.jumps[:len(w.jumps)-1]
	return out
}

// clauses walks the cases of a switch or select; without a default one, none may run.
func (w *lockWalker) clauses(body *ast.BlockStmt, h heldLocks) (heldLocks, bool) {
	w.jumps = append(w.jumps, &jumpSet{held: heldLocks{}})
	out, all, hasDefault := heldLocks{}, true, false
	for _, c := range body.List {
		var list []ast.Stmt
		ch := h.clone()
		switch c := c.(type) {
		case *ast.CaseClause:
			hasDefault = hasDefault || c.List == nil
			for _, e := range c.List {
				w.expr(e, ch)
			}
			list = c.Body
		case *ast.CommClause:
			hasDefault = hasDefault || c.Comm == nil
			if c.Comm != nil {
				ch, _ = w.stmt(c.Comm, ch)
			}
			list = c.Body
		}
		if ch, t := w.block(list, ch); !t {
			out.merge(ch)
			all = false
		}
	}
	brk := w.jumps[len(w.jumps)-1]
	w.jumps = w.jumps[:len(w.jumps)-1]
	if !hasDefault {
		out.merge(h)
		all = false
	}
	if brk.any {
		out.merge(brk.held)
		all = false
	}
	if all {
		return h, true
	}
	return out, false
}

// expr walks the calls in an expression, in order; function literals are not run here
// unless called.
func (w *lockWalker) expr(n ast.Node, h heldLocks) {
	if n == nil {
		return
	}
	ast.Inspect(n, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncLit:
			return false
		case *ast.CallExpr:
			w.call(n, h)
			return false
		}
		return true
	})
}

func (w *lockWalker) call(c *ast.CallExpr, h heldLocks) {
	lc := w.lc
	// The receiver and the arguments first.
	switch f := ast.Unparen(c.Fun).(type) {
	case *ast.SelectorExpr:
		w.expr(f.X, h)
	case *ast.FuncLit:
		w.inline(f, h) // func() { ... }()
		return
	}
	callee := lc.callee(c)
	builtin := false
	if id, ok := ast.Unparen(c.Fun).(*ast.Ident); ok {
		_, builtin = lc.info.Uses[id].(*types.Builtin)
	}
	for _, a := range c.Args {
		if lit, ok := ast.Unparen(a).(*ast.FuncLit); ok {
			if !builtin { // append keeps it for later
				w.inline(lit, h) // passed to be called: sort.Slice, slices.DeleteFunc
			}
			continue
		}
		w.expr(a, h)
		if callee != nil { // a function of ours given closures calls them: run(acts)
			for _, cl := range lc.closures(a, map[*types.Var]bool{}) {
				w.apply(lc.summary(cl), lc.name(cl), a.Pos(), "", h)
			}
		}
	}
	if class, recv, take, ok := lc.lockOp(c); ok {
		if !take {
			delete(h, class)
			return
		}
		at := lc.pos(c.Pos())
		w.took(class, recv, class+" ("+at+")", h)
		h[class] = at
		return
	}
	if kind, what := lc.calloutKind(c); kind != "" {
		wit := what + " (" + lc.pos(c.Pos()) + ")"
		w.callout(kind, wit, h)
		for _, l := range calloutLocks[kind] {
			w.took(l, "", wit+" → "+l, h)
		}
		return
	}
	recv := ""
	if sel, ok := ast.Unparen(c.Fun).(*ast.SelectorExpr); ok {
		recv = types.ExprString(sel.X)
	}
	if callee != nil {
		w.apply(lc.summary(callee), lc.name(callee), c.Pos(), recv, h)
		return
	}
	// A closure value: act(), mtuAct(), a().
	for _, cl := range lc.closures(c.Fun, map[*types.Var]bool{}) {
		w.apply(lc.summary(cl), lc.name(cl), c.Pos(), "", h)
	}
}

// inline walks a function literal run at this point, with the locks held here.
func (w *lockWalker) inline(lit *ast.FuncLit, h heldLocks) {
	w.block(lit.Body.List, h.clone())
}

// apply accounts for a call of a function with summary s.
func (w *lockWalker) apply(s *lockSummary, name string, at token.Pos, recv string, h heldLocks) {
	via := name + " (" + w.lc.pos(at) + ") → "
	for _, l := range sortedKeys(s.locks) {
		w.took(l, recv, via+s.locks[l], h)
	}
	for _, k := range sortedKeys(s.callouts) {
		w.callout(k, via+s.callouts[k], h)
	}
}

// took records that lock class is taken (witness: how) with h held.
func (w *lockWalker) took(class, recv, how string, h heldLocks) {
	if _, ok := w.sum.locks[class]; !ok {
		w.sum.locks[class] = how
		w.lc.grew = true
	}
	if !w.record {
		return
	}
	holder := w.lc.name(w.fn)
	for _, held := range sortedKeys(h) {
		wit := fmt.Sprintf("%s holds %s (since %s), takes %s", holder, held, h[held], how)
		if held == class {
			w.lc.same = append(w.lc.same, sameLock{class, holder, recv, wit})
			continue
		}
		k := [3]string{held, class, holder}
		if _, ok := w.lc.pairs[k]; !ok {
			w.lc.pairs[k] = wit
		}
	}
}

func (w *lockWalker) callout(kind, how string, h heldLocks) {
	if _, ok := w.sum.callouts[kind]; !ok {
		w.sum.callouts[kind] = how
		w.lc.grew = true
	}
	if !w.record {
		return
	}
	holder := w.lc.name(w.fn)
	for _, held := range sortedKeys(h) {
		k := [3]string{held, kind, holder}
		if _, ok := w.lc.pairs[k]; !ok {
			w.lc.pairs[k] = fmt.Sprintf("%s holds %s (since %s), calls %s", holder, held, h[held], how)
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// ---- results ----

func (lc *lockChecker) seen(held, what, holder string) bool {
	_, ok := lc.pairs[[3]string{held, what, holder}]
	return ok
}

func (lc *lockChecker) sortedPairs() [][3]string {
	keys := make([][3]string, 0, len(lc.pairs))
	for k := range lc.pairs {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(a, b int) bool {
		x, y := keys[a], keys[b]
		if x[0] != y[0] {
			return x[0] < y[0]
		}
		if x[1] != y[1] {
			return x[1] < y[1]
		}
		return x[2] < y[2]
	})
	return keys
}

func (lc *lockChecker) table() string {
	var b strings.Builder
	for _, k := range lc.sortedPairs() {
		fmt.Fprintf(&b, "  %s -> %s in %s: %s\n", k[0], k[1], k[2], lc.pairs[k])
	}
	for _, s := range lc.same {
		fmt.Fprintf(&b, "  %s -> %s (on %s) in %s: %s\n", s.class, s.class, s.recv, s.holder, s.witness)
	}
	return b.String()
}

// violations checks the pairs found against an order, the callouts allowed and the
// exceptions.
func (lc *lockChecker) violations(order []string, allowed map[string][]string, exc []lockException) []string {
	rank := map[string]int{}
	for k, l := range order {
		rank[l] = k
	}
	used := make([]bool, len(exc))
	excepted := func(k [3]string) bool {
		for n, e := range exc {
			if e.held == k[0] && e.what == k[1] && e.holder == k[2] {
				used[n] = true
				return true
			}
		}
		return false
	}
	var out []string
	for _, k := range lc.sortedPairs() {
		held, what, holder := k[0], k[1], k[2]
		wit := lc.pairs[k]
		if okUnder, isCallout := allowed[what]; isCallout {
			if slices.Contains(okUnder, held) || excepted(k) {
				continue
			}
			out = append(out, fmt.Sprintf("%s called under %s in %s: %s", what, held, holder, wit))
			continue
		}
		rh, okh := rank[held]
		rw, okw := rank[what]
		switch {
		case !okh || !okw:
			if !excepted(k) {
				out = append(out, fmt.Sprintf("%s then %s in %s: a lock not in the documented order: %s", held, what, holder, wit))
			}
		case rh > rw:
			if !excepted(k) {
				out = append(out, fmt.Sprintf("%s then %s in %s: against the documented order: %s", held, what, holder, wit))
			}
		}
	}
	for _, s := range lc.same {
		if s.class == "Interface.mu" && strings.HasSuffix(s.recv, ".parent") {
			continue // a child's, then its parent's
		}
		out = append(out, fmt.Sprintf("%s taken again under %s in %s (on %q): %s", s.class, s.class, s.holder, s.recv, s.witness))
	}
	for n, e := range exc {
		if !used[n] {
			out = append(out, fmt.Sprintf("exception no longer needed: %s under %s in %s (update doc.go and lockExceptions)", e.what, e.held, e.holder))
		}
	}
	return out
}
