package deviceplugin

import (
	"context"
	"sync"
)

var (
	_ Source    = (*Later)(nil)
	_ Restoring = (*Later)(nil)
	_ Allotting = (*Later)(nil)
)

// Later is a Source that has no devices until Set gives the source it
// asks: a device plugin made before the plugin whose view it serves
// (which tells the device plugin of every change, from then on).
type Later struct {
	mu  sync.Mutex
	src Source
}

// Set gives the source asked from now on; only the first Set counts.
func (l *Later) Set(src Source) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.src == nil {
		l.src = src
	}
}

func (l *Later) source() Source {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.src
}

// Devices are the source's, none before it is set.
func (l *Later) Devices() []Device {
	if src := l.source(); src != nil {
		return src.Devices()
	}
	return nil
}

// Preferred is the source's choice, before it is set mustInclude and
// then the first of available (kubelet's own order).
func (l *Later) Preferred(available, mustInclude []string, size int) []string {
	if src := l.source(); src != nil {
		return src.Preferred(available, mustInclude, size)
	}
	return kubeletOrder(available, mustInclude, size)
}

// Allot is the source's where it allots; nil otherwise (before it is
// set, no ID is known: Allocate refuses them first).
func (l *Later) Allot(ctx context.Context, ids []string) error {
	if a, ok := l.source().(Allotting); ok {
		return a.Allot(ctx, ids)
	}
	return nil
}

// Restored is the source's, once it is set and when it has one; closed
// otherwise.
func (l *Later) Restored() <-chan struct{} {
	if r, ok := l.source().(Restoring); ok {
		return r.Restored()
	}
	return closed
}

// closed is a channel closed from the start.
var closed = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()
