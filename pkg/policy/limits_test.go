package policy_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// numbered returns n GPUs named by index, each with a node of its own.
func numbered(n int) []specs.Device {
	var out []specs.Device
	for i := 0; i < n; i++ {
		out = append(out, specs.Device{Name: fmt.Sprintf("nvidia.com/gpu=%d", i), Nodes: []string{fmt.Sprintf("c 195:%d", i)}})
	}
	return out
}

// TestNamedUnhealthyEach: a request by name for several unhealthy GPUs
// names every one of them, not just the first.
func TestNamedUnhealthyEach(t *testing.T) {
	gpus := numbered(3)
	sick := func(d specs.Device) error {
		if d.Name != gpus[0].Name {
			return errors.New("critical Xid error 79")
		}
		return nil
	}
	p := policy.New(config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices})
	_, err := admit(policy.NewAllocations(), p, pod("a"), []specs.Device{gpus[1], gpus[2]}, 0, policy.Choice{Candidates: gpus, Unhealthy: sick}, nil)
	testutil.ErrorSays(t, err, `device "nvidia.com/gpu=1"`, `device "nvidia.com/gpu=2"`)
}

// TestRevertLeavesTheCount: a pod's first container got a GPU for its
// count request; a second container's grant, reverted (its creation
// failed later), takes nothing of it back.
func TestRevertLeavesTheCount(t *testing.T) {
	gpus := numbered(3)
	p := policy.New(config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices, Exclusive: true})
	a := policy.NewAllocations()
	ch := policy.Choice{Candidates: gpus}
	first, err := admit(a, p, pod("a"), nil, 1, ch, nil)
	if err != nil || len(first.Counted) != 1 {
		t.Fatalf("count 1: %v, %v", first.Counted, err)
	}
	second, err := admit(a, p, pod("a"), []specs.Device{gpus[2]}, 1, ch, nil)
	if err != nil || !slices.Equal(specs.Names(second.Counted), specs.Names(first.Counted)) {
		t.Fatalf("the second container's count: %v, %v; want the first's %v", second.Counted, err, first.Counted)
	}
	a.Revert(second)
	want := map[policy.Pod][]string{pod("a"): specs.Names(first.Counted)}
	if got := a.Held(); len(got) != 1 || !slices.Equal(got[pod("a")], want[pod("a")]) {
		t.Errorf("after reverting the second container, held %v, want %v", got, want)
	}
	if _, err := admit(a, p, pod("b"), nil, 3, ch, nil); err == nil {
		t.Error("another pod got all three GPUs: the first container's count was given up")
	}
}

// TestHeldByAnyOtherPod: a GPU any other pod holds is refused, however
// many pods hold GPUs and in whatever order they are looked at.
func TestHeldByAnyOtherPod(t *testing.T) {
	gpus := numbered(12)
	p := policy.New(config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices, Exclusive: true})
	a := policy.NewAllocations()
	ch := policy.Choice{Candidates: gpus}
	for i := range gpus[:11] {
		if _, err := admit(a, p, pod(fmt.Sprint("holder", i)), []specs.Device{gpus[i]}, 0, ch, nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := admit(a, p, pod("b"), []specs.Device{gpus[11]}, 0, ch, nil); err != nil {
		t.Fatal(err)
	}
	for i := range gpus[:11] {
		_, err := admit(a, p, pod("b"), []specs.Device{gpus[i]}, 0, ch, nil)
		testutil.ErrorSays(t, err, fmt.Sprintf("is held by pod ns/holder%d", i))
	}
}

// TestCountChecksWhatItMayChoose: a count request checks whether the
// container can have a device (Usable, which builds it) only as far as it
// must: the first count free devices where it takes them in order, every
// free one where it chooses by topology, so that it never chooses one it
// did not check.
func TestCountChecksWhatItMayChoose(t *testing.T) {
	gpus := numbered(4)
	bad := errors.New("hook /bin/evil not allowed")
	usable := func(unusable int) func(specs.Device) error {
		return func(d specs.Device) error {
			if d.Name == gpus[unusable].Name {
				return bad
			}
			return nil
		}
	}
	// pair: GPUs 2 and 3 are joined closely, the rest far apart.
	pair := func(a, b specs.Device) int {
		if names := []string{a.Name, b.Name}; slices.Contains(names, gpus[2].Name) && slices.Contains(names, gpus[3].Name) {
			return 100
		}
		return 10
	}
	tests := []struct {
		name       string
		count      int
		unusable   int
		links      func(a, b specs.Device) int
		want       []string
		wantPassed []string
	}{
		{name: "in order: the first two, the unusable GPU 3 never looked at", count: 2, unusable: 3,
			want: []string{"nvidia.com/gpu=0", "nvidia.com/gpu=1"}},
		{name: "one by topology: the first, GPU 1 never looked at", count: 1, unusable: 1, links: pair,
			want: []string{"nvidia.com/gpu=0"}},
		{name: "two by topology: every GPU checked, the close pair passed over for the unusable GPU 3", count: 2, unusable: 3, links: pair,
			want: []string{"nvidia.com/gpu=0", "nvidia.com/gpu=1"}, wantPassed: []string{"nvidia.com/gpu=3"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := policy.New(config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices, Exclusive: true})
			g, err := admit(policy.NewAllocations(), p, pod("a"), nil, tc.count, policy.Choice{Candidates: gpus, Usable: usable(tc.unusable), Links: tc.links}, nil)
			if err != nil {
				t.Fatal(err)
			}
			var passed []string
			for _, ps := range g.Considered.Passed {
				passed = append(passed, ps.Device)
			}
			if !slices.Equal(specs.Names(g.Counted), tc.want) || !slices.Equal(passed, tc.wantPassed) {
				t.Errorf("chose %v, passed over %v; want %v and %v", specs.Names(g.Counted), passed, tc.want, tc.wantPassed)
			}
		})
	}
}

// TestCountShortfallSays: a count request that cannot be met says how
// many are free and held, and mentions unhealthy devices only when there
// are some; with no candidates at all, it still answers.
func TestCountShortfallSays(t *testing.T) {
	p := policy.New(config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices, Exclusive: true})
	a := policy.NewAllocations()
	_, err := admit(a, p, pod("a"), nil, 3, policy.Choice{Candidates: numbered(2)}, nil)
	testutil.ErrorSays(t, err, "asks for 3 nvidia.com/gpu devices, but 2 are free and 0 held")
	if err != nil && strings.Contains(err.Error(), "unhealthy") {
		t.Errorf("no GPU is unhealthy, but: %v", err)
	}
	_, err = admit(a, p, pod("a"), nil, 1, policy.Choice{}, nil)
	testutil.ErrorSays(t, err, "asks for 1 devices, but 0 are free")
}

// TestClosestWithoutLinks: where every pair scores the same (nothing is
// known to be closer), Closest still chooses, the first in spec order.
func TestClosestWithoutLinks(t *testing.T) {
	gpus := numbered(4)
	got, score := policy.Closest(nil, gpus, 2, func(a, b specs.Device) int { return 0 })
	if !slices.Equal(specs.Names(got), []string{"nvidia.com/gpu=0", "nvidia.com/gpu=1"}) || score != 0 {
		t.Errorf("chose %v (score %d), want GPUs 0 and 1 (score 0)", specs.Names(got), score)
	}
}

// TestGreedyWithoutLinks: where there are too many sets to score each and
// nothing is known to be closer, the sets grown greedily still give the
// first count devices.
func TestGreedyWithoutLinks(t *testing.T) {
	gpus := numbered(32)
	got, score := policy.Closest(nil, gpus, 8, func(a, b specs.Device) int { return 0 })
	if !slices.Equal(specs.Names(got), specs.Names(gpus[:8])) || score != 0 {
		t.Errorf("chose %v (score %d), want the first 8 (score 0)", specs.Names(got), score)
	}
}

// TestRelease: releasing a pod returns what it held, and nothing for a
// pod that held nothing.
func TestRelease(t *testing.T) {
	gpus := numbered(2)
	p := policy.New(config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices})
	a := policy.NewAllocations()
	if _, err := admit(a, p, pod("a"), []specs.Device{gpus[1]}, 0, policy.Choice{Candidates: gpus}, nil); err != nil {
		t.Fatal(err)
	}
	if got := a.Release(pod("a").ID); !slices.Equal(got, []string{"nvidia.com/gpu=1"}) {
		t.Errorf("Release = %v, want GPU 1", got)
	}
	if got := a.Release(pod("a").ID); got != nil {
		t.Errorf("Release again = %v, want nothing", got)
	}
}

// TestRestoreCounts: a pod's count holding is restored from the first
// holding that has one; an empty one (a state file's "counted": []) is no
// count holding, so the pod's next count request chooses anew.
func TestRestoreCounts(t *testing.T) {
	gpus := numbered(3)
	p := policy.New(config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices})
	a := policy.NewAllocations()
	ch := policy.Choice{Candidates: gpus}
	if err := a.Restore(p, []policy.Holding{
		{Pod: pod("a"), Counted: []specs.Device{gpus[1]}},
		{Pod: pod("a"), Counted: []specs.Device{gpus[2]}},
		{Pod: pod("b"), Counted: []specs.Device{}},
	}); err != nil {
		t.Fatal(err)
	}
	g, err := admit(a, p, pod("a"), nil, 1, ch, nil)
	if err != nil || !slices.Equal(specs.Names(g.Counted), []string{"nvidia.com/gpu=1"}) {
		t.Errorf("pod a's count: %v, %v; want GPU 1, restored first", specs.Names(g.Counted), err)
	}
	g, err = admit(a, p, pod("b"), nil, 1, ch, nil)
	if err != nil || len(g.Counted) != 1 {
		t.Errorf("pod b's count after an empty restored one: %v, %v; want one GPU", specs.Names(g.Counted), err)
	}
}

// TestRestoreProblemsCapped: Restore reports up to 16 problems one by
// one, and says how many more there are beyond.
func TestRestoreProblemsCapped(t *testing.T) {
	p := policy.New(config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices})
	holdings := func(n int) []policy.Holding {
		var out []policy.Holding
		for i := 0; i < n; i++ {
			out = append(out, policy.Holding{Pod: pod(fmt.Sprint("p", i)), Named: []specs.Device{{Name: fmt.Sprintf("example.com/x=%d", i)}}})
		}
		return out
	}
	err := policy.NewAllocations().Restore(p, holdings(16))
	testutil.ErrorSays(t, err, "example.com/x=15")
	if err != nil && strings.Contains(err.Error(), "(and ") {
		t.Errorf("16 problems, all shown, yet: %v", err)
	}
	testutil.ErrorSays(t, policy.NewAllocations().Restore(p, holdings(17)), "(and 1 more)")
}

// TestMaxDevicesCountsAll: maxDevicesPerPod counts a kind's "all" as each
// device it covers, and the pod's other devices beside it.
func TestMaxDevicesCountsAll(t *testing.T) {
	gpus := numbered(4)
	all := specs.Device{Name: "nvidia.com/gpu=all", Nodes: []string{"c 195:0", "c 195:1", "c 195:2", "c 195:3"}}
	nic := specs.Device{Name: "example.com/nic=0", Nodes: []string{"c 240:0"}}
	open := config.Policy{Namespaces: []string{"*"}, Devices: []string{"*/*"}, AllowAll: true}
	for _, tc := range []struct {
		max     int
		allowed bool
	}{{5, true}, {4, false}} {
		pol := open
		pol.MaxDevicesPerPod = tc.max
		_, err := admit(policy.NewAllocations(), policy.New(pol), pod("a"), []specs.Device{all, nic}, 0, policy.Choice{Candidates: gpus}, nil)
		if (err == nil) != tc.allowed {
			t.Errorf("all 4 GPUs and a NIC under maxDevicesPerPod %d: %v", tc.max, err)
		}
	}
}

// TestRuntimeRequestsDoNotHideOthers: a device the runtime injects itself
// is not checked, but the requests after it are.
func TestRuntimeRequestsDoNotHideOthers(t *testing.T) {
	p := policy.New(config.Policy{Namespaces: []string{"*"}, Devices: []string{"nvidia.com/gpu=0"}})
	ask := policy.Ask{Requests: []policy.Request{
		{Device: "nvidia.com/gpu=9", Item: "nvidia.com/gpu=9", Origin: policy.OriginRuntime},
		{Device: "nvidia.com/gpu=1", Item: "1", Key: "gpus.nri-gpu.io", Origin: policy.OriginPod},
	}}
	testutil.ErrorSays(t, p.Check(pod("a"), ask), `"nvidia.com/gpu=1"`, "policy.devices")
}

// TestNamedOnlyHasNoCount: a pod that asks by name holds no count: its
// grant considered nothing for one, and what it holds records none.
func TestNamedOnlyHasNoCount(t *testing.T) {
	gpus := numbered(2)
	p := policy.New(config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices})
	a := policy.NewAllocations()
	g, err := admit(a, p, pod("a"), []specs.Device{gpus[0]}, 0, policy.Choice{Candidates: gpus}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if g.Counted != nil || g.Considered.Free != nil || g.Considered.Passed != nil {
		t.Errorf("a named request's grant: counted %v, considered %+v; want none", g.Counted, g.Considered)
	}
	if h := a.Holdings(); len(h) != 1 || h[0].Counted != nil {
		t.Errorf("holdings %+v, want pod a's with no count", h)
	}
}
