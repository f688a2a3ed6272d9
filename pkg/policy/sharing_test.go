package policy_test

import (
	"slices"
	"testing"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
	"github.com/nri-gpu/nri-gpu/pkg/specs/nvidia"
)

// shared is a policy under which globs are shared replicas ways with
// time-slicing, and every other device is exclusive.
func shared(replicas int, globs ...string) config.Policy {
	return config.Policy{Devices: config.DefaultDevices, Exclusive: true, Sharing: []config.Sharing{
		{Devices: globs, Replicas: replicas, Strategy: config.StrategyTimeSlicing},
	}}
}

func TestSharing(t *testing.T) {
	tests := []struct {
		name   string
		policy config.Policy
		steps  []step
	}{
		{
			name:   "replicas 2: two pods use GPU 0 under exclusive, the third is refused naming both, one removed frees a replica",
			policy: shared(2, "nvidia.com/gpu=*"),
			steps: []step{
				{pod: "a", named: []string{"0"}, want: []string{"0"}},
				{pod: "b", named: []string{"0"}, want: []string{"0"}},
				{pod: "b", named: []string{"0"}, want: []string{"0"}}, // b's next container: one holding
				{pod: "c", named: []string{"0"}, rule: policy.RuleSharing, wantErr: []string{
					`device "nvidia.com/gpu=0" is shared by policy.sharing[0] (replicas 2, timeSlicing) and used by 2 already: pod ns/a, pod ns/b`,
					"free for one more when one of them is removed"}},
				{pod: "a", release: true},
				{pod: "c", named: []string{"0"}, want: []string{"0"}},
			},
		},
		{
			name:   "a GPU's index and UUID are one GPU's replicas",
			policy: shared(2, "nvidia.com/gpu=*"),
			steps: []step{
				{pod: "a", named: []string{"0"}, want: []string{"0"}},
				{pod: "b", named: []string{"GPU-0"}, want: []string{"GPU-0"}},
				{pod: "c", named: []string{"GPU-0"}, rule: policy.RuleSharing, wantErr: []string{"used by 2 already: pod ns/a, pod ns/b"}},
			},
		},
		{
			name:   "devices sharing does not cover stay under exclusive",
			policy: shared(4, "nvidia.com/gpu=0", "nvidia.com/gpu=GPU-0"),
			steps: []step{
				{pod: "a", named: []string{"1"}, want: []string{"1"}},
				{pod: "b", named: []string{"1"}, rule: policy.RuleExclusive, wantErr: []string{`held by pod ns/a`, "policy.exclusive is true"}},
				{pod: "b", named: []string{"0"}, want: []string{"0"}},
				{pod: "c", named: []string{"GPU-0"}, want: []string{"GPU-0"}},
			},
		},
		{
			name:   "a device shared by one name and not by the other is not shared",
			policy: shared(4, "nvidia.com/gpu=0"),
			steps: []step{
				{pod: "a", named: []string{"0"}, want: []string{"0"}},
				{pod: "b", named: []string{"GPU-0"}, rule: policy.RuleExclusive, wantErr: []string{`held by pod ns/a (as "nvidia.com/gpu=0")`}},
			},
		},
		{
			name:   "count requests take the least-used GPU, ties in order, until every replica is used",
			policy: shared(2, "nvidia.com/gpu=*"),
			steps: []step{
				{pod: "a", named: []string{"1"}, want: []string{"1"}},
				{pod: "b", count: 1, want: []string{"0"}},
				{pod: "c", count: 1, want: []string{"2"}},
				{pod: "d", count: 2, want: []string{"3", "0"}}, // 3 unused, then the first of the used once
				{pod: "e", count: 2, want: []string{"1", "2"}},
				{pod: "f", count: 1, want: []string{"3"}},
				{pod: "g", count: 1, rule: policy.RuleCount, wantErr: []string{"asks for 1 nvidia.com/gpu devices, but 0 are free and 4 held"}},
				{pod: "c", release: true},
				{pod: "g", count: 1, want: []string{"2"}},
			},
		},
		{
			name:   "a count grant on a shared GPU is one of its replicas",
			policy: shared(2, "nvidia.com/gpu=*"),
			steps: []step{
				{pod: "a", count: 1, want: []string{"0"}},
				{pod: "b", named: []string{"0"}, want: []string{"0"}},
				{pod: "c", named: []string{"GPU-0"}, rule: policy.RuleSharing, wantErr: []string{"used by 2 already: pod ns/a, pod ns/b"}},
			},
		},
		{
			name:   "one pod never gets one GPU twice: its count passes over what it holds by name",
			policy: shared(4, "nvidia.com/gpu=*"),
			steps: []step{
				{pod: "a", named: []string{"0"}, count: 2, want: []string{"0", "1", "2"}},
				{pod: "b", named: []string{"GPU-3"}, count: 4, rule: policy.RuleCount, wantErr: []string{"asks for 4 nvidia.com/gpu devices, but 3 are free"}},
			},
		},
		{
			name:   "a device the pod holds is not judged again, the others are",
			policy: shared(2, "nvidia.com/gpu=0", "nvidia.com/gpu=GPU-0"),
			steps: []step{
				{pod: "b", named: []string{"1"}, want: []string{"1"}},
				{pod: "a", named: []string{"0"}, want: []string{"0"}},
				{pod: "a", named: []string{"0", "1"}, rule: policy.RuleExclusive, wantErr: []string{`device "nvidia.com/gpu=1" is held by pod ns/b`}},
			},
		},
		{
			name:   "all is not shared with a shared GPU's users",
			policy: func() config.Policy { p := shared(2, "nvidia.com/gpu=*"); p.AllowAll = true; return p }(),
			steps: []step{
				{pod: "a", named: []string{"0"}, want: []string{"0"}},
				{pod: "b", named: []string{"all"}, rule: policy.RuleExclusive, wantErr: []string{`held by pod ns/a`}},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { runSteps(t, policy.New(tc.policy), policy.NewAllocations(), tc.steps) })
	}
}

// TestSharingLowered: a reload that lowers replicas below the pods using
// a GPU keeps what they hold (their next containers get it), reports
// it, and refuses new users until they are under the new replicas.
func TestSharingLowered(t *testing.T) {
	a := policy.NewAllocations()
	runSteps(t, policy.New(shared(3, "nvidia.com/gpu=*")), a, []step{
		{pod: "a", named: []string{"0"}, want: []string{"0"}},
		{pod: "b", named: []string{"0"}, want: []string{"0"}},
		{pod: "c", count: 1, want: []string{"1"}},
		{pod: "d", named: []string{"1"}, want: []string{"1"}},
		{pod: "e", named: []string{"0"}, want: []string{"0"}},
	})
	lower := policy.New(shared(2, "nvidia.com/gpu=*"))
	testutil.ErrorSays(t, a.Check(lower), `3 hold "nvidia.com/gpu=0", which policy.sharing[0] (replicas 2, timeSlicing) lets 2 use at once: pod ns/a, pod ns/b, pod ns/e`)
	runSteps(t, lower, a, []step{
		{pod: "a", named: []string{"0"}, want: []string{"0"}}, // kept
		{pod: "c", count: 1, want: []string{"1"}},             // kept
		{pod: "f", named: []string{"GPU-0"}, rule: policy.RuleSharing, wantErr: []string{"used by 3 already"}},
		{pod: "f", named: []string{"1"}, rule: policy.RuleSharing, wantErr: []string{"used by 2 already: pod ns/c, pod ns/d"}},
		{pod: "a", release: true},
		{pod: "f", named: []string{"0"}, rule: policy.RuleSharing, wantErr: []string{"used by 2 already: pod ns/b, pod ns/e"}},
		{pod: "b", release: true},
		{pod: "f", named: []string{"0"}, want: []string{"0"}},
	})
	if err := a.Check(lower); err != nil {
		t.Errorf("with as many users as replicas: %v", err)
	}
	// Restored users of GPU 0 by index and by UUID, shared by its index
	// only, are within replicas: not reported.
	_, byName := gpus()
	restored := policy.NewAllocations()
	if err := restored.Restore(policy.New(shared(2, "nvidia.com/gpu=0")), []policy.Holding{
		{Pod: pod("x"), Named: []specs.Device{byName["0"]}},
		{Pod: pod("y"), Named: []specs.Device{byName["GPU-0"]}},
	}); err != nil {
		t.Errorf("users of GPU 0 by index and by UUID, shared by index: %v", err)
	}
	// Unshared again: GPU 0's two users are reported, as exclusive says.
	testutil.ErrorSays(t, a.Check(policy.New(config.Policy{Devices: config.DefaultDevices, Exclusive: true})), `pod ns/e ("nvidia.com/gpu=0") and pod ns/f ("nvidia.com/gpu=0") both hold /dev/nvidia0`)
}

// TestSharingMIG: MIG devices are shared as GPUs are; two MIG devices of
// one GPU are two devices, and a shared MIG device does not share its
// parent GPU.
func TestSharingMIG(t *testing.T) {
	whole := byIndex(1)[0]
	p := policy.New(shared(2, "nvidia.com/gpu=*:*"))
	a := policy.NewAllocations()
	ask := func(name string, d specs.Device) error {
		_, err := admit(a, p, pod(name), []specs.Device{d}, 0, policy.Choice{}, nil)
		return err
	}
	for _, who := range []string{"a", "b"} {
		if err := ask(who, mig(0, 1)); err != nil {
			t.Fatalf("pod %s, MIG 0:1 shared 2 ways: %v", who, err)
		}
	}
	wantDenied(t, ask("c", mig(0, 1)), policy.RuleSharing, `device "nvidia.com/gpu=0:1" is shared by policy.sharing[0] (replicas 2, timeSlicing) and used by 2 already: pod ns/a, pod ns/b`)
	if err := ask("c", mig(0, 2)); err != nil {
		t.Errorf("MIG 0:2 beside 0:1: %v", err)
	}
	wantDenied(t, ask("d", whole), policy.RuleExclusive, "held by pod ns/a")

	// A count over MIG devices takes the least used.
	candidates := []specs.Device{mig(0, 1), mig(0, 2), mig(1, 1)}
	g, err := admit(a, p, pod("e"), nil, 2, policy.Choice{Candidates: candidates}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := specs.Names(g.Counted); !slices.Equal(got, []string{"nvidia.com/gpu=1:1", "nvidia.com/gpu=0:2"}) {
		t.Errorf("count of 2 got %v, want 1:1 (unused) then 0:2 (used once; 0:1 is used twice)", got)
	}
}

// TestSharingLeastUsedWithTopology: with the topology known, a count of
// two takes the closest pair among the least-used GPUs.
func TestSharingLeastUsedWithTopology(t *testing.T) {
	candidates := byIndex(4)
	topo := nvidia.Topology{{nvidia.GPUNode(0), nvidia.GPUNode(1)}: nvidia.ScoreNVLink, {nvidia.GPUNode(2), nvidia.GPUNode(3)}: nvidia.ScoreNVLink}
	p := policy.New(shared(2, "nvidia.com/gpu=*"))
	a := policy.NewAllocations()
	if _, err := admit(a, p, pod("a"), []specs.Device{candidates[2]}, 0, policy.Choice{Candidates: candidates}, nil); err != nil {
		t.Fatal(err)
	}
	g, err := admit(a, p, pod("b"), nil, 2, policy.Choice{Candidates: candidates, Links: topo.Links}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := specs.Names(g.Counted); !slices.Equal(got, []string{"nvidia.com/gpu=0", "nvidia.com/gpu=1"}) {
		t.Errorf("got %v, want the unused NVLink pair 0, 1", got)
	}
	// Now 0, 1 and 2 are used once, 3 not: 3 and its NVLink peer 2.
	g, err = admit(a, p, pod("c"), nil, 2, policy.Choice{Candidates: candidates, Links: topo.Links}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := specs.Names(g.Counted); !slices.Equal(got, []string{"nvidia.com/gpu=3", "nvidia.com/gpu=2"}) {
		t.Errorf("got %v, want 3 (unused) with its NVLink peer 2", got)
	}

	// Fresh: 2 and 3 used once, 0 and 1 not: a count of 3 takes 0 and 1
	// and one of the others, and its score counts the pair it must take.
	a = policy.NewAllocations()
	for i, name := range []string{"x", "y"} {
		if _, err := admit(a, p, pod(name), []specs.Device{candidates[2+i]}, 0, policy.Choice{Candidates: candidates}, nil); err != nil {
			t.Fatal(err)
		}
	}
	g, err = admit(a, p, pod("z"), nil, 3, policy.Choice{Candidates: candidates, Links: topo.Links}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := specs.Names(g.Counted); !slices.Equal(got, []string{"nvidia.com/gpu=0", "nvidia.com/gpu=1", "nvidia.com/gpu=2"}) || g.Score != nvidia.ScoreNVLink {
		t.Errorf("a count of 3: %v scoring %d, want 0, 1 (unused) and 2, scoring the 0-1 NVLink (%d)", got, g.Score, nvidia.ScoreNVLink)
	}
}

// TestShareOf: how policy.sharing entries are read: MPS limits default to
// an equal share of compute, time-slicing has none.
func TestShareOf(t *testing.T) {
	p := policy.New(config.Policy{Sharing: []config.Sharing{
		{Devices: []string{"nvidia.com/gpu=0"}, Replicas: 4, Strategy: config.StrategyTimeSlicing},
		{Devices: []string{"nvidia.com/gpu=1"}, Replicas: 3, Strategy: config.StrategyMPS, PinnedMemoryLimit: "1Gi"},
		{Devices: []string{"nvidia.com/gpu=2"}, Replicas: 2, Strategy: config.StrategyMPS, ActiveThreadPercentage: 70},
	}})
	for _, tc := range []struct {
		name string
		want *policy.Share
	}{
		{"nvidia.com/gpu=0", &policy.Share{Index: 0, Replicas: 4, Strategy: config.StrategyTimeSlicing}},
		{"nvidia.com/gpu=1", &policy.Share{Index: 1, Replicas: 3, Strategy: config.StrategyMPS, ActiveThreadPercentage: 33, PinnedMemory: 1 << 30}},
		{"nvidia.com/gpu=2", &policy.Share{Index: 2, Replicas: 2, Strategy: config.StrategyMPS, ActiveThreadPercentage: 70}},
		{"example.com/x=1", nil},
	} {
		got := p.Sharing(specs.Device{Name: tc.name})
		if (got == nil) != (tc.want == nil) || (got != nil && (got.Index != tc.want.Index || got.Replicas != tc.want.Replicas || got.Strategy != tc.want.Strategy ||
			got.ActiveThreadPercentage != tc.want.ActiveThreadPercentage || got.PinnedMemory != tc.want.PinnedMemory)) {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
	if s := p.Sharing(specs.Device{Name: "nvidia.com/gpu=2"}); s.String() != "policy.sharing[2] (replicas 2, mps)" {
		t.Errorf("described as %q", s)
	}
}
