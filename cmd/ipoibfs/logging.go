package main

import (
	"log"
	"log/slog"
	"os"
	"reflect"
	"strings"
	"unicode"
)

// setupLogging makes log/slog the daemon's log: key=value lines with levels on
// stderr (journald and the tests read them). Lines of the standard log package, which
// most of the daemon still uses, arrive as level=INFO; the engine's debug_level and
// mcast_debug_level traces as level=DEBUG (those parameters decide whether they are
// written at all).
func setupLogging() *log.Logger {
	h := slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})
	slog.SetDefault(slog.New(h))
	return slog.NewLogLogger(h, slog.LevelDebug)
}

// kv turns a struct of counters into slog key=value pairs with snake_case keys:
// XmitPackets=6 becomes xmit_packets=6.
func kv(v any) []any {
	rv := reflect.ValueOf(v)
	rt := rv.Type()
	var out []any
	for k := 0; k < rt.NumField(); k++ {
		if !rt.Field(k).IsExported() {
			continue
		}
		out = append(out, snake(rt.Field(k).Name), rv.Field(k).Interface())
	}
	return out
}

func snake(s string) string {
	var b strings.Builder
	rs := []rune(s)
	for k, r := range rs {
		if unicode.IsUpper(r) {
			// A new word: after a lower-case letter, or an acronym's last capital before one.
			if k > 0 && (unicode.IsLower(rs[k-1]) || (k+1 < len(rs) && unicode.IsLower(rs[k+1]) && unicode.IsUpper(rs[k-1]))) {
				b.WriteByte('_')
			}
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}
