package plugin

import (
	"errors"
	"testing"
)

// TestConnectionEnd: what Serve learns when a connection ends, which
// decides whether it returns (a configuration the runtime handed over
// was refused: Serve wraps it in ErrConfig, and a pre-registered
// nri-gpu exits with it) and whether the reconnection backoff starts
// anew (the connection was configured). Each connection starts with
// nothing of the one before.
func TestConnectionEnd(t *testing.T) {
	refused := errors.New("bogus: unknown key")
	for _, tc := range []struct {
		name string
		// before runs on an earlier connection, then this one opens
		// and runs steps.
		before, steps  []error
		wantConfigured bool
		wantRefused    error
	}{
		{name: "never configured (the runtime went away first)"},
		{name: "configured", steps: []error{nil}, wantConfigured: true},
		{name: "its configuration refused", steps: []error{refused}, wantRefused: refused},
		{name: "refused on the connection before, configured on this one", before: []error{refused}, steps: []error{nil}, wantConfigured: true},
		{name: "configured on the connection before, not on this one", before: []error{nil}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c connection
			if tc.before != nil {
				c.opening(nil)
				for _, err := range tc.before {
					c.configured(err)
				}
				c.closed()
			}
			c.opening(nil)
			for _, err := range tc.steps {
				c.configured(err)
			}
			c.synced.Store(true)
			configured, err := c.closed()
			if configured != tc.wantConfigured || !errors.Is(err, tc.wantRefused) || (err == nil) != (tc.wantRefused == nil) {
				t.Errorf("closed() = %v, %v; want %v, %v", configured, err, tc.wantConfigured, tc.wantRefused)
			}
			if c.synced.Load() {
				t.Error("a closed connection is still taken as synchronized")
			}
		})
	}
}
