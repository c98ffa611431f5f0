package main

import (
	"testing"

	"go.uber.org/goleak"
)

// Every test of the package must leave no goroutine behind (go.uber.org/goleak, as
// wireguard-go checks its own).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
