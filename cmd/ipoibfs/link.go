package main

import (
	"fmt"
	"io"
	"strings"
)

// linkCommand is iproute2's `ip link add ... type ipoib` for our devices, which the
// kernel refuses (it has no IPoIB driver for them): it writes the command to the
// tree's `link` file and shows what that file lists.
//
//	ipoibfs link [-tree DIR | -9p ADDR] add link ib0 name NAME type ipoib [pkey P] [mode M] [umcast 0|1]
//	ipoibfs link [-tree DIR | -9p ADDR] del NAME
//	ipoibfs link [-tree DIR | -9p ADDR] show [NAME]
func linkCommand(args []string, stdout, stderr io.Writer) int {
	t, rest, done, code := treeCommand("link", args, true, stderr)
	if t == nil {
		return code
	}
	defer done()
	if len(rest) == 0 {
		rest = []string{"show"}
	}
	switch rest[0] {
	case "add", "del", "delete":
		if err := t.WriteFile("link", []byte(strings.Join(rest, " ")+"\n")); err != nil {
			fmt.Fprintf(stderr, "ipoibfs link %s: %v (the daemon's log says why)\n", rest[0], err)
			return exitError
		}
		return exitOK
	case "show", "list", "ls":
		b, err := t.ReadFile("link")
		if err != nil {
			fmt.Fprintln(stderr, "ipoibfs link show:", err)
			return exitError
		}
		found := len(rest) == 1
		for _, l := range strings.SplitAfter(string(b), "\n") {
			name, _, _ := strings.Cut(l, ":")
			name, _, _ = strings.Cut(name, "@")
			if l != "" && (len(rest) == 1 || name == rest[1]) {
				fmt.Fprint(stdout, l)
				found = true
			}
		}
		if !found {
			fmt.Fprintf(stderr, "ipoibfs link show: no interface %s\n", rest[1])
			return exitError
		}
		return exitOK
	}
	fmt.Fprintf(stderr, "ipoibfs link: unknown command %q (add, del, show)\n", rest[0])
	return exitUsage
}
