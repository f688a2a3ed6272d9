package inventory_test

import (
	"slices"
	"testing"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/deviceplugin"
	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
	"github.com/nri-gpu/nri-gpu/pkg/inventory"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// TestOffers: the DRA driver is offered one name per piece of hardware
// of the kinds asked, matching the globs, that a pod does not hold
// through another door; one whose nodes are gone stays, tainted; a
// shared one says what it offers.
func TestOffers(t *testing.T) {
	snap := node(t, "nic0")
	inv := inventory.New("/", testutil.NVML(2), func(string, ...any) {})
	pol := inv.PolicyIn(policy.New(config.Policy{Devices: []string{"*/*"}, Namespaces: []string{"*"},
		Sharing: []config.Sharing{{Devices: []string{"nvidia.com/gpu=1"}, Replicas: 2, Strategy: config.StrategyTimeSlicing}}}), snap)
	kinds := []string{"nvidia.com/gpu", "example.com/nic"}
	offered := func(pool *policy.Allocations, globs ...string) map[string]link.Device {
		out := map[string]link.Device{}
		for _, d := range inv.Offers(snap, pol, pool, kinds, globs, policy.Choice{Hooks: snap.Hooks}) {
			out[d.CDI] = d
		}
		return out
	}
	got := offered(policy.NewAllocations(), "*")
	var names []string
	for name := range got {
		names = append(names, name)
	}
	slices.Sort(names)
	if want := []string{"example.com/nic=0", "nvidia.com/gpu=0", "nvidia.com/gpu=1"}; !slices.Equal(names, want) {
		t.Errorf("offered %v, want %v", names, want)
	}
	if h := got["example.com/nic=0"].Info.Unhealthy; h == nil || h.Problem != link.ProblemGone {
		t.Errorf("the NIC, its node gone: %+v; want it tainted", h)
	}
	if got["nvidia.com/gpu=0"].Info.Unhealthy != nil || got["nvidia.com/gpu=0"].Info.Offer != nil {
		t.Errorf("GPU 0: %+v; want it healthy, whole", got["nvidia.com/gpu=0"].Info)
	}
	if got["nvidia.com/gpu=1"].Info.Offer == nil {
		t.Error("GPU 1, shared: no offer said")
	}
	if got := offered(policy.NewAllocations(), "1"); len(got) != 1 || got["nvidia.com/gpu=1"].CDI == "" {
		t.Errorf("matching 1: %v; want GPU 1 alone", got)
	}
	pool := policy.NewAllocations()
	held := []policy.Holding{{Pod: policy.Pod{ID: "p", Namespace: "ns", Name: "p"}, Named: []specs.Device{dev(t, snap, "nvidia.com/gpu=0")}}}
	if err := pool.Restore(pol, held); err != nil {
		t.Fatal(err)
	}
	if _, ok := offered(pool, "*")["nvidia.com/gpu=0"]; ok {
		t.Error("GPU 0, held by a pod's annotation: offered")
	}
}

// TestKubeletOffers: a device plugin offers kubelet each device of its
// kind its globs match, by its name within the kind, with room for one
// holder while no pod holds it through another door, a shared one's
// replicas with the room they have left; a device whose nodes are gone
// has no room.
func TestKubeletOffers(t *testing.T) {
	snap := node(t, "nic0")
	inv := inventory.New("/", testutil.NVML(2), func(string, ...any) {})
	pol := inv.PolicyIn(policy.New(config.Policy{Devices: []string{"*/*"}, Namespaces: []string{"*"},
		Sharing: []config.Sharing{{Devices: []string{"nvidia.com/gpu=1"}, Replicas: 2, Strategy: config.StrategyTimeSlicing}}}), snap)
	pool := policy.NewAllocations()
	held := []policy.Holding{
		{Pod: policy.Pod{ID: "a", Namespace: "ns", Name: "a"}, Named: []specs.Device{dev(t, snap, "nvidia.com/gpu=0")}},
		{Pod: policy.Pod{ID: "b", Namespace: "ns", Name: "b"}, Named: []specs.Device{dev(t, snap, "nvidia.com/gpu=1")}},
	}
	if err := pool.Restore(pol, held); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		pool  *policy.Allocations
		kind  string
		globs []string
		want  []deviceplugin.Offer
	}{
		{name: "free", pool: policy.NewAllocations(), kind: "nvidia.com/gpu", globs: []string{"*"},
			want: []deviceplugin.Offer{{ID: "0", Room: 1}, {ID: "1", Replicas: 2, Room: 2}}},
		{name: "one glob", pool: policy.NewAllocations(), kind: "nvidia.com/gpu", globs: []string{"1"},
			want: []deviceplugin.Offer{{ID: "1", Replicas: 2, Room: 2}}},
		{name: "held by annotations", pool: pool, kind: "nvidia.com/gpu", globs: []string{"*"},
			want: []deviceplugin.Offer{{ID: "0", Room: 0}, {ID: "1", Replicas: 2, Room: 1}}},
		{name: "nodes gone", pool: policy.NewAllocations(), kind: "example.com/nic", globs: []string{"*"},
			want: []deviceplugin.Offer{{ID: "0", Room: 0}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := inv.KubeletOffers(snap, pol, tc.pool, tc.kind, tc.globs); !slices.Equal(got, tc.want) {
				t.Errorf("offers %+v, want %+v", got, tc.want)
			}
		})
	}
	if err := pool.Restore(pol, held); err != nil {
		t.Fatal(err)
	}
}

// TestPieces: the metrics tell each piece of hardware once, with its MIG
// devices beside it, over every kind, the default first; a holding of a
// MIG device is told under it, one of the GPU under the GPU.
func TestPieces(t *testing.T) {
	snap := node(t)
	pol := policy.New(config.Policy{Devices: []string{"*/*"}})
	var got [][]string
	for _, p := range inventory.Pieces(snap, pol, "nvidia.com/gpu") {
		got = append(got, append([]string{p.Kind}, specs.Names(p.Devices)...))
	}
	want := [][]string{
		{"nvidia.com/gpu", "nvidia.com/gpu=0", "nvidia.com/gpu=0:0", "nvidia.com/gpu=0:1"},
		{"nvidia.com/gpu", "nvidia.com/gpu=1"},
		{"example.com/nic", "example.com/nic=0"},
	}
	if !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("pieces %v, want %v", got, want)
	}
	gpu0 := inventory.Pieces(snap, pol, "nvidia.com/gpu")[0]
	for held, as := range map[string]string{
		"nvidia.com/gpu=MIG-bbb": "nvidia.com/gpu=0:0",
		"nvidia.com/gpu=0:1":     "nvidia.com/gpu=0:1",
		"nvidia.com/gpu=GPU-aaa": "nvidia.com/gpu=0",
	} {
		if got := gpu0.HeldAs(dev(t, snap, held)).Name; got != as {
			t.Errorf("a holding of %s told under %s, want %s", held, got, as)
		}
	}
}
