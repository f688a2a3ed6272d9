package policy_test

import (
	"strings"
	"testing"

	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

const gi = int64(1) << 30

// TestCapacity: what a shared GPU offers comes from the entry and, where
// the entry does not say, from the GPU's memory; the default a user
// consumes is the pinned memory limit or an equal share, on the step and
// within the bounds.
func TestCapacity(t *testing.T) {
	const mi = int64(1) << 20
	tests := []struct {
		name   string
		entry  config.Sharing
		memory int64 // the GPU's, as NVML tells it
		want   policy.Capacity
	}{
		{
			name:   "NVML's memory, an equal share by default, 1Mi steps",
			entry:  config.Sharing{Replicas: 4},
			memory: 80 * gi,
			want:   policy.Capacity{Shares: 4, Memory: 80 * gi, Default: 20 * gi, Minimum: mi, Maximum: 80 * gi, Step: mi},
		},
		{
			name:   "memory not on a step is rounded down, and so is the equal share",
			entry:  config.Sharing{Replicas: 3, MemoryRequest: config.MemoryRequest{Step: "1Gi"}},
			memory: 80*gi + 5*mi,
			want:   policy.Capacity{Shares: 3, Memory: 80 * gi, Default: 26 * gi, Minimum: gi, Maximum: 80 * gi, Step: gi},
		},
		{
			name:   "the entry's memory wins over NVML's; pinnedMemoryLimit is the default",
			entry:  config.Sharing{Replicas: 2, Strategy: config.StrategyMPS, Memory: "40Gi", PinnedMemoryLimit: "10Gi"},
			memory: 80 * gi,
			want:   policy.Capacity{Shares: 2, Memory: 40 * gi, Default: 10 * gi, Minimum: mi, Maximum: 40 * gi, Step: mi},
		},
		{
			name:   "the request policy as set",
			entry:  config.Sharing{Replicas: 8, MemoryRequest: config.MemoryRequest{Default: "4Gi", Minimum: "2Gi", Maximum: "16Gi", Step: "2Gi"}},
			memory: 80 * gi,
			want:   policy.Capacity{Shares: 8, Memory: 80 * gi, Default: 4 * gi, Minimum: 2 * gi, Maximum: 16 * gi, Step: 2 * gi},
		},
		{
			name:   "an equal share below the minimum is the minimum",
			entry:  config.Sharing{Replicas: 8, MemoryRequest: config.MemoryRequest{Minimum: "16Gi"}},
			memory: 80 * gi,
			want:   policy.Capacity{Shares: 8, Memory: 80 * gi, Default: 16 * gi, Minimum: 16 * gi, Maximum: 80 * gi, Step: mi},
		},
		{
			name:   "memory of exactly one step: counted",
			entry:  config.Sharing{Replicas: 1, MemoryRequest: config.MemoryRequest{Step: "1Gi"}},
			memory: gi,
			want:   policy.Capacity{Shares: 1, Memory: gi, Default: gi, Minimum: gi, Maximum: gi, Step: gi},
		},
		{
			name:  "memory unknown: shares only",
			entry: config.Sharing{Replicas: 4},
			want:  policy.Capacity{Shares: 4},
		},
		{
			name:  "memory unknown: shares only, and the pinned memory limit bounds MPS clients",
			entry: config.Sharing{Replicas: 4, Strategy: config.StrategyMPS, PinnedMemoryLimit: "10Gi"},
			want:  policy.Capacity{Shares: 4, Default: 10 * gi},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.entry.Devices = []string{"nvidia.com/gpu=*"}
			if tc.entry.Strategy == "" {
				tc.entry.Strategy = config.StrategyTimeSlicing
			}
			cfg := config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices, Sharing: []config.Sharing{tc.entry}}
			p := policy.New(cfg).WithMemory(func(specs.Device) int64 { return tc.memory })
			d := specs.Device{Name: "nvidia.com/gpu=0", Nodes: []string{"/dev/nvidia0"}}
			if got := p.Capacity(p.Sharing(d), d); got != tc.want {
				t.Errorf("Capacity = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestRoomMemoryUnknown: a shared device whose memory is not known offers
// every replica, though its entry bounds each MPS client's memory.
func TestRoomMemoryUnknown(t *testing.T) {
	cfg := config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices,
		Sharing: []config.Sharing{{Devices: []string{"nvidia.com/gpu=*"}, Replicas: 4, Strategy: config.StrategyMPS, PinnedMemoryLimit: "10Gi"}}}
	d := specs.Device{Name: "nvidia.com/gpu=0", Nodes: []string{"/dev/nvidia0"}}
	if got := policy.NewAllocations().Room(policy.New(cfg), d, policy.DevicePlugin, policy.Choice{}); got != 4 {
		t.Errorf("Room = %d, want the 4 replicas", got)
	}
}

// TestConsumableCapacity: claims consume what kube-scheduler allocated
// them, pods (any door) one share and the default memory, all against
// one GPU's shares and memory; what does not fit is refused naming what
// is left and what was needed, and Room tells each door how many more
// default users fit.
func TestConsumableCapacity(t *testing.T) {
	_, byName := gpus()
	gpu0 := byName["0"]
	cfg := config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices, Exclusive: true, Sharing: []config.Sharing{
		{Devices: []string{"nvidia.com/gpu=0"}, Replicas: 4, Strategy: config.StrategyMPS},
	}}
	p := gpuPolicy(cfg).WithMemory(func(d specs.Device) int64 {
		if d.Same(gpu0) {
			return 80 * gi
		}
		return 0
	})
	a := policy.NewAllocations()
	claim := func(name string, use policy.Use) error {
		_, err := a.AdmitClaim(p, policy.Claim{UID: "uid-" + name, Namespace: "ns", Name: name, Pods: []policy.PodName{{Namespace: "ns", Name: name}}},
			claimAsked([]policy.ClaimDevice{{Device: gpu0, Requests: []string{"gpu"}, Use: use}}), policy.Choice{})
		return err
	}
	room := func(door policy.Door) int { return a.Room(p, gpu0, door, policy.Choice{}) }

	// A claim of 50Gi and one share: 30Gi left, one default user (20Gi).
	if err := claim("big", policy.Use{Shares: 1, Memory: 50 * gi}); err != nil {
		t.Fatalf("claim of 50Gi of 80Gi: %v", err)
	}
	if got := room(policy.NRI); got != 1 {
		t.Errorf("room for pods beside a 50Gi claim = %d, want 1 (30Gi left, 20Gi each)", got)
	}
	if got := room(policy.DRA); got != 4 {
		t.Errorf("room for claims = %d, want 4 (kube-scheduler counts the claims)", got)
	}
	if _, err := admit(a, p, pod("a"), []specs.Device{gpu0}, 0, policy.Choice{}, nil); err != nil {
		t.Fatalf("pod beside a 50Gi claim: %v", err)
	}
	// kube-scheduler is offered what the pod leaves; it counts the claims.
	want := policy.Capacity{Shares: 3, Memory: 60 * gi, Default: 20 * gi, Minimum: 1 << 20, Maximum: 60 * gi, Step: 1 << 20}
	if got, ok := a.Offer(p, gpu0, policy.DRA); !ok || got != want {
		t.Errorf("offered to claims beside pod a: %+v, %v; want %+v", got, ok, want)
	}
	if _, ok := a.Offer(p, byName["1"], policy.DRA); ok {
		t.Error("GPU 1, not shared, offered capacity")
	}
	_, err := admit(a, p, pod("b"), []specs.Device{gpu0}, 0, policy.Choice{}, nil)
	wantDenied(t, err, policy.RuleSharing, `device "nvidia.com/gpu=0" is shared by policy.sharing[0] (replicas 4, mps) and used by 2 already: claim ns/big of pod ns/big, pod ns/a`,
		"it has 2 shares and 10Gi of memory left, and 1 share and 20Gi of memory is needed")
	// A claim that fits in what is left, and one that does not.
	if err := claim("small", policy.Use{Shares: 1, Memory: 10 * gi}); err != nil {
		t.Fatalf("claim of the last 10Gi: %v", err)
	}
	err = claim("more", policy.Use{Shares: 1, Memory: 1 << 20})
	wantDenied(t, err, policy.RuleSharing, "claim ns/more", "1 share left", "and 1 share and 1Mi of memory is needed")
	// Three shares asked where two are left.
	a.ReleaseClaim("uid-small")
	err = claim("three", policy.Use{Shares: 3, Memory: gi})
	wantDenied(t, err, policy.RuleSharing, "it has 2 shares and 10Gi of memory left, and 3 shares and 1Gi of memory is needed")
	// A claim without an amount (allocated before the device offered
	// capacity, or of an older record) is one share and the default.
	a.ReleaseClaim("uid-big")
	if err := claim("plain", policy.Use{}); err != nil {
		t.Fatalf("claim without an amount: %v", err)
	}
	if got := room(policy.NRI); got != 2 {
		t.Errorf("room beside a pod and a default claim = %d, want 2", got)
	}
	if got := strings.Join(a.Users(gpu0), ", "); got != "claim ns/plain of pod ns/plain, pod ns/a" {
		t.Errorf("users = %s", got)
	}
	// Claims are offered what pods leave; when that is less than one
	// user's default, nothing.
	for _, name := range []string{"c", "d"} {
		if _, err := admit(a, p, pod(name), []specs.Device{gpu0}, 0, policy.Choice{}, nil); err != nil {
			t.Fatalf("pod %s: %v", name, err)
		}
	}
	want = policy.Capacity{Shares: 1, Memory: 20 * gi, Default: 20 * gi, Minimum: 1 << 20, Maximum: 20 * gi, Step: 1 << 20}
	if got, ok := a.Offer(p, gpu0, policy.DRA); !ok || got != want {
		t.Errorf("offered to claims beside 3 pods: %+v, %v; want %+v", got, ok, want)
	}
	a.ReleaseClaim("uid-plain")
	if _, err := admit(a, p, pod("e"), []specs.Device{gpu0}, 0, policy.Choice{}, nil); err != nil {
		t.Fatalf("pod e: %v", err)
	}
	if got, ok := a.Offer(p, gpu0, policy.DRA); ok {
		t.Errorf("offered %+v to claims beside 4 pods that use every share", got)
	}
}

// TestAsked: what a claim's GpuConfig asks of its device's sharing is
// held to the operator's policy.sharing: MPS never where time-slicing
// shares the GPU, time-slicing never where MPS does, bounds no higher
// than its allocation allows (the entry's compute share per share, its
// memory; on a GPU policy.sharing leaves unshared, the claim's whole,
// the GPU's memory, where known).
func TestAsked(t *testing.T) {
	_, byName := gpus()
	cfg := config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices, Exclusive: true, Sharing: []config.Sharing{
		{Devices: []string{"nvidia.com/gpu=0"}, Replicas: 2, Strategy: config.StrategyMPS, Memory: "80Gi"},
		{Devices: []string{"nvidia.com/gpu=1"}, Replicas: 2, Strategy: config.StrategyTimeSlicing},
	}}
	mps, ts := config.StrategyMPS, config.StrategyTimeSlicing
	tests := []struct {
		name    string
		device  string
		use     policy.Use
		asked   policy.GpuConfig
		wantErr []string
	}{
		{"MPS where time-slicing shares it", "1", policy.Use{}, policy.GpuConfig{Strategy: mps},
			[]string{`device "nvidia.com/gpu=1" is shared by policy.sharing[1] (replicas 2, timeSlicing), and the claim's GpuConfig asks for MPS, whose bounds its other users, not clients of a daemon, would not keep`}},
		{"MPS on a whole GPU, more memory than it has", "2", policy.Use{}, policy.GpuConfig{Strategy: mps, ActiveThreadPercentage: 100, PinnedMemory: 81 * gi},
			[]string{`device "nvidia.com/gpu=2" is not shared, and the claim's GpuConfig asks for 81Gi of pinned memory, more than the 80Gi it is allowed`}},
		{"MPS on a whole GPU, as published", "2", policy.Use{}, policy.GpuConfig{Strategy: mps, ActiveThreadPercentage: 50, PinnedMemory: 10 * gi}, nil},
		{"MPS on a whole GPU, all of it", "2", policy.Use{}, policy.GpuConfig{Strategy: mps, ActiveThreadPercentage: 100, PinnedMemory: 80 * gi}, nil},
		{"MPS on a whole GPU whose memory is not known: nothing to bound it by", "3", policy.Use{}, policy.GpuConfig{Strategy: mps, ActiveThreadPercentage: 100, PinnedMemory: 100 * gi}, nil},
		{"time-slicing where MPS shares it", "0", policy.Use{}, policy.GpuConfig{Strategy: ts},
			[]string{"asks for time-slicing, which would take its clients out of the MPS daemon's bounds"}},
		{"more compute than a share", "0", policy.Use{}, policy.GpuConfig{Strategy: mps, ActiveThreadPercentage: 60},
			[]string{"asks for 60% of compute, more than the 50% it is allowed"}},
		{"more memory than allocated", "0", policy.Use{Shares: 1, Memory: 30 * gi}, policy.GpuConfig{Strategy: mps, PinnedMemory: 31 * gi},
			[]string{"asks for 31Gi of pinned memory, more than the 30Gi it is allowed"}},
		{"as published, within a default share", "0", policy.Use{}, policy.GpuConfig{Strategy: mps, ActiveThreadPercentage: 50, PinnedMemory: 10 * gi}, nil},
		{"the whole GPU's compute for both shares", "0", policy.Use{Shares: 2}, policy.GpuConfig{Strategy: mps, ActiveThreadPercentage: 100}, nil},
		{"time-slicing where nothing else shares it", "2", policy.Use{}, policy.GpuConfig{Strategy: ts}, nil},
		{"time-slicing where time-slicing shares it", "1", policy.Use{}, policy.GpuConfig{Strategy: ts}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// GPU 3's memory is not known; the driver bounds every
			// holder's (memoryLimits' own test: TestClaimMemoryAsked).
			p := gpuPolicy(cfg).WithMemory(func(d specs.Device) int64 {
				if d.Nodes[0] == "/dev/nvidia3" {
					return 0
				}
				return 80 * gi
			}).WithBounding(func(specs.Device) error { return nil })
			a := policy.NewAllocations()
			_, err := a.AdmitClaim(p, policy.Claim{UID: "u", Namespace: "ns", Name: "c"},
				claimAsked([]policy.ClaimDevice{{Device: byName[tc.device], Use: tc.use, GpuConfig: tc.asked}}), policy.Choice{})
			if tc.wantErr == nil {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			wantDenied(t, err, policy.RuleSharing, append([]string{"claim ns/c: "}, tc.wantErr...)...)
		})
	}
}
