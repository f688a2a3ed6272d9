package policy_test

import (
	"errors"
	"slices"
	"strings"
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
	return config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices, Exclusive: true, Sharing: []config.Sharing{
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
			name:   "a GPU shared by its UUID is shared by its index too, whichever name each pod asks by",
			policy: shared(2, "nvidia.com/gpu=GPU-0"),
			steps: []step{
				{pod: "a", named: []string{"0"}, want: []string{"0"}},
				{pod: "b", named: []string{"GPU-0"}, want: []string{"GPU-0"}},
				{pod: "c", named: []string{"0"}, rule: policy.RuleSharing, wantErr: []string{
					`device "nvidia.com/gpu=0" is shared by policy.sharing[0] (replicas 2, timeSlicing) and used by 2 already: pod ns/a, pod ns/b`}},
				{pod: "c", count: 1, want: []string{"1"}}, // GPU 0 has no replica left by either name
			},
		},
		{
			name:   "a pod holding a shared GPU by both its names is one of its users",
			policy: shared(2, "nvidia.com/gpu=0", "nvidia.com/gpu=GPU-0"),
			steps: []step{
				{pod: "a", named: []string{"0", "GPU-0"}, want: []string{"0", "GPU-0"}},
				{pod: "b", named: []string{"0"}, want: []string{"0"}},
				{pod: "c", named: []string{"GPU-0"}, rule: policy.RuleSharing, wantErr: []string{"used by 2 already: pod ns/a, pod ns/b"}},
			},
		},
		{
			name:   "a count grant of a GPU shared by its index is one of its replicas, the UUID asked for after it another",
			policy: shared(2, "nvidia.com/gpu=0"),
			steps: []step{
				{pod: "a", count: 1, want: []string{"0"}},
				{pod: "b", named: []string{"GPU-0"}, want: []string{"GPU-0"}},
				{pod: "c", named: []string{"GPU-0"}, rule: policy.RuleSharing, wantErr: []string{"used by 2 already: pod ns/a, pod ns/b"}},
			},
		},
		{
			name: "what overlaps a shared GPU without being it is never had beside it, exclusive or not; unshared devices overlap as exclusive says",
			policy: config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices, AllowAll: true, Sharing: []config.Sharing{
				{Devices: []string{"nvidia.com/gpu=0"}, Replicas: 2, Strategy: config.StrategyTimeSlicing}}},
			steps: []step{
				{pod: "a", named: []string{"0"}, want: []string{"0"}},
				{pod: "b", named: []string{"1"}, want: []string{"1"}},
				{pod: "c", named: []string{"all"}, rule: policy.RuleSharing, wantErr: []string{
					`device "nvidia.com/gpu=all" overlaps "nvidia.com/gpu=0", held by pod ns/a, and policy.sharing[0] (replicas 2, timeSlicing) shares one of them`,
					"free again when pod ns/a is removed"}},
				{pod: "c", named: []string{"GPU-1"}, want: []string{"GPU-1"}}, // not shared, not exclusive
				{pod: "a", release: true},
				{pod: "d", named: []string{"all"}, want: []string{"all"}},
				{pod: "e", named: []string{"GPU-0"}, rule: policy.RuleSharing, wantErr: []string{
					`device "nvidia.com/gpu=GPU-0" overlaps "nvidia.com/gpu=all", held by pod ns/d`}},
			},
		},
		{
			name: "two entries that match one GPU by two names: refused, naming both",
			policy: config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices, Sharing: []config.Sharing{
				{Devices: []string{"nvidia.com/gpu=GPU-*"}, Replicas: 2, Strategy: config.StrategyMPS},
				{Devices: []string{"nvidia.com/gpu=1"}, Replicas: 4, Strategy: config.StrategyTimeSlicing}}},
			steps: []step{
				{pod: "a", named: []string{"0"}, want: []string{"0"}},
				{pod: "b", named: []string{"1"}, rule: policy.RuleSharing, wantErr: []string{
					`device "nvidia.com/gpu=1": two policy.sharing entries match one device: policy.sharing[0] matches "nvidia.com/gpu=GPU-1" and policy.sharing[1] matches "nvidia.com/gpu=1"`}},
				{pod: "b", named: []string{"GPU-1"}, rule: policy.RuleSharing, wantErr: []string{"policy.sharing[0]", "policy.sharing[1]"}},
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
		t.Run(tc.name, func(t *testing.T) { runSteps(t, gpuPolicy(tc.policy), policy.NewAllocations(), tc.steps) })
	}
}

// TestCheckSharing: two entries that match one device, by one name or by
// two names of its hardware, are found, once per device, naming both;
// entries that match apart are not.
func TestCheckSharing(t *testing.T) {
	candidates, byName := gpus()
	devs := append(candidates, byName["all"])
	entry := func(replicas int, globs ...string) config.Sharing {
		return config.Sharing{Devices: globs, Replicas: replicas, Strategy: config.StrategyTimeSlicing}
	}
	for _, tc := range []struct {
		name    string
		entries []config.Sharing
		want    []string
	}{
		{"apart", []config.Sharing{entry(2, "nvidia.com/gpu=0", "nvidia.com/gpu=GPU-0"), entry(3, "nvidia.com/gpu=1", "nvidia.com/gpu=GPU-1")}, nil},
		{"one name twice", []config.Sharing{entry(2, "nvidia.com/gpu=0"), entry(3, "nvidia.com/gpu=*")}, []string{
			`policy.sharing[0] matches "nvidia.com/gpu=0" and policy.sharing[1] matches "nvidia.com/gpu=0"`,
			// every other GPU's names are the second entry's only
		}},
		{"index and UUID", []config.Sharing{entry(2, "nvidia.com/gpu=GPU-2"), entry(3, "nvidia.com/gpu=2")}, []string{
			`policy.sharing[0] matches "nvidia.com/gpu=GPU-2" and policy.sharing[1] matches "nvidia.com/gpu=2"`,
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := knowing(policy.New(config.Policy{Namespaces: []string{"*"}, Sharing: tc.entries}), devs).CheckSharing(devs)
			if tc.want == nil {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, policy.ErrSharedTwice) {
				t.Fatalf("%v, want ErrSharedTwice", err)
			}
			testutil.ErrorSays(t, err, tc.want...)
			if n := strings.Count(err.Error(), "policy.sharing[1]"); n != len(tc.want) {
				t.Errorf("%d devices reported, want %d (one per GPU, whichever names it goes by): %v", n, len(tc.want), err)
			}
		})
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
	// only, are within replicas: not reported, where the policy knows
	// the names GPU 0 goes by, as nri-gpu's does (restore judges as the
	// pool does, which without them takes GPU-0 for another device).
	_, byName := gpus()
	restored := policy.NewAllocations()
	if err := restored.Restore(gpuPolicy(shared(2, "nvidia.com/gpu=0")), []policy.Holding{
		{Pod: pod("x"), Named: []specs.Device{byName["0"]}},
		{Pod: pod("y"), Named: []specs.Device{byName["GPU-0"]}},
	}); err != nil {
		t.Errorf("users of GPU 0 by index and by UUID, shared by index: %v", err)
	}
	// Unshared again: GPU 0's two users are reported, as exclusive says.
	testutil.ErrorSays(t, a.Check(policy.New(config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices, Exclusive: true})), `pod ns/e ("nvidia.com/gpu=0") and pod ns/f ("nvidia.com/gpu=0") both hold /dev/nvidia0`)
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
	// "all" as an operator may write it, the GPUs' nodes without the MIG
	// devices' capability nodes, still gives GPU 0 whole.
	handWritten := specs.Device{Name: "nvidia.com/gpu=all", Nodes: []string{nvidia.GPUNode(0), nvidia.GPUNode(1)}}
	wantDenied(t, ask("d", handWritten), policy.RuleExclusive, `device "nvidia.com/gpu=all" is held by pod ns/a (as "nvidia.com/gpu=0:1")`)

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
	p := policy.New(config.Policy{Namespaces: []string{"*"}, Sharing: []config.Sharing{
		{Devices: []string{"nvidia.com/gpu=0"}, Replicas: 4, Strategy: config.StrategyTimeSlicing},
		{Devices: []string{"nvidia.com/gpu=1"}, Replicas: 3, Strategy: config.StrategyMPS, PinnedMemoryLimit: "1Gi"},
		{Devices: []string{"nvidia.com/gpu=2"}, Replicas: 2, Strategy: config.StrategyMPS, ActiveThreadPercentage: 70},
		{Devices: []string{"nvidia.com/gpu=3"}, Replicas: 64, Strategy: config.StrategyMPS},
	}})
	for _, tc := range []struct {
		name string
		want *policy.SharingEntry
	}{
		{"nvidia.com/gpu=0", &policy.SharingEntry{Index: 0, Replicas: 4, Strategy: config.StrategyTimeSlicing}},
		{"nvidia.com/gpu=1", &policy.SharingEntry{Index: 1, Replicas: 3, Strategy: config.StrategyMPS, ActiveThreadPercentage: 33, PinnedMemory: 1 << 30}},
		{"nvidia.com/gpu=2", &policy.SharingEntry{Index: 2, Replicas: 2, Strategy: config.StrategyMPS, ActiveThreadPercentage: 70}},
		{"nvidia.com/gpu=3", &policy.SharingEntry{Index: 3, Replicas: 64, Strategy: config.StrategyMPS, ActiveThreadPercentage: 1}}, // 100/64, at least 1
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
