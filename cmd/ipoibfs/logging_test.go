package main

import (
	"fmt"
	"testing"
)

func TestCountersAsKeyValues(t *testing.T) {
	type counters struct {
		XmitPackets, BadICRC, BadPKey uint64
		hidden                        int
	}
	got := fmt.Sprint(kv(counters{XmitPackets: 6, BadICRC: 1, BadPKey: 2}))
	if want := "[xmit_packets 6 bad_icrc 1 bad_p_key 2]"; got != want {
		t.Errorf("kv = %s, want %s", got, want)
	}
}
