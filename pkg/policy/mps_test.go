package policy_test

import (
	"errors"
	"testing"

	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// TestMPSOf: a device is shared with MPS by the policy.sharing entry that
// shares it with mps (its clients bound to the entry's compute share and
// an equal share of memory, or its pinnedMemoryLimit), by a prepared
// claim that holds a GPU no entry shares and asked for MPS (bound to
// what it asked, else the whole GPU), or not at all (time-slicing, an
// unshared GPU no claim asked MPS of); an entry whose clients' memory
// cannot be told is refused.
func TestMPSOf(t *testing.T) {
	_, byName := gpus()
	gpu0, gpu1 := byName["0"], byName["1"]
	mpsEntry := config.Sharing{Devices: []string{"nvidia.com/gpu=0"}, Replicas: 4, Strategy: config.StrategyMPS}
	claimOf := func(asked policy.GpuConfig) []policy.ClaimHolding {
		return []policy.ClaimHolding{{Claim: policy.Claim{UID: "u", Namespace: "ns", Name: "c"},
			Devices: []policy.ClaimDevice{{Device: gpu1, GpuConfig: asked}}}}
	}
	for _, tc := range []struct {
		name          string
		entry         config.Sharing
		device        specs.Device
		claims        []policy.ClaimHolding
		memory        int64
		want          *policy.MPS // By, Threads, Memory compared
		share, claim  bool
		wantUnbounded bool
	}{
		{name: "shared by an mps entry", entry: mpsEntry, device: gpu0, memory: 80 * gi,
			want: &policy.MPS{By: "policy.sharing[0] (replicas 4, mps)", Threads: 25, Memory: 20 * gi}, share: true},
		{name: "its pinnedMemoryLimit", entry: func() config.Sharing { e := mpsEntry; e.PinnedMemoryLimit = "8Gi"; return e }(), device: gpu0,
			want: &policy.MPS{By: "policy.sharing[0] (replicas 4, mps)", Threads: 25, Memory: 8 * gi}, share: true},
		{name: "memory unknown", entry: mpsEntry, device: gpu0, wantUnbounded: true},
		{name: "time-slicing", entry: config.Sharing{Devices: []string{"nvidia.com/gpu=0"}, Replicas: 4, Strategy: config.StrategyTimeSlicing}, device: gpu0, memory: 80 * gi},
		{name: "unshared, no claim", entry: mpsEntry, device: gpu1, memory: 80 * gi},
		{name: "a claim's own, its bounds", entry: mpsEntry, device: gpu1, memory: 80 * gi,
			claims: claimOf(policy.GpuConfig{Strategy: config.StrategyMPS, ActiveThreadPercentage: 30, PinnedMemory: 10 * gi}),
			want:   &policy.MPS{By: policy.ClaimsOwnMPS, Threads: 30, Memory: 10 * gi}, claim: true},
		{name: "a claim's own, the whole GPU", entry: mpsEntry, device: byName["GPU-1"], memory: 80 * gi,
			claims: claimOf(policy.GpuConfig{Strategy: config.StrategyMPS}),
			want:   &policy.MPS{By: policy.ClaimsOwnMPS, Threads: 100, Memory: 80 * gi}, claim: true},
		{name: "a claim's, time-sliced", entry: mpsEntry, device: gpu1, memory: 80 * gi,
			claims: claimOf(policy.GpuConfig{Strategy: config.StrategyTimeSlicing})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := gpuPolicy(config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices, Sharing: []config.Sharing{tc.entry}}).
				WithMemory(func(specs.Device) int64 { return tc.memory })
			got, err := p.MPSOf(tc.device, tc.claims)
			if tc.wantUnbounded {
				if !errors.Is(err, policy.ErrMPSUnbounded) || got != nil {
					t.Fatalf("%+v, %v; want ErrMPSUnbounded", got, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (got == nil) != (tc.want == nil) {
				t.Fatalf("%+v, want %+v", got, tc.want)
			}
			if got == nil {
				return
			}
			if got.By != tc.want.By || got.Threads != tc.want.Threads || got.Memory != tc.want.Memory || (got.Entry != nil) != tc.share || (got.Claim != nil) != tc.claim {
				t.Errorf("%+v, want %+v (entry %v, claim %v)", got, tc.want, tc.share, tc.claim)
			}
		})
	}
}

// TestMPSClient: a client of a daemon a policy.sharing entry runs takes
// the entry's compute share for each share it consumes and the memory it
// was allocated (a pod's: the defaults), within what its claim asked; a
// client of a claim's own daemon has the daemon's defaults.
func TestMPSClient(t *testing.T) {
	_, byName := gpus()
	gpu0 := byName["0"]
	p := gpuPolicy(config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices,
		Sharing: []config.Sharing{{Devices: []string{"nvidia.com/gpu=0"}, Replicas: 4, Strategy: config.StrategyMPS}}}).
		WithMemory(func(specs.Device) int64 { return 80 * gi })
	shared, err := p.MPSOf(gpu0, nil)
	if err != nil || shared == nil {
		t.Fatal(shared, err)
	}
	for _, tc := range []struct {
		name          string
		m             *policy.MPS
		use           policy.ClaimDevice
		threads       int
		memory        int64
		ownOfTheClaim bool
	}{
		{name: "a pod", m: shared, threads: 25, memory: 20 * gi},
		{name: "a claim of two shares and 30Gi", m: shared, use: policy.ClaimDevice{Use: policy.Use{Shares: 2, Memory: 30 * gi}}, threads: 50, memory: 30 * gi},
		{name: "within what it asked", m: shared, use: policy.ClaimDevice{Use: policy.Use{Shares: 2, Memory: 30 * gi},
			GpuConfig: policy.GpuConfig{ActiveThreadPercentage: 40, PinnedMemory: 10 * gi}}, threads: 40, memory: 10 * gi},
		{name: "asking more than allocated gets the allocation", m: shared, use: policy.ClaimDevice{Use: policy.Use{Shares: 1},
			GpuConfig: policy.GpuConfig{ActiveThreadPercentage: 90, PinnedMemory: 70 * gi}}, threads: 25, memory: 20 * gi},
		{name: "a claim's own daemon", m: &policy.MPS{Threads: 60, Memory: 5 * gi}, use: policy.ClaimDevice{Use: policy.Use{Shares: 3}}, threads: 60, memory: 5 * gi},
	} {
		t.Run(tc.name, func(t *testing.T) {
			threads, memory := p.Client(tc.m, gpu0, tc.use)
			if threads != tc.threads || memory != tc.memory {
				t.Errorf("bounds %d%%, %d; want %d%%, %d", threads, memory, tc.threads, tc.memory)
			}
		})
	}
}

// TestOwnMPS: a claim's device asks for MPS of its own where its
// GpuConfig asks for MPS and no policy.sharing entry shares the GPU.
func TestOwnMPS(t *testing.T) {
	_, byName := gpus()
	p := gpuPolicy(config.Policy{Sharing: []config.Sharing{{Devices: []string{"nvidia.com/gpu=0"}, Replicas: 2, Strategy: config.StrategyMPS}}})
	for _, tc := range []struct {
		gpu      string
		strategy config.Strategy
		want     bool
	}{{"1", config.StrategyMPS, true}, {"1", config.StrategyTimeSlicing, false}, {"1", "", false}, {"0", config.StrategyMPS, false}, {"GPU-0", config.StrategyMPS, false}} {
		if got := p.OwnMPS(policy.ClaimDevice{Device: byName[tc.gpu], GpuConfig: policy.GpuConfig{Strategy: tc.strategy}}); got != tc.want {
			t.Errorf("GPU %s asking %q: %v, want %v", tc.gpu, tc.strategy, got, tc.want)
		}
	}
}
