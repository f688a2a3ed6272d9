package inventory_test

import (
	"slices"
	"testing"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
	"github.com/nri-gpu/nri-gpu/pkg/inventory"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// TestOffers: the DRA driver is offered one name per piece of hardware
// of the kinds asked, matching the globs, that a pod does not hold
// through another door; one whose nodes are gone stays, tainted; a
// shared one says what it offers; one time-slicing shares with its
// memory counted is not offered where the driver cannot bound its
// holders' memory, unless policy.memoryLimits: agreement.
func TestOffers(t *testing.T) {
	snap := node(t, "nic0")
	inv := inventory.New("/", testutil.NVML(2), func(string, ...any) {})
	cfg := config.Policy{Devices: []string{"*/*"}, Namespaces: []string{"*"}, MemoryLimits: config.MemoryLimitsEnforced,
		Sharing: []config.Sharing{{Devices: []string{"nvidia.com/gpu=1"}, Replicas: 2, Strategy: config.StrategyTimeSlicing}}}
	enforced := inv.PolicyIn(policy.New(cfg), snap)
	var unbounded []string
	for _, d := range inv.Offers(snap, enforced, policy.NewAllocations(), []string{"nvidia.com/gpu"}, []string{"*"}, policy.Choice{Hooks: snap.Hooks}) {
		unbounded = append(unbounded, d.CDI)
	}
	if !slices.Equal(unbounded, []string{"nvidia.com/gpu=0"}) {
		t.Errorf("the driver without per-cgroup limits, memoryLimits: enforced: offered %v, want GPU 0 alone", unbounded)
	}
	cfg.MemoryLimits = config.MemoryLimitsAgreement
	pol := inv.PolicyIn(policy.New(cfg), snap)
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
	if got := offered(pool, "*"); got["nvidia.com/gpu=0"].CDI != "" || got["nvidia.com/gpu=1"].CDI == "" {
		t.Errorf("GPU 0 held by a pod's annotation: offered %v; want GPU 1 alone of the GPUs", got)
	}
}

// TestOffersOneName: of two devices whose names make one DNS label
// ("a.b", "a_b": nic-a-b), the first is offered, and the devices after
// them too.
func TestOffersOneName(t *testing.T) {
	nics := "cdiVersion: \"0.6.0\"\nkind: example.com/nic\ndevices:\n" +
		"  - name: a.b\n    containerEdits: {deviceNodes: [{path: /dev/nica, type: c, major: 240, minor: 1}]}\n" +
		"  - name: a_b\n    containerEdits: {deviceNodes: [{path: /dev/nicb, type: c, major: 240, minor: 2}]}\n" +
		"  - name: c\n    containerEdits: {deviceNodes: [{path: /dev/nicc, type: c, major: 240, minor: 3}]}\n"
	snap := testutil.Snapshot(t, nics)
	inv := inventory.New("/", testutil.NVML(0), func(string, ...any) {})
	pol := inv.PolicyIn(policy.New(config.Policy{Devices: []string{"*/*"}, Namespaces: []string{"*"}}), snap)
	got := inv.Offers(snap, pol, policy.NewAllocations(), []string{"example.com/nic"}, []string{"*"}, policy.Choice{Hooks: snap.Hooks})
	if len(got) != 2 || got[0].CDI != "example.com/nic=a.b" || got[0].Info.DeviceName() != "nic-a-b" || got[1].CDI != "example.com/nic=c" {
		t.Errorf("offered %+v, want example.com/nic=a.b, as nic-a-b, and example.com/nic=c", got)
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
