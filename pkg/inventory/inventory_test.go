package inventory_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
	"github.com/nri-gpu/nri-gpu/pkg/inventory"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
	"github.com/nri-gpu/nri-gpu/pkg/specs/nvidia"
)

// node writes, in a directory of its own, a spec of kind nvidia.com/gpu:
// GPU 0 (also named GPU-aaa), GPU 1, GPU 0's MIG devices 0:0 (also
// MIG-bbb) and 0:1, and "all"; and one of kind example.com/nic. The
// device nodes are files there, but gone are left out. It returns the
// snapshot.
func node(t *testing.T, gone ...string) *specs.Snapshot {
	t.Helper()
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "nvidia-caps"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"nvidia0", "nvidia1", "nvidia-caps/nvidia-cap30", "nvidia-caps/nvidia-cap40", "nic0"} {
		if !slices.Contains(gone, n) {
			if err := os.WriteFile(filepath.Join(dir, n), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	dev := func(name string, nodes ...string) string {
		var b strings.Builder
		fmt.Fprintf(&b, "  - name: %q\n    containerEdits:\n      deviceNodes:\n", name)
		for _, n := range nodes {
			minor := map[string]int{"nvidia0": 0, "nvidia1": 1, "nvidia-caps/nvidia-cap30": 30, "nvidia-caps/nvidia-cap40": 40}[n]
			major := 195
			if strings.HasPrefix(n, "nvidia-caps/") {
				major = 511
			}
			fmt.Fprintf(&b, "        - {path: /dev/%s, hostPath: %s/%s, type: c, major: %d, minor: %d}\n", n, dir, n, major, minor)
		}
		return b.String()
	}
	gpus := "cdiVersion: \"0.6.0\"\nkind: nvidia.com/gpu\ndevices:\n" +
		dev("0", "nvidia0") + dev("GPU-aaa", "nvidia0") + dev("1", "nvidia1") +
		dev("0:0", "nvidia0", "nvidia-caps/nvidia-cap30") + dev("MIG-bbb", "nvidia0", "nvidia-caps/nvidia-cap30") + dev("0:1", "nvidia0", "nvidia-caps/nvidia-cap40") +
		dev("all", "nvidia0", "nvidia1")
	nic := fmt.Sprintf("cdiVersion: \"0.6.0\"\nkind: example.com/nic\ndevices:\n  - name: \"0\"\n    containerEdits:\n      deviceNodes: [{path: /dev/nic0, hostPath: %s/nic0, type: c, major: 240, minor: 0}]\n", dir)
	specDir := filepath.Join(dir, "cdi")
	if err := os.Mkdir(specDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, spec := range map[string]string{"gpu.yaml": gpus, "nic.yaml": nic} {
		if err := os.WriteFile(filepath.Join(specDir, name), []byte(spec), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	reg, err := specs.Open([]string{specDir}, specs.WithPartMajors(func() []int64 { return []int64{511} }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reg.Close)
	return reg.Snapshot()
}

func dev(t *testing.T, snap *specs.Snapshot, name string) specs.Device {
	t.Helper()
	e, err := snap.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	return e.Footprint
}

// TestIdentify: which GPU a device is, from its names: by index, by
// UUID (its own name or another of its hardware's in its kind), a MIG
// device by nvidia-ctk's "GPU:MIG" name or its MIG- UUID; a device of
// another kind has none.
func TestIdentify(t *testing.T) {
	snap := node(t)
	for _, tc := range []struct {
		device string
		want   inventory.Identity
	}{
		{"nvidia.com/gpu=0", inventory.Identity{Name: "0", UUID: "GPU-aaa", Index: 0}},
		{"nvidia.com/gpu=GPU-aaa", inventory.Identity{Name: "GPU-aaa", UUID: "GPU-aaa", Index: -1}},
		{"nvidia.com/gpu=1", inventory.Identity{Name: "1", Index: 1}},
		{"nvidia.com/gpu=0:0", inventory.Identity{Name: "0:0", UUID: "MIG-bbb", Index: 0, MIG: true}},
		{"nvidia.com/gpu=MIG-bbb", inventory.Identity{Name: "MIG-bbb", UUID: "MIG-bbb", Index: -1, MIG: true}},
		{"nvidia.com/gpu=0:1", inventory.Identity{Name: "0:1", Index: 0, MIG: true}},
		{"example.com/nic=0", inventory.Identity{Name: "0", Index: 0}},
	} {
		if got := inventory.Identify(snap, dev(t, snap, tc.device)); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.device, got, tc.want)
		}
	}
}

// TestHardware: one name per piece of hardware (a GPU by index, not
// again by UUID; a MIG device apart from its GPU only among its MIG
// devices), matching the globs, allowed by policy.devices, none that
// overlaps one seen, never "all"; the kinds, the default first.
func TestHardware(t *testing.T) {
	snap := node(t)
	all := policy.New(config.Policy{Devices: []string{"*/*"}})
	names := func(devs []specs.Device) []string { return specs.Names(devs) }
	gpus := inventory.Hardware(snap, all, "nvidia.com/gpu", []string{"*"}, nil)
	if got := names(gpus); !slices.Equal(got, []string{"nvidia.com/gpu=0", "nvidia.com/gpu=1"}) {
		t.Errorf("GPUs %v, want 0 and 1", got)
	}
	if got := names(inventory.Hardware(snap, all, "nvidia.com/gpu", []string{"1"}, nil)); !slices.Equal(got, []string{"nvidia.com/gpu=1"}) {
		t.Errorf("GPUs matching 1: %v", got)
	}
	if got := names(inventory.Hardware(snap, all, "nvidia.com/gpu", []string{"*"}, gpus[:1])); !slices.Equal(got, []string{"nvidia.com/gpu=1"}) {
		t.Errorf("GPUs beside GPU 0 seen: %v", got)
	}
	only1 := policy.New(config.Policy{Devices: []string{"nvidia.com/gpu=1"}})
	if got := names(inventory.Hardware(snap, only1, "nvidia.com/gpu", []string{"*"}, nil)); !slices.Equal(got, []string{"nvidia.com/gpu=1"}) {
		t.Errorf("GPUs policy.devices allows: %v", got)
	}
	if got := names(inventory.MIGs(snap, all, "nvidia.com/gpu", gpus[0])); !slices.Equal(got, []string{"nvidia.com/gpu=0:0", "nvidia.com/gpu=0:1"}) {
		t.Errorf("GPU 0's MIG devices %v", got)
	}
	if got := inventory.MIGs(snap, all, "nvidia.com/gpu", gpus[1]); len(got) > 0 {
		t.Errorf("GPU 1's MIG devices %v, want none", names(got))
	}
	if got := inventory.Kinds(snap, "nvidia.com/gpu"); !slices.Equal(got, []string{"nvidia.com/gpu", "example.com/nic"}) {
		t.Errorf("kinds %v", got)
	}
}

// TestKinds: the default kind first, then the others in order of their
// names, whatever the order of their devices' names ("nic-b=0" sorts
// before "nic=0", kind nic before kind nic-b).
func TestKinds(t *testing.T) {
	spec := func(kind string) string {
		return fmt.Sprintf("cdiVersion: \"0.6.0\"\nkind: %s\ndevices:\n  - name: \"0\"\n    containerEdits: {deviceNodes: [{path: /dev/x, type: c, major: 240, minor: %d}]}\n", kind, len(kind))
	}
	snap := testutil.Snapshot(t, spec("example.com/nic-b"), spec("example.com/nic"), testutil.GPUSpec(1))
	want := []string{"nvidia.com/gpu", "example.com/nic", "example.com/nic-b"}
	if got := inventory.Kinds(snap, "nvidia.com/gpu"); !slices.Equal(got, want) {
		t.Errorf("kinds %v, want %v", got, want)
	}
}

// TestUUIDOfItsKind: a GPU's UUID is a name of its hardware in its own
// kind: a device of another kind on the same nodes, named like a UUID,
// does not name it.
func TestUUIDOfItsKind(t *testing.T) {
	other := "cdiVersion: \"0.6.0\"\nkind: other.com/gpu\ndevices:\n  - name: GPU-zzz\n    containerEdits: {deviceNodes: [{path: /dev/nvidia1, type: c, major: 195, minor: 1}]}\n"
	snap := testutil.Snapshot(t, testutil.GPUSpec(2), other)
	if id := inventory.Identify(snap, dev(t, snap, "nvidia.com/gpu=1")); id.UUID != "" || id.Index != 1 {
		t.Errorf("GPU 1: %+v, want index 1 and no UUID", id)
	}
	if id := inventory.Identify(snap, dev(t, snap, "other.com/gpu=GPU-zzz")); id.UUID != "GPU-zzz" {
		t.Errorf("other.com/gpu=GPU-zzz: %+v, want its own name as UUID", id)
	}
}

// mig gives GPU 0 of s MIG devices MIG-bbb and MIG-ccc, on GPU
// instances 3 and 5, and returns GPU 0's UUID.
func mig(s *dgxa100.Server) string {
	return testutil.WithMIGs(s, 0, testutil.MIG{UUID: "MIG-bbb", GI: 3}, testutil.MIG{UUID: "MIG-ccc", GI: 5})
}

// TestInfo: what a device is, from its spec and NVML: a GPU's product,
// memory and the UUID NVML gives where its spec names none; a MIG
// device's GPU's product, its parent's UUID and no memory of its own,
// labelled for DCGM by its GPU's UUID and GPU instance; without NVML,
// what the spec says, and NVML's failure said once; another kind, its
// name and minor only.
func TestInfo(t *testing.T) {
	snap := node(t)
	lib := testutil.NVML(2)
	parent := mig(lib)
	var said []string
	inv := inventory.New("/", lib, func(f string, args ...any) { said = append(said, fmt.Sprintf(f, args...)) })
	gpu1 := inv.Info(snap, config.DefaultKind, dev(t, snap, "nvidia.com/gpu=1"))
	uuid1, _ := lib.Devices[1].GetUUID()
	if gpu1.Type != link.TypeGPU || gpu1.UUID != uuid1 || gpu1.Index != 1 || gpu1.Minor != 1 || gpu1.MemoryBytes == 0 || gpu1.ProductName == "" {
		t.Errorf("GPU 1: %+v; want its UUID from NVML, index and minor 1, its memory and product", gpu1)
	}
	m := inv.Info(snap, config.DefaultKind, dev(t, snap, "nvidia.com/gpu=0:1"))
	if m.Type != link.TypeMIG || m.ParentUUID != parent || m.MemoryBytes != 0 || m.Index != 0 {
		t.Errorf("MIG device 0:1: %+v; want its GPU's UUID as parent, no memory of its own", m)
	}
	if uuid, index, gi := inv.DCGMEntity(m); uuid != parent || index != "0" || gi != "5" {
		t.Errorf("MIG device 0:1 for DCGM: %s %q %s, want its GPU's UUID and index 0, GPU instance 5", uuid, index, gi)
	}
	named := inv.Info(snap, config.DefaultKind, dev(t, snap, "nvidia.com/gpu=MIG-bbb"))
	if uuid, _, gi := inv.DCGMEntity(named); uuid != parent || gi != "3" {
		t.Errorf("MIG device MIG-bbb for DCGM: %s %s, want its GPU's UUID and GPU instance 3", uuid, gi)
	}
	if uuid, index, gi := inv.DCGMEntity(gpu1); uuid != uuid1 || index != "1" || gi != "" {
		t.Errorf("GPU 1 for DCGM: %s %q %q, want its UUID and index 1 alone", uuid, index, gi)
	}
	// A MIG device NVML has no parent of: labelled as itself.
	orphan := m
	orphan.ParentUUID = ""
	if uuid, _, gi := inv.DCGMEntity(orphan); uuid != m.UUID || gi != "" {
		t.Errorf("a MIG device of no known GPU for DCGM: %s %q, want its own UUID, no instance", uuid, gi)
	}
	if got := inv.Memory(snap, dev(t, snap, "nvidia.com/gpu=1")); got != int64(gpu1.MemoryBytes) {
		t.Errorf("GPU 1's memory %d, want %d", got, gpu1.MemoryBytes)
	}
	if got := inv.Memory(snap, dev(t, snap, "nvidia.com/gpu=0:0")); got != 0 {
		t.Errorf("a MIG device's memory %d, want 0 (it is not a whole GPU)", got)
	}
	if got := inv.UUID(snap, dev(t, snap, "nvidia.com/gpu=1")); got != uuid1 {
		t.Errorf("GPU 1's UUID %q, want NVML's %s", got, uuid1)
	}
	nic := inv.Info(snap, "example.com/nic", dev(t, snap, "example.com/nic=0"))
	if nic.Type != "" || nic.UUID != "" || nic.Name != "0" || nic.Index != -1 || nic.Minor != -1 {
		t.Errorf("a NIC: %+v, want its name only", nic)
	}
	if uuid, index, gi := inv.DCGMEntity(nic); uuid+index+gi != "" {
		t.Errorf("a NIC for DCGM: %q %q %q, want no label", uuid, index, gi)
	}
	if len(said) > 0 {
		t.Errorf("said %q with NVML answering", said)
	}

	broken := testutil.NVML(1)
	broken.InitFunc = func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }
	said = nil
	blind := inventory.New("/", broken, func(f string, args ...any) { said = append(said, fmt.Sprintf(f, args...)) })
	for range 2 {
		if got := blind.Info(snap, config.DefaultKind, dev(t, snap, "nvidia.com/gpu=0")); got.UUID != "GPU-aaa" || got.ProductName != "" {
			t.Errorf("GPU 0 without NVML: %+v, want the spec's UUID alone", got)
		}
		if blind.Links() != nil {
			t.Error("a topology without NVML")
		}
	}
	if len(said) != 2 || !strings.Contains(said[0], "GPU facts from the CDI specs only") || !strings.Contains(said[1], "GPU topology unknown") {
		t.Errorf("said %q, want NVML's failure once for facts and once for topology", said)
	}
}

// TestHealth: a device whose nodes are gone is unhealthy, and sick for
// DRA's taints, whatever NVML says; one NVML finds lost or with an Xid
// is, as the monitor watched says; without a monitor, every device of
// the specs with its nodes is healthy; a device the specs do not have
// (the runtime's own) is.
func TestHealth(t *testing.T) {
	snap := node(t, "nvidia1")
	lib := testutil.NVML(2)
	inv := inventory.New("/", lib, func(string, ...any) {})
	unhealthy := inv.Unhealthy(snap)
	if err := unhealthy(dev(t, snap, "nvidia.com/gpu=1")); !errors.Is(err, inventory.ErrNodesGone) {
		t.Errorf("GPU 1, its node gone: %v, want ErrNodesGone", err)
	}
	if h := inv.Sickness(snap, dev(t, snap, "nvidia.com/gpu=1")); h == nil || h.Problem != link.ProblemGone {
		t.Errorf("GPU 1's sickness %+v, want its nodes gone", h)
	}
	for _, name := range []string{"nvidia.com/gpu=0", "example.com/nic=0"} {
		if err := unhealthy(dev(t, snap, name)); err != nil {
			t.Errorf("%s: %v, want healthy", name, err)
		}
		if h := inv.Sickness(snap, dev(t, snap, name)); h != nil {
			t.Errorf("%s's sickness %+v, want none", name, h)
		}
	}
	if err := unhealthy(specs.Device{Name: "vendor.com/x=0", Nodes: []string{"c 9:9"}}); err != nil {
		t.Errorf("a device of no spec: %v, want healthy", err)
	}

	d := lib.Devices[0].(*dgxa100.Device)
	d.GetUUIDFunc = func() (string, nvml.Return) { return "", nvml.ERROR_GPU_IS_LOST }
	m, err := nvidia.NewMonitor(lib)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	m.Check()
	inv.Watching(m)
	if err := inv.Unhealthy(snap)(dev(t, snap, "nvidia.com/gpu=0:0")); !errors.Is(err, nvidia.ErrUnhealthy) {
		t.Errorf("a MIG device of the lost GPU 0: %v, want unhealthy", err)
	}
	if h := inv.Sickness(snap, dev(t, snap, "nvidia.com/gpu=0")); h == nil || h.Problem != link.ProblemLost {
		t.Errorf("GPU 0's sickness %+v, want lost", h)
	}
	inv.Watching(nil)
	if err := inv.Unhealthy(snap)(dev(t, snap, "nvidia.com/gpu=0")); err != nil {
		t.Errorf("with no monitor watched: %v, want healthy", err)
	}
}

// TestPolicyIn: the policy bound to a snapshot knows the names each
// device's hardware goes by there (an entry sharing GPU-aaa shares GPU
// 0 too) and each GPU's memory (NVML's), for its capacity.
func TestPolicyIn(t *testing.T) {
	snap := node(t)
	lib := testutil.NVML(2)
	inv := inventory.New("/", lib, func(string, ...any) {})
	pol := policy.New(config.Policy{Sharing: []config.Sharing{{Devices: []string{"nvidia.com/gpu=GPU-aaa"}, Replicas: 2, Strategy: config.StrategyTimeSlicing}}})
	if pol.Sharing(dev(t, snap, "nvidia.com/gpu=0")) != nil {
		t.Fatal("unbound, the policy knows GPU 0 by its UUID")
	}
	bound := inv.PolicyIn(pol, snap)
	s := bound.Sharing(dev(t, snap, "nvidia.com/gpu=0"))
	if s == nil {
		t.Fatal("bound, GPU 0 is not shared by the entry naming its UUID")
	}
	gpu0 := inv.Info(snap, config.DefaultKind, dev(t, snap, "nvidia.com/gpu=0"))
	if c := bound.Capacity(s, dev(t, snap, "nvidia.com/gpu=0")); c.Memory != int64(gpu0.MemoryBytes)-int64(gpu0.MemoryBytes)%c.Step || c.Memory == 0 {
		t.Errorf("GPU 0's capacity %+v, want NVML's memory %d", c, gpu0.MemoryBytes)
	}
}

// TestNodesLookedForAgain: a device node that goes is seen gone within a
// second or so (one found there is not looked for at every question),
// whether its last look was just now or longer ago than the second a
// look is trusted for; one that comes back is seen at once.
func TestNodesLookedForAgain(t *testing.T) {
	for _, tc := range []struct {
		name string
		// aged is how long after the last look the node goes.
		aged time.Duration
	}{
		{name: "just looked at"},
		{name: "looked at over a second ago", aged: 1500 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			snap := node(t)
			inv := inventory.New("/", testutil.NVML(2), func(string, ...any) {})
			gpu1 := dev(t, snap, "nvidia.com/gpu=1")
			if err := inv.Unhealthy(snap)(gpu1); err != nil {
				t.Fatalf("GPU 1: %v, want healthy", err)
			}
			time.Sleep(tc.aged) // the look above ages
			e, err := snap.Lookup(gpu1.Name)
			if err != nil {
				t.Fatal(err)
			}
			path := specs.HostPath(e.Device.ContainerEdits.DeviceNodes[0])
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			testutil.Within(t, 5*time.Second, "GPU 1's node seen gone", func() bool {
				return errors.Is(inv.Unhealthy(snap)(gpu1), inventory.ErrNodesGone)
			})
			if err := os.WriteFile(path, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := inv.Unhealthy(snap)(gpu1); err != nil {
				t.Errorf("GPU 1, its node back: %v, want healthy at once", err)
			}
		})
	}
}
