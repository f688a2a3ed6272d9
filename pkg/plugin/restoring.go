package plugin

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// ErrRestoring is wrapped by the refusal of a door asked before the pool
// holds what the record and the runtime's running containers say is
// held (the first Synchronize): the caller asks again (kubelet does).
var ErrRestoring = errors.New("nri-gpu is restoring what pods hold, until the runtime tells which still run")

// restoreWait bounds how long a call of kubelet (DRA, the device
// plugin's Allocate) waits for the restore: well inside kubelet's own
// bound on a DRA call (45 s).
const restoreWait = 10 * time.Second

// restoration is the pool's restore at start: done once the first
// Synchronize put in the pool what the record and the runtime's
// containers say is held. No door answers from the pool before.
type restoration struct {
	done chan struct{}
	once sync.Once
}

func newRestoration() *restoration { return &restoration{done: make(chan struct{})} }

// finish says the pool is restored; only the first call counts, and
// reports true.
func (r *restoration) finish() (first bool) {
	r.once.Do(func() { close(r.done); first = true })
	return first
}

// restored reports whether the pool is restored.
func (r *restoration) restored() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// await waits until the pool is restored, at most bound (and not past
// ctx), and says why not, wrapping ErrRestoring, when it is not then.
func (r *restoration) await(ctx context.Context, bound time.Duration) error {
	if r.restored() {
		return nil
	}
	t := time.NewTimer(bound)
	defer t.Stop()
	select {
	case <-r.done:
		return nil
	case <-ctx.Done():
	case <-t.C:
	}
	return fmt.Errorf("%w (waited %s): ask again", ErrRestoring, bound)
}

// kubeletBound is how long a call of kubelet waits for the restore: restoreWait,
// or half what its caller left it, whichever is less.
func kubeletBound(ctx context.Context) time.Duration {
	bound := restoreWait
	if dl, ok := ctx.Deadline(); ok {
		bound = min(bound, time.Until(dl)/2)
	}
	return bound
}
