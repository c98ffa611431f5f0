package partitions

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"ipoibfs/verbs"
)

func TestPKeys(t *testing.T) {
	const indx0File = `A=0x5 : ALL=full ;
B=0x9, indx0 : 0x10=both ;
C=0x3, indx0 : 0x11 ;
`
	type portCase struct {
		port Port
		want []verbs.PKey
	}
	for _, tc := range []struct {
		name  string
		file  string // "" means Default()
		ports []portCase
	}{
		{
			name: "no file: everybody full in 0x7fff",
			ports: []portCase{
				{Port{GUID: 0x10}, []verbs.PKey{0xffff}},
				{Port{GUID: 0x11, IsSM: true}, []verbs.PKey{0xffff}},
				{Port{GUID: 0x12, IsSwitch: true}, []verbs.PKey{0xffff}},
			},
		},
		{
			name: "ibsim-sa file",
			file: ibsimPartitions,
			ports: []portCase{
				{Port{GUID: 0x10}, []verbs.PKey{0xffff, 0x8001}},
			},
		},
		{
			name: "no Default rule: ALL=limited, SELF=full",
			file: "P=0x1 : ALL=full ;",
			ports: []portCase{
				{Port{GUID: 0x10}, []verbs.PKey{0x7fff, 0x8001}},
				{Port{GUID: 0x11, IsSM: true}, []verbs.PKey{0xffff, 0x8001}},
			},
		},
		{
			name: "Default rule changes single ports; SM stays full",
			file: "Default=0x7fff : 0x10=full, SELF=limited ;",
			ports: []portCase{
				{Port{GUID: 0x10}, []verbs.PKey{0xffff}},
				{Port{GUID: 0x11}, []verbs.PKey{0x7fff}},
				{Port{GUID: 0x12, IsSM: true}, []verbs.PKey{0xffff}},
			},
		},
		{
			name: "both gives full and limited entries, also in Default",
			file: "P=0x2 : 0x10=both ;\nDefault : 0x10=both, SELF=both ;",
			ports: []portCase{
				{Port{GUID: 0x10}, []verbs.PKey{0xffff, 0x8002, 0x0002, 0x7fff}},
				{Port{GUID: 0x11, IsSM: true}, []verbs.PKey{0xffff, 0x7fff}},
				{Port{GUID: 0x12}, []verbs.PKey{0x7fff}},
			},
		},
		{
			name: "last matching entry wins",
			file: "P=0x3 : ALL=full, 0x10=limited ;\nQ=0x4 : 0x10=limited, ALL=full ;",
			ports: []portCase{
				{Port{GUID: 0x10}, []verbs.PKey{0x7fff, 0x0003, 0x8004}},
				{Port{GUID: 0x11}, []verbs.PKey{0x7fff, 0x8003, 0x8004}},
			},
		},
		{
			name: "last entry wins across merged definitions",
			file: "P=0x3 : 0x10=full ;\nQ=0x4 : ALL ;\nP=0x3 : 0x10=limited ;",
			ports: []portCase{
				{Port{GUID: 0x10}, []verbs.PKey{0x7fff, 0x0003, 0x0004}},
			},
		},
		{
			name: "node-type keywords and SELF",
			file: "CA=0x10 : ALL_CAS=full ;\nSW=0x20 : ALL_SWITCHES=full ;\nRT=0x30 : ALL_ROUTERS=full ;\nSM=0x40 : SELF=full ;",
			ports: []portCase{
				{Port{GUID: 1}, []verbs.PKey{0x7fff, 0x8010}},
				{Port{GUID: 2, IsSwitch: true}, []verbs.PKey{0x7fff, 0x8020}},
				{Port{GUID: 3, IsRouter: true}, []verbs.PKey{0x7fff, 0x8030}},
				{Port{GUID: 4, IsSM: true}, []verbs.PKey{0xffff, 0x8010, 0x8040}},
			},
		},
		{
			name: "indx0 puts the first marked partition the port belongs to at index 0",
			file: indx0File,
			ports: []portCase{
				{Port{GUID: 0x10}, []verbs.PKey{0x8009, 0x8005, 0x0009, 0x7fff}},
				{Port{GUID: 0x11}, []verbs.PKey{0x0003, 0x8005, 0x7fff}},
				{Port{GUID: 0x12}, []verbs.PKey{0x7fff, 0x8005}},
				{Port{GUID: 0x13, IsSM: true}, []verbs.PKey{0xffff, 0x8005}},
			},
		},
		{
			name: "automatic keys",
			file: "A : ALL=full ;\nB : 0x10=full ;",
			ports: []portCase{
				{Port{GUID: 0x10}, []verbs.PKey{0x7fff, 0x8001, 0x8002}},
				{Port{GUID: 0x11}, []verbs.PKey{0x7fff, 0x8001}},
			},
		},
		{
			name: "unknown GUIDs and empty partitions match nothing",
			file: "P=0x1 : 0x99=full ;\nQ=0x2 : ;",
			ports: []portCase{
				{Port{GUID: 0x10}, []verbs.PKey{0x7fff}},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			if tc.file != "" {
				var err error
				if c, err = Parse("t.conf", strings.NewReader(tc.file)); err != nil {
					t.Fatal(err)
				}
			}
			for _, pc := range tc.ports {
				if diff := cmp.Diff(pc.want, c.PKeys(pc.port)); diff != "" {
					t.Errorf("PKeys(%+v) mismatch (-want +got):\n%s", pc.port, diff)
				}
			}
		})
	}
}

func TestPKeysNilConfig(t *testing.T) {
	var c *Config
	if diff := cmp.Diff([]verbs.PKey{0xffff}, c.PKeys(Port{GUID: 1})); diff != "" {
		t.Errorf("nil Config PKeys (-want +got):\n%s", diff)
	}
	if c.Keys() != nil || c.String() != "" {
		t.Error("nil Config Keys/String not empty")
	}
}

func TestKeysHandBuilt(t *testing.T) {
	// Keys follows OpenSM's generate_pkey/find_by_name for any Config, also one not
	// produced by Parse: explicit keys are used as given (low 15 bits), a named
	// automatic partition reuses an earlier partition's key, the counter skips keys in
	// use at that point.
	c := &Config{Partitions: []Partition{
		{Name: "x", PKey: 0x8001},
		{Name: "y"},
		{Name: "x"},
		{Name: "Default"},
		{},
		{PKey: 0x0003},
	}}
	want := []verbs.PKey{0x0001, 0x0002, 0x0001, 0x7fff, 0x0003, 0x0003}
	if diff := cmp.Diff(want, c.Keys()); diff != "" {
		t.Errorf("Keys (-want +got):\n%s", diff)
	}
}
