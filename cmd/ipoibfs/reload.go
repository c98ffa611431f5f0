package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
)

// reloadCommand is `ipoibfs reload [-tree DIR | -9p ADDR]`: it writes 1 to the
// daemon's reload file and returns when the reload is done, exiting 1 with what went
// wrong (a partitions file that does not parse, interface files with problems). It is
// the unit's ExecReload: systemctl reload then waits for the reload and reports its
// failure, which a signal cannot do.
func reloadCommand(args []string, stdout, stderr io.Writer) int {
	fl := flag.NewFlagSet("ipoibfs reload", flag.ContinueOnError)
	fl.SetOutput(stderr)
	tree := fl.String("tree", defaultMount, "the mounted tree")
	addr := fl.String("9p", "", "the tree served over 9P at this address (unix:PATH or host:port) instead")
	if err := fl.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if fl.NArg() != 0 {
		fmt.Fprintf(stderr, "ipoibfs reload: unexpected argument %q\n", fl.Arg(0))
		return exitUsage
	}
	t, done, err := openTree(*tree, *addr)
	if err != nil {
		fmt.Fprintln(stderr, "ipoibfs reload:", err)
		return exitError
	}
	defer done()
	if err := t.WriteFile("reload", []byte("1\n")); err != nil {
		fmt.Fprintf(stderr, "ipoibfs reload: %v (the daemon's log says why)\n", err)
		return exitError
	}
	return exitOK
}
