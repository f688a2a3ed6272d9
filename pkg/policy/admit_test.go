package policy_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// TestPlanThenCommit: a plan holds nothing; a commit holds what the plan
// said if the pool still allows it. Two requests that planned one free
// GPU at once: the first commit holds it, the second is stale (its count
// request plans again and gets another GPU) or, asked by name under
// policy.exclusive, denied naming the pod that took it. A commit after
// the pod's own other container took a count grant is stale too.
func TestPlanThenCommit(t *testing.T) {
	candidates, byName := gpus()
	p := policy.New(config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices, Exclusive: true})
	a := policy.NewAllocations()
	count := func(name string) policy.Want {
		return policy.Want{Pod: pod(name), Count: 1, Choice: policy.Choice{Candidates: candidates}}
	}
	first, err := a.Plan(p, count("a"))
	if err != nil {
		t.Fatal(err)
	}
	second, err := a.Plan(p, count("b"))
	if err != nil {
		t.Fatal(err)
	}
	if n := a.Count(); n != 0 {
		t.Fatalf("plans held %d devices", n)
	}
	if !slices.Equal(specs.Names(first.Counted()), specs.Names(second.Counted())) {
		t.Fatalf("two plans on one pool chose %v and %v", specs.Names(first.Counted()), specs.Names(second.Counted()))
	}
	if _, err := a.Commit(p, first); err != nil {
		t.Fatal(err)
	}
	_, err = a.Commit(p, second)
	if !errors.Is(err, policy.ErrStale) {
		t.Fatalf("the second commit of one GPU: %v, want ErrStale", err)
	}
	testutil.ErrorSays(t, err, `device "nvidia.com/gpu=0", chosen for pod ns/b, was taken meanwhile`)
	again, err := a.Plan(p, count("b"))
	if err != nil {
		t.Fatal(err)
	}
	g, err := a.Commit(p, again)
	if err != nil || !slices.Equal(specs.Names(g.Counted), []string{"nvidia.com/gpu=1"}) {
		t.Errorf("planned again: %v, %v; want GPU 1", specs.Names(g.Counted), err)
	}

	byName2 := policy.Want{Pod: pod("c"), Named: asked(byName["2"])}
	planned, err := a.Plan(p, byName2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admit(a, p, pod("d"), []specs.Device{byName["GPU-2"]}, 0, policy.Choice{}, nil); err != nil {
		t.Fatal(err)
	}
	_, err = a.Commit(p, planned)
	wantDenied(t, err, policy.RuleExclusive, `device "nvidia.com/gpu=2" is held by pod ns/d (as "nvidia.com/gpu=GPU-2")`)

	// Two containers of pod e plan its count request at once.
	one, _ := a.Plan(p, count("e"))
	other, _ := a.Plan(p, count("e"))
	if _, err := a.Commit(p, one); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Commit(p, other); !errors.Is(err, policy.ErrStale) {
		t.Errorf("the pod's second container's fresh count: %v, want ErrStale", err)
	}
	kept, err := a.Plan(p, count("e"))
	if err != nil {
		t.Fatal(err)
	}
	if g, err := a.Commit(p, kept); err != nil || g.Added() {
		t.Errorf("planned again, the pod's own count grant: %v, added %v", err, g.Added())
	}
}

// TestGrantAdded: a grant says it added to what its pod holds (what must
// be recorded before the container may have the devices) for each kind
// of addition alone: a device by name, one kubelet allocated, a count
// grant; and not when the pod held it all already.
func TestGrantAdded(t *testing.T) {
	cands, byName := gpus()
	p := policy.New(config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices})
	a := policy.NewAllocations()
	for _, tc := range []struct {
		name        string
		pod         string
		named       []specs.Device
		count       int
		fromKubelet []string
		want        bool
	}{
		{"a device by name", "a", []specs.Device{byName["0"]}, 0, nil, true},
		{"the same device again", "a", []specs.Device{byName["0"]}, 0, nil, false},
		{"a device kubelet allocated", "b", []specs.Device{byName["1"]}, 0, []string{"nvidia.com/gpu=1"}, true},
		{"a count", "c", nil, 1, nil, true},
		{"the count again", "c", nil, 1, nil, false},
	} {
		g, err := admit(a, p, pod(tc.pod), tc.named, tc.count, policy.Choice{Candidates: cands}, tc.fromKubelet)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if g.Added() != tc.want {
			t.Errorf("%s: added %v, want %v", tc.name, g.Added(), tc.want)
		}
	}
}
