package policy

import (
	"testing"

	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// TestReleaseIfOneStep: ReleaseIf asks ended under the pool's lock, so
// that the check that a pod ended and its release are one step no
// admission comes between; the pod is released only when ended says so.
func TestReleaseIfOneStep(t *testing.T) {
	a := NewAllocations()
	a.pods["p"] = &holding{pod: Pod{ID: "p"}, named: []specs.Device{{Name: "nvidia.com/gpu=0"}}}
	for _, ends := range []bool{false, true} {
		locked := false
		names, said := a.ReleaseIf("p", func() bool {
			locked = !a.mu.TryLock()
			if !locked {
				a.mu.Unlock()
			}
			return ends
		})
		if !locked {
			t.Errorf("ended %v: asked outside the pool's lock", ends)
		}
		_, held := a.pods["p"]
		if said != ends || held == ends || (len(names) > 0) != ends {
			t.Errorf("ended %v: said %v, released %v, still held %v", ends, said, names, held)
		}
	}
}
