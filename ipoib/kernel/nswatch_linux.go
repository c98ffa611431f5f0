//go:build linux

package kernel

import (
	"log"
	"path/filepath"
	"sync"

	"github.com/fsnotify/fsnotify"
)

// netnsDir is where ip netns (and vishvananda/netns) keep named namespaces.
const netnsDir = "/run/netns"

// The namespace watch: an inotify watch of /run/netns while devices of this process
// hold a namespace (its worker runs), so that `ip netns del` of one is said when it
// happens, not at the next create_child. fsnotify rather than raw inotify: it owns
// the event buffer parsing and the close of a blocked read.
var nsWatch struct {
	mu     sync.Mutex
	onGone map[int]func(name string)
	next   int
	w      *fsnotify.Watcher // under workersMu
}

// OnNamespaceGone calls fn (from the watch's goroutine) with the name of each named
// network namespace deleted while devices of this process live in it, until the
// returned function is called. The devices live on in the namespace, where the name
// no longer leads, and Open in that name fails with ErrNamespaceGone until they are
// closed.
func OnNamespaceGone(fn func(name string)) (stop func()) {
	nsWatch.mu.Lock()
	defer nsWatch.mu.Unlock()
	if nsWatch.onGone == nil {
		nsWatch.onGone = map[int]func(string){}
	}
	id := nsWatch.next
	nsWatch.next++
	nsWatch.onGone[id] = fn
	return func() {
		nsWatch.mu.Lock()
		defer nsWatch.mu.Unlock()
		delete(nsWatch.onGone, id)
	}
}

// startNSWatchLocked starts the watch with the first namespace worker. Called with
// workersMu held. A failure is logged: the watch only says sooner what the next Open
// would.
func startNSWatchLocked() {
	if nsWatch.w != nil {
		return
	}
	w, err := fsnotify.NewWatcher()
	if err == nil {
		if err = w.Add(netnsDir); err != nil {
			w.Close()
		}
	}
	if err != nil {
		log.Printf("watch %s: %v (a deleted namespace is noticed at the next device made in it)", netnsDir, err)
		return
	}
	nsWatch.w = w
	go nsWatchLoop(w)
}

// stopNSWatchLocked ends the watch with the last worker. Called with workersMu held;
// the close goes on its own goroutine, since the watch's loop may be waiting for
// workersMu to look a name up.
func stopNSWatchLocked() {
	if w := nsWatch.w; w != nil {
		nsWatch.w = nil
		go w.Close()
	}
}

func nsWatchLoop(w *fsnotify.Watcher) {
	for {
		select {
		case ev, ok := <-w.Events:
			if !ok {
				return
			}
			if !ev.Has(fsnotify.Remove) && !ev.Has(fsnotify.Rename) {
				continue
			}
			dir := filepath.Clean(ev.Name) == netnsDir
			workersMu.Lock()
			current := nsWatch.w == w // not one closing while its successor runs
			if current && dir {
				// The directory itself went: the watch with it. The next namespace
				// worker starts another.
				nsWatch.w = nil
				go w.Close()
			}
			workersMu.Unlock()
			switch {
			case !current:
			case dir:
				log.Printf("watch %s: the directory was removed; a deleted namespace is noticed at the next device made in it", netnsDir)
			default:
				namespaceRemoved(filepath.Base(ev.Name))
			}
		case err, ok := <-w.Errors:
			if !ok {
				return
			}
			log.Printf("watch %s: %v", netnsDir, err)
		}
	}
}

// namespaceRemoved tells the OnNamespaceGone callbacks when name stood for a namespace
// devices of this process are in.
func namespaceRemoved(name string) {
	nsMu.Lock()
	seen, ok := nsSeen[name]
	nsMu.Unlock()
	if !ok || !held(seen) {
		return
	}
	nsWatch.mu.Lock()
	fns := make([]func(string), 0, len(nsWatch.onGone))
	for _, fn := range nsWatch.onGone {
		fns = append(fns, fn)
	}
	nsWatch.mu.Unlock()
	for _, fn := range fns {
		fn(name)
	}
}
