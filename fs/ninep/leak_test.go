package ninep

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// Every test of the package must leave no goroutine behind (go.uber.org/goleak, as
// wireguard-go checks its own).
func TestMain(m *testing.M) {
	if role := os.Getenv("IPOIBFS_NINEP_HOLDER"); role != "" {
		runHolder(role) // a process of holder_test.go's, not a test run
		return
	}
	goleak.VerifyTestMain(m)
}
