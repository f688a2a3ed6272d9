// Package lasting keeps which problems were last told, so that a
// problem seen at every look (a CDI spec that does not parse, a device
// two sharing entries match, an MPS daemon that cannot be bounded) is
// logged once when it appears and once when it is gone.
package lasting

import (
	"slices"
	"sync"
)

// Problems are problems logged once while they last: each by a key,
// with its message. The zero Problems has none.
type Problems struct {
	mu   sync.Mutex
	last map[string]string
}

// Update makes current the problems in force, and returns the keys of
// those that appeared (or changed message) and of those gone, sorted.
func (l *Problems) Update(current map[string]string) (appeared, gone []string) {
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
