package specs

import (
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/fsnotify/fsnotify"
)

// watcher watches the spec directories that exist.
type watcher struct {
	dirs    []string
	w       *fsnotify.Watcher // nil without inotify: polls and resyncs still load changes
	watched map[string]bool
}

// newWatcher starts watching the spec directories that exist.
func newWatcher(dirs []string) *watcher {
	w := &watcher{dirs: dirs, watched: map[string]bool{}}
	if fw, err := fsnotify.NewWatcher(); err == nil {
		w.w = fw
	}
	w.track()
	return w
}

// track watches the spec directories that exist now and reports whether
// any appeared or went.
func (w *watcher) track() bool {
	changed := false
	for _, dir := range w.dirs {
		fi, err := os.Stat(dir)
		exists := err == nil && fi.IsDir()
		switch {
		case exists && !w.watched[dir]:
			if w.w == nil || w.w.Add(dir) == nil {
				w.watched[dir] = true
				changed = true
			}
		case !exists && w.watched[dir]:
			if w.w != nil {
				_ = w.w.Remove(dir)
			}
			w.watched[dir] = false
			changed = true
		}
	}
	return changed
}

// watch loads the specs again whenever a spec directory changes, a missing
// one appears, or ResyncInterval passes, until Close.
func (r *Registry) watch(wt *watcher) {
	defer close(r.done)
	w, watched, track := wt.w, wt.watched, wt.track
	if w != nil {
		defer w.Close()
	}

	var events <-chan fsnotify.Event
	var errs <-chan error
	if w != nil {
		events, errs = w.Events, w.Errors
	}
	poll := time.NewTicker(PollInterval)
	defer poll.Stop()
	resync := time.NewTicker(ResyncInterval)
	defer resync.Stop()
	var due <-chan time.Time
	for {
		select {
		case <-r.stop:
			return
		case ev, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			if relevant(ev, r.dirs) {
				if slices.Contains(r.dirs, ev.Name) && ev.Op&(fsnotify.Remove|fsnotify.Rename) != 0 {
					watched[ev.Name] = false
				}
				due = time.After(settle)
			}
		case <-errs:
			due = time.After(settle)
		case <-poll.C:
			if track() {
				due = time.After(0)
			}
		case <-resync.C:
			due = time.After(0)
		case <-due:
			due = nil
			r.reload()
		}
	}
}

// relevant reports whether an event can change the specs: a spec file
// (.json or .yaml) or a spec directory itself changed.
func relevant(ev fsnotify.Event, dirs []string) bool {
	if slices.Contains(dirs, ev.Name) {
		return true
	}
	switch filepath.Ext(ev.Name) {
	case ".json", ".yaml":
		return true
	}
	return false
}
