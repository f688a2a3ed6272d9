package policy_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// TestClaimUses: what a container's claims consume of each shared
// device and ask of its sharing: a device in one claim, what that claim
// was allocated; a device in two, the sum of what they were allocated,
// within the tighter of their MPS bounds (an unset bound is no bound);
// every device of the claims, not only the first.
func TestClaimUses(t *testing.T) {
	dev := func(name string, shares int, mem int64, pct int, pinned int64) policy.ClaimDevice {
		return policy.ClaimDevice{Device: specs.Device{Name: name}, Use: policy.Use{Shares: shares, Memory: mem},
			GpuConfig: policy.GpuConfig{ActiveThreadPercentage: pct, PinnedMemory: pinned}}
	}
	for _, tc := range []struct {
		name string
		held []policy.ClaimDevice
		want map[string]policy.ClaimDevice
	}{
		{name: "none", held: nil, want: map[string]policy.ClaimDevice{}},
		{name: "two devices, one claim each",
			held: []policy.ClaimDevice{dev("nvidia.com/gpu=0", 1, 4<<30, 50, 0), dev("nvidia.com/gpu=1", 2, 0, 0, 8<<30)},
			want: map[string]policy.ClaimDevice{"nvidia.com/gpu=0": dev("nvidia.com/gpu=0", 1, 4<<30, 50, 0), "nvidia.com/gpu=1": dev("nvidia.com/gpu=1", 2, 0, 0, 8<<30)}},
		{name: "one device in two claims: summed, the tighter bounds",
			held: []policy.ClaimDevice{dev("nvidia.com/gpu=0", 1, 4<<30, 50, 0), dev("nvidia.com/gpu=0", 1, 2<<30, 30, 8<<30)},
			want: map[string]policy.ClaimDevice{"nvidia.com/gpu=0": dev("nvidia.com/gpu=0", 2, 6<<30, 30, 8<<30)}},
		{name: "one device in two claims, the first tighter",
			held: []policy.ClaimDevice{dev("nvidia.com/gpu=0", 1, 0, 20, 2<<30), dev("nvidia.com/gpu=0", 1, 0, 60, 0)},
			want: map[string]policy.ClaimDevice{"nvidia.com/gpu=0": dev("nvidia.com/gpu=0", 2, 0, 20, 2<<30)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, policy.ClaimUses(tc.held)); diff != "" {
				t.Errorf("ClaimUses (-want +got):\n%s", diff)
			}
		})
	}
}
