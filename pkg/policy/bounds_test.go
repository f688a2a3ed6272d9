package policy_test

import (
	"errors"
	"testing"

	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// TestMemoryBound: the driver bounds each holder of a GPU an entry
// shares with its memory counted; where it cannot, a time-sliced GPU's
// holders are bounded by nothing else (why says so), while MPS bounds
// its clients itself: its driver bound is a second one, set where the
// driver can, never a reason to refuse. A GPU held whole, or one whose
// memory is not counted, needs none.
func TestMemoryBound(t *testing.T) {
	_, byName := gpus()
	cgroupV1 := errors.New("/sys/fs/cgroup is not cgroup v2")
	for _, tc := range []struct {
		name     string
		strategy config.Strategy
		memory   string
		cannot   error
		counted  bool
		why      bool
	}{
		{"time-slicing", config.StrategyTimeSlicing, "80Gi", nil, true, false},
		{"time-slicing, the driver cannot", config.StrategyTimeSlicing, "80Gi", cgroupV1, true, true},
		{"time-slicing, memory not counted", config.StrategyTimeSlicing, "", nil, false, false},
		{"MPS", config.StrategyMPS, "80Gi", nil, true, false},
		{"MPS, the driver cannot", config.StrategyMPS, "80Gi", cgroupV1, false, false},
		{"held whole", "", "", nil, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices}
			if tc.strategy != "" {
				cfg.Sharing = []config.Sharing{{Devices: []string{"nvidia.com/gpu=0"}, Replicas: 4, Strategy: tc.strategy, Memory: tc.memory}}
			}
			p := gpuPolicy(cfg).WithBounding(func(specs.Device) error { return tc.cannot })
			counted, why := p.MemoryBound(byName["0"])
			if counted != tc.counted || (why != nil) != tc.why {
				t.Errorf("MemoryBound = %v, %v; want counted %v, a reason %v", counted, why, tc.counted, tc.why)
			}
			if why != nil && !errors.Is(why, cgroupV1) {
				t.Errorf("MemoryBound says %v, want why the driver cannot (%v)", why, cgroupV1)
			}
		})
	}
}
