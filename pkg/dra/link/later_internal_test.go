package link

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nri-gpu/nri-gpu/pkg/policy"
)

// TestLater: each call of a Later waits until its pool is set and then
// goes to it, with its own context (its deadline); a call whose context
// ends first fails with the context's cause and reaches no pool; only the
// first pool set counts.
func TestLater(t *testing.T) {
	calls := []struct {
		name string
		call func(context.Context, Pool) error
		want string
	}{
		{"devices", func(ctx context.Context, p Pool) error { _, err := p.Devices(ctx); return err }, "devices"},
		{"prepare", func(ctx context.Context, p Pool) error {
			return p.Prepare(ctx, policy.Claim{UID: "c1"}, []Allocated{{CDI: "nvidia.com/gpu=0"}})
		}, "prepare c1 " + fmt.Sprint([]Allocated{{CDI: "nvidia.com/gpu=0"}})},
		{"unprepare", func(ctx context.Context, p Pool) error { return p.Unprepare(ctx, "c1") }, "unprepare c1"},
		{"release", func(ctx context.Context, p Pool) error { return p.Release(ctx, "c1") }, "release c1"},
		{"prepared", func(ctx context.Context, p Pool) error { _, err := p.Prepared(ctx); return err }, "prepared"},
	}
	for _, c := range calls {
		t.Run(c.name+" waits for the pool", func(t *testing.T) {
			later, pool := NewLater(), &fakePool{}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- c.call(ctx, later) }()
			select {
			case err := <-done:
				t.Fatalf("the call returned (%v) before there was a pool", err)
			case <-time.After(50 * time.Millisecond):
			}
			later.Set(pool)
			later.Set(&fakePool{refuse: errors.New("a second pool")})
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(pool.calls, []string{c.want}) {
				t.Errorf("the pool was asked %q, want %q", pool.calls, c.want)
			}
			if d, _ := ctx.Deadline(); len(pool.deadlines) != 1 || !pool.deadlines[0].Equal(d) {
				t.Errorf("the pool saw deadlines %v, want the caller's %v", pool.deadlines, d)
			}
			if err := c.call(ctx, later); err != nil {
				t.Errorf("a call once the pool is set: %v", err)
			}
		})
		t.Run(c.name+" ends with its context", func(t *testing.T) {
			later := NewLater()
			cause := errors.New("kubelet gave up")
			ctx, cancel := context.WithCancelCause(context.Background())
			cancel(cause)
			if err := c.call(ctx, later); !errors.Is(err, cause) {
				t.Errorf("got %v, want the context's cause", err)
			}
		})
	}
}
