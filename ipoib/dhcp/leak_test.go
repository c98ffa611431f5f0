package dhcp

import (
	"testing"

	"go.uber.org/goleak"
)

// Every test of the package must leave no goroutine behind: Close ends the client's two.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
