package plugin

import (
	"slices"
	"sync"
)

// lasting are problems logged once while they last: each by a key, with
// its message.
type lasting struct {
	mu   sync.Mutex
	last map[string]string
}

// update makes current the problems in force, and returns the keys of
// those that appeared (or changed message) and of those gone, sorted.
func (l *lasting) update(current map[string]string) (appeared, gone []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for k, msg := range current {
		if prev, ok := l.last[k]; !ok || prev != msg {
			appeared = append(appeared, k)
		}
	}
	for k := range l.last {
		if _, ok := current[k]; !ok {
			gone = append(gone, k)
		}
	}
	l.last = current
	slices.Sort(appeared)
	slices.Sort(gone)
	return appeared, gone
}
