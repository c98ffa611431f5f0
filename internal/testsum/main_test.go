package main

import (
	"strings"
	"testing"
)

func TestSkipsCountedAndFailUnderCI(t *testing.T) {
	in := `{"Action":"run","Package":"p","Test":"TestA"}
{"Action":"output","Package":"p","Test":"TestA","Output":"=== RUN   TestA\n"}
{"Action":"skip","Package":"p","Test":"TestA"}
{"Action":"pass","Package":"p","Test":"TestB"}
{"Action":"skip","Package":"q"}
not json: a build error
`
	for _, ci := range []bool{false, true} {
		var out strings.Builder
		code := run(strings.NewReader(in), &out, ci)
		if want := map[bool]int{false: 0, true: 1}[ci]; code != want {
			t.Errorf("ci=%v: exit %d, want %d", ci, code, want)
		}
		for _, s := range []string{"=== RUN   TestA\n", "== 1 tests skipped\n", "skipped: p.TestA\n", "not json: a build error\n"} {
			if !strings.Contains(out.String(), s) {
				t.Errorf("ci=%v: output lacks %q:\n%s", ci, s, out.String())
			}
		}
	}
	var out strings.Builder
	if code := run(strings.NewReader(`{"Action":"fail","Package":"p","Test":"TestC"}`+"\n"), &out, false); code != 1 || !strings.Contains(out.String(), "failed: p.TestC") {
		t.Errorf("a failed test: exit %d\n%s", code, out.String())
	}
}
