package plugin

import (
	"context"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
)

// TestRuntimePatience: a request's waits are bounded by half what the
// runtime said it waits at Configure; a runtime that said nothing, or
// nothing usable (an NRI older than the field reports 0), is taken to
// wait NRI's default, containerd's 2 s; a deadline of the request's own
// that comes sooner bounds them instead.
func TestRuntimePatience(t *testing.T) {
	for _, tc := range []struct {
		name     string
		reported runtimeSide
		deadline time.Duration // 0: the request has none
		want     time.Duration
	}{
		{"not connected", nil, 0, api.DefaultPluginRequestTimeout / 2},
		{"the runtime says 6 s", said{6 * time.Second}, 0, 3 * time.Second},
		{"the runtime says 600 ms", said{600 * time.Millisecond}, 0, 300 * time.Millisecond},
		{"the runtime says 0", said{0}, 0, api.DefaultPluginRequestTimeout / 2},
		{"the runtime says less than 0", said{-time.Second}, 0, api.DefaultPluginRequestTimeout / 2},
		{"a sooner deadline", said{6 * time.Second}, time.Second, 500 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &Plugin{}
			p.conn.side = tc.reported
			ctx := context.Background()
			if tc.deadline > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.deadline)
				defer cancel()
			}
			got := p.waitBound(ctx)
			if got > tc.want || got < tc.want-50*time.Millisecond {
				t.Errorf("waits bounded by %s, want %s", got, tc.want)
			}
		})
	}
}

// said is a runtime that said it waits timeout.
type said struct{ timeout time.Duration }

func (s said) RuntimeNRIVersion() string     { return "v0.12.0" }
func (s said) RequestTimeout() time.Duration { return s.timeout }
