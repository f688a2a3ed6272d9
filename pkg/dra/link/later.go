package link

import (
	"context"
	"sync"

	"github.com/nri-gpu/nri-gpu/pkg/policy"
)

var _ Pool = (*Later)(nil)

// Later is a Pool whose calls wait until Set gives the pool they go to:
// the pool of a DRA driver started before its nri-gpu holds the record
// (kubelet's rolling update of a DRA driver: the new driver registers
// while the nri-gpu it replaces still serves, and kubelet may ask the new
// one at once). A call waits until then or until its ctx is done
// (kubelet's calls carry its deadline, and kubelet asks again).
type Later struct {
	set  chan struct{}
	once sync.Once
	pool Pool
}

// NewLater returns a Later with no pool yet.
func NewLater() *Later { return &Later{set: make(chan struct{})} }

// Set gives the pool the calls go to; only the first Set counts.
func (l *Later) Set(pool Pool) {
	l.once.Do(func() {
		l.pool = pool
		close(l.set)
	})
}

func (l *Later) wait(ctx context.Context) (Pool, error) {
	select {
	case <-l.set:
		return l.pool, nil
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

// Devices is the pool's, once there is one.
func (l *Later) Devices(ctx context.Context) ([]Device, error) {
	p, err := l.wait(ctx)
	if err != nil {
		return nil, err
	}
	return p.Devices(ctx)
}

// Prepare is the pool's, once there is one.
func (l *Later) Prepare(ctx context.Context, claim policy.Claim, devices []Allocated) error {
	p, err := l.wait(ctx)
	if err != nil {
		return err
	}
	return p.Prepare(ctx, claim, devices)
}

// Unprepare is the pool's, once there is one.
func (l *Later) Unprepare(ctx context.Context, uid string) error {
	p, err := l.wait(ctx)
	if err != nil {
		return err
	}
	return p.Unprepare(ctx, uid)
}

// Release is the pool's, once there is one.
func (l *Later) Release(ctx context.Context, uid string) error {
	p, err := l.wait(ctx)
	if err != nil {
		return err
	}
	return p.Release(ctx, uid)
}

// Prepared is the pool's, once there is one.
func (l *Later) Prepared(ctx context.Context) ([]policy.Claim, error) {
	p, err := l.wait(ctx)
	if err != nil {
		return nil, err
	}
	return p.Prepared(ctx)
}
