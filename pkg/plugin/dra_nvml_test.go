package plugin_test

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/plugin"
)

// fourGPUs is a spec of GPUs 0-3, each device node a file in dir, and a
// MIG device 3:0.
func fourGPUs(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	var b strings.Builder
	b.WriteString("cdiVersion: \"0.6.0\"\nkind: nvidia.com/gpu\ndevices:\n")
	for i := range 4 {
		node := filepath.Join(dir, fmt.Sprintf("nvidia%d", i))
		if err := os.WriteFile(node, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "  - name: %q\n    containerEdits:\n      deviceNodes: [{path: /dev/nvidia%d, hostPath: %s, type: c, major: 195, minor: %d}]\n", fmt.Sprint(i), i, node, i)
	}
	// A MIG device of GPU 3: its node and a capability's.
	capNode := filepath.Join(dir, "cap30")
	if err := os.WriteFile(capNode, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(&b, "  - name: \"3:0\"\n    containerEdits:\n      deviceNodes: [{path: /dev/nvidia3, hostPath: %s, type: c, major: 195, minor: 3}, {path: /dev/nvidia-caps/nvidia-cap30, hostPath: %s}]\n",
		filepath.Join(dir, "nvidia3"), capNode)
	specDir := filepath.Join(dir, "cdi")
	if err := os.MkdirAll(specDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(specDir, "gpu.yaml"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return specDir
}

// pcieSysfs links GPUs 0 and 1 under PCIe root pci0000:3a, 2 and 3
// under pci0000:b0, as /sys/bus/pci/devices does.
func pcieSysfs() (fstest.MapFS, []string) {
	fsys := fstest.MapFS{}
	var ids []string
	for i, root := range []string{"3a", "3a", "b0", "b0"} {
		id := fmt.Sprintf("0000:%s:%02x.0", root, i+1)
		ids = append(ids, id)
		dev := fmt.Sprintf("devices/pci0000:%s/0000:%s:00.0/%s", root, root, id)
		fsys[dev] = &fstest.MapFile{Mode: fs.ModeDir | 0o755}
		fsys["bus/pci/devices/"+id] = &fstest.MapFile{Data: []byte("../../../" + dev), Mode: fs.ModeSymlink}
	}
	return fsys, ids
}

// TestClaimDevicesFromNVML: where NVML tells, the DRA driver's devices
// carry what it says, under NVIDIA's DRA driver's names (productName,
// brand, architecture, versions, memory) and Kubernetes' standard PCIe
// root; Kubernetes' own allocator (the scheduler's) gives a claim for
// two GPUs with a matchAttribute constraint on the PCIe root a pair that
// shares one; a GPU NVML finds lost is no longer offered.
func TestClaimDevicesFromNVML(t *testing.T) {
	lib := testutil.NVML(4)
	sysfs, busIDs := pcieSysfs()
	for i, d := range lib.Devices[:4] {
		id := "0000" + strings.ToUpper(busIDs[i]) // NVML's 8-digit domain, upper case
		d.(*dgxa100.Device).GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) { return testutil.PCI(id), nvml.SUCCESS }
	}
	cfg, err := config.Parse([]byte("policy: {exclusive: true}"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := plugin.New(cfg, quiet(), plugin.WithSpecDirs([]string{fourGPUs(t)}), plugin.WithNVML(lib))
	if err != nil {
		t.Fatal(err)
	}
	synchronized(t, p)
	t.Cleanup(p.Close)
	devs := offer(t, p.DRAView(cfg.Start.DRA), sysfs)
	if len(devs) != 4 {
		t.Fatalf("%d devices, want 4", len(devs))
	}
	gpu := devs[2].Device
	str := func(name resourceapi.QualifiedName) string {
		if v := gpu.Attributes[name].StringValue; v != nil {
			return *v
		}
		if v := gpu.Attributes[name].VersionValue; v != nil {
			return *v
		}
		return ""
	}
	for name, want := range map[resourceapi.QualifiedName]string{
		"productName": "Mock NVIDIA A100-SXM4-40GB", "brand": "Nvidia", "architecture": "Ampere",
		"cudaComputeCapability": "8.0.0", "driverVersion": "550.54.15", "pcieBusID": "0000:b0:03.0",
		"resource.kubernetes.io/pcieRoot": "pci0000:b0", "uuid": lib.Devices[2].(*dgxa100.Device).UUID,
	} {
		if got := str(name); got != want {
			t.Errorf("gpu-2 %s: %q, want %q", name, got, want)
		}
	}
	if m := gpu.Capacity["memory"].Value; m.Value() != 40<<30 {
		t.Errorf("gpu-2 memory %s, want 40Gi", m.String())
	}

	// A MIG device: its GPU's product and PCI address, its GPU's UUID as
	// its parent's, no memory of the whole GPU.
	mig := offer(t, p.DRAView(config.DRA{Kinds: cfg.Start.DRA.Kinds, Devices: []string{"*:*"}}), sysfs)
	if len(mig) != 1 || mig[0].Device.Name != "gpu-3-0" {
		t.Fatalf("MIG devices offered: %v", mig)
	}
	gpu3 := lib.Devices[3].(*dgxa100.Device).UUID
	if a := mig[0].Device.Attributes; a["parentUUID"].StringValue == nil || *a["parentUUID"].StringValue != gpu3 ||
		a["productName"].StringValue == nil || a["resource.kubernetes.io/pcieRoot"].StringValue == nil || len(mig[0].Device.Capacity) != 0 {
		t.Errorf("MIG device 3:0: attributes %v, capacity %v", a, mig[0].Device.Capacity)
	}

	// The scheduler's allocator, over the slice nri-gpu publishes: GPU 0
	// is taken, so the pair on one root is 2 and 3, not 1 and 2.
	slice := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "node-1-gpu"}, Spec: resourceapi.ResourceSliceSpec{
		Driver: cfg.Start.DRA.DriverName, NodeName: new("node-1"), Pool: resourceapi.ResourcePool{Name: "node-1", ResourceSliceCount: 1},
	}}
	for _, d := range devs {
		slice.Spec.Devices = append(slice.Spec.Devices, d.Device)
	}
	class := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "gpu"}, Spec: resourceapi.DeviceClassSpec{
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "` + cfg.Start.DRA.DriverName + `"`}}},
	}}
	root := resourceapi.FullyQualifiedName("resource.kubernetes.io/pcieRoot")
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "pair", Namespace: "ns", UID: "uid-pair"}, Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
		Requests:    []resourceapi.DeviceRequest{{Name: "gpus", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 2}}},
		Constraints: []resourceapi.DeviceConstraint{{MatchAttribute: &root}},
	}}}
	taken := structured.AllocatedState{AllocatedDevices: sets.New(structured.MakeDeviceID(cfg.Start.DRA.DriverName, "node-1", "gpu-0"))}
	alloc, err := structured.NewAllocator(context.Background(), structured.Features{}, taken, classes{class}, []*resourceapi.ResourceSlice{slice}, cel.NewCache(10, cel.Features{}))
	if err != nil {
		t.Fatal(err)
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}}
	results, err := alloc.Allocate(context.Background(), node, []*resourceapi.ResourceClaim{claim})
	if err != nil || len(results) != 1 {
		t.Fatalf("allocated %v, %v", results, err)
	}
	var got []string
	for _, r := range results[0].Devices.Results {
		got = append(got, r.Device)
	}
	if strings.Join(got, ",") != "gpu-2,gpu-3" {
		t.Errorf("a pair on one PCIe root, GPU 0 taken: got %v, want gpu-2,gpu-3", got)
	}

	// A GPU NVML finds lost stays in the slice, tainted: the scheduler's
	// allocator (taints on) passes over it, and a claim of all four
	// finds three.
	lib.Devices[1].(*dgxa100.Device).GetUUIDFunc = func() (string, nvml.Return) { return "", nvml.ERROR_GPU_IS_LOST }
	p.CheckHealth()
	slice.Spec.Devices = nil
	var offered []string
	for _, d := range offer(t, p.DRAView(cfg.Start.DRA), sysfs) {
		offered = append(offered, d.Device.Name)
		var taints []string
		for _, tn := range d.Device.Taints {
			taints = append(taints, fmt.Sprintf("%s=%s:%s", tn.Key, tn.Value, tn.Effect))
		}
		want := ""
		if d.Device.Name == "gpu-1" {
			want = "gpu.nri-gpu.io/gpu-lost=:NoSchedule"
		}
		if got := strings.Join(taints, ","); got != want {
			t.Errorf("%s tainted %q, want %q", d.Device.Name, got, want)
		}
		slice.Spec.Devices = append(slice.Spec.Devices, d.Device)
	}
	if strings.Join(offered, ",") != "gpu-0,gpu-1,gpu-2,gpu-3" {
		t.Errorf("with GPU 1 lost, offered %v", offered)
	}
	claimOf := func(n int64) *resourceapi.ResourceClaim {
		return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "n", Namespace: "ns", UID: "uid-n"}, Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "gpus", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: n}}},
		}}}
	}
	alloc, err = structured.NewAllocator(context.Background(), structured.Features{DeviceTaints: true}, structured.AllocatedState{}, classes{class}, []*resourceapi.ResourceSlice{slice}, cel.NewCache(10, cel.Features{}))
	if err != nil {
		t.Fatal(err)
	}
	if results, err := alloc.Allocate(context.Background(), node, []*resourceapi.ResourceClaim{claimOf(4)}); err == nil && len(results) > 0 {
		t.Errorf("four GPUs allocated with GPU 1 tainted: %v", results[0].Devices.Results)
	}
	results, err = alloc.Allocate(context.Background(), node, []*resourceapi.ResourceClaim{claimOf(3)})
	if err != nil || len(results) != 1 {
		t.Fatalf("three of the healthy GPUs: %v, %v", results, err)
	}
	got = nil
	for _, r := range results[0].Devices.Results {
		got = append(got, r.Device)
	}
	if strings.Join(got, ",") != "gpu-0,gpu-2,gpu-3" {
		t.Errorf("allocated %v, want the three healthy GPUs", got)
	}
}

// classes lists DeviceClasses for the allocator.
type classes []*resourceapi.DeviceClass

func (c classes) List() ([]*resourceapi.DeviceClass, error) { return c, nil }

func (c classes) Get(name string) (*resourceapi.DeviceClass, error) {
	for _, dc := range c {
		if dc.Name == name {
			return dc, nil
		}
	}
	return nil, fmt.Errorf("no DeviceClass %q", name)
}
