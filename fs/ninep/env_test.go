package ninep

import (
	"testing"

	"ipoibfs/fs"
	"ipoibfs/fs/fstest"
	"ipoibfs/ipoib"
	"ipoibfs/verbs/soft"
)

type env struct {
	hca  *soft.HCA
	e    *ipoib.Engine
	ib0  *ipoib.Interface
	tree *fs.Tree
	log  *fstest.LogSink
}

// newEnv starts a one-node soft fabric that hosts its own subnet manager, an engine on
// it with ib0 up and carrier on, and the tree with sm/.
func newEnv(t testing.TB) *env { return newEnvNamed(t, "n1") }

// newEnvNamed is newEnv with a node name (GUIDs derive from it).
func newEnvNamed(t testing.TB, name string) *env {
	f := fstest.NewEnv(t, name)
	return &env{hca: f.HCA, e: f.Engine, ib0: f.IB0, tree: f.Tree, log: f.Log}
}

func waitFor(t testing.TB, what string, cond func() bool) { t.Helper(); fstest.WaitFor(t, what, cond) }
