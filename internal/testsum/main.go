// Command testsum reads `go test -json` on stdin, prints the tests' output as plain
// `go test` would, and ends with the number of skipped tests and their names. Under CI
// (the CI environment variable set) a skipped test fails the run: the suite is there
// to prove everything, and a skip proves nothing.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
)

// event is the part of test2json's TestEvent this needs.
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
}

func main() {
	os.Exit(run(os.Stdin, os.Stdout, os.Getenv("CI") != ""))
}

func run(r io.Reader, w io.Writer, ci bool) int {
	var skipped, failed []string
	in := bufio.NewScanner(r)
	in.Buffer(make([]byte, 1<<20), 64<<20)
	out := bufio.NewWriter(w)
	defer out.Flush()
	for in.Scan() {
		line := in.Bytes()
		var e event
		if err := json.Unmarshal(line, &e); err != nil {
			fmt.Fprintf(out, "%s\n", line) // not JSON (a build error): pass it on
			continue
		}
		switch e.Action {
		case "output":
			out.WriteString(e.Output)
		case "skip":
			if e.Test != "" { // a package "skip" is a package without tests
				skipped = append(skipped, e.Package+"."+e.Test)
			}
		case "fail":
			if e.Test != "" {
				failed = append(failed, e.Package+"."+e.Test)
			}
		}
		if e.Action != "output" {
			out.Flush()
		}
	}
	if err := in.Err(); err != nil {
		fmt.Fprintln(out, "testsum:", err)
		return 1
	}
	sort.Strings(skipped)
	fmt.Fprintf(out, "== %d tests skipped\n", len(skipped))
	for _, s := range skipped {
		fmt.Fprintln(out, "   skipped:", s)
	}
	if len(failed) > 0 {
		fmt.Fprintf(out, "== %d tests failed\n", len(failed))
		for _, s := range failed {
			fmt.Fprintln(out, "   failed:", s)
		}
		return 1
	}
	if len(skipped) > 0 && ci {
		fmt.Fprintln(out, "== under CI no test may be skipped")
		return 1
	}
	return 0
}
