package main

import (
	"fmt"
	"io"
)

// reloadCommand is `ipoibfs reload [-tree DIR | -9p ADDR]`: it writes 1 to the
// daemon's reload file and returns when the reload is done, exiting 1 with what went
// wrong (a partitions file that does not parse, interface files with problems). It is
// the unit's ExecReload: systemctl reload then waits for the reload and reports its
// failure, which a signal cannot do.
func reloadCommand(args []string, stdout, stderr io.Writer) int {
	t, _, done, code := treeCommand("reload", args, false, stderr)
	if t == nil {
		return code
	}
	defer done()
	if err := t.WriteFile("reload", []byte("1\n")); err != nil {
		fmt.Fprintf(stderr, "ipoibfs reload: %v (the daemon's log says why)\n", err)
		return exitError
	}
	return exitOK
}
