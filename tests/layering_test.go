package tests

import (
	"os/exec"
	"strings"
	"testing"
)

// The arrows go one way, cmd -> fs -> ipoib -> verbs, and fs needs only the verbs
// interfaces, never the soft HCA (its sm/ comes through fs.SubnetManager).
func TestLayering(t *testing.T) {
	forbidden := map[string][]string{
		"ipoibfs/fs":    {"ipoibfs/verbs/soft", "ipoibfs/cmd"},
		"ipoibfs/ipoib": {"ipoibfs/fs", "ipoibfs/verbs/soft", "ipoibfs/cmd"},
		"ipoibfs/verbs": {"ipoibfs/ipoib", "ipoibfs/fs"},
	}
	for pkg, bad := range forbidden {
		out, err := exec.Command("go", "list", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			for _, b := range bad {
				if dep == b || strings.HasPrefix(dep, b+"/") {
					t.Errorf("%s depends on %s", pkg, dep)
				}
			}
		}
	}
}
