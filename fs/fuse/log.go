package fuse

import (
	"io"
	"log"
	"strings"
)

// logWriter turns log.Logger output into calls of a line function.
type logWriter func(string)

func (w logWriter) Write(p []byte) (int, error) {
	for _, l := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		w("fuse: " + l)
	}
	return len(p), nil
}

func newLogger(f func(string)) *log.Logger {
	if f == nil {
		return log.New(io.Discard, "", 0)
	}
	return log.New(logWriter(f), "", 0)
}
