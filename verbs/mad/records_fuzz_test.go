package mad_test

import (
	"bytes"
	"testing"

	"github.com/google/go-cmp/cmp"

	"ipoibfs/verbs/mad"
)

// record is one of the SA records sa.Client decodes from answers (outside input).
type record interface {
	Marshal([]byte)
	Unmarshal([]byte) error
}

// fuzzRecord checks a record's decoder on any input: short input is an error and
// never a panic, and what decodes encodes to something that decodes to the same
// record (fields the encoder does not keep may change once, not twice).
func fuzzRecord(f *testing.F, size int, fresh func() record) {
	f.Add(make([]byte, size))
	f.Add(bytes.Repeat([]byte{0xff}, size))
	f.Add(bytes.Repeat([]byte{0xa5}, size+7))
	f.Fuzz(func(t *testing.T, b []byte) {
		r := fresh()
		err := r.Unmarshal(b)
		if len(b) < size {
			if err == nil {
				t.Fatalf("Unmarshal accepted %d bytes", len(b))
			}
			return
		}
		if err != nil {
			return // a value the decoder refuses
		}
		out := make([]byte, size)
		r.Marshal(out)
		r2 := fresh()
		if err := r2.Unmarshal(out); err != nil {
			t.Fatalf("re-decoding the encoding failed: %v", err)
		}
		out2 := make([]byte, size)
		r2.Marshal(out2)
		if !bytes.Equal(out, out2) {
			t.Fatalf("unstable encoding\nfirst  %x\nsecond %x", out, out2)
		}
		if d := cmp.Diff(r, r2); d != "" {
			t.Fatalf("unstable (-first +second):\n%s", d)
		}
	})
}

func FuzzNodeRecord(f *testing.F) {
	fuzzRecord(f, mad.NodeRecordSize, func() record { return new(mad.NodeRecord) })
}

func FuzzPortInfoRecord(f *testing.F) {
	fuzzRecord(f, mad.PortInfoRecordSize, func() record { return new(mad.PortInfoRecord) })
}

func FuzzPKeyTableRecord(f *testing.F) {
	fuzzRecord(f, mad.PKeyTableRecordSize, func() record { return new(mad.PKeyTableRecord) })
}
