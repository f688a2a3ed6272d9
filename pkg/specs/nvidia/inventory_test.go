package nvidia_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/specs/nvidia"
)

// TestDiscoverAttributes: what Discover tells of each GPU for the DRA
// driver's attributes: go-nvlib's brand, architecture and compute
// capability, and the PCI address as sysfs names it, or nothing where
// NVML does not answer.
func TestDiscoverAttributes(t *testing.T) {
	tests := []struct {
		name, busID string
		pciFails    bool
		want        string
	}{
		{name: "NVML's 8-digit domain, upper case", busID: "00000000:3B:00.0", want: "0000:3b:00.0"},
		{name: "a 4-digit domain", busID: "0001:af:00.0", want: "0001:af:00.0"},
		{name: "a 5-digit domain", busID: "10001:af:00.0", want: "0001:af:00.0"},
		{name: "no domain", busID: "af00", want: "af00"},
		{name: "no colon at all, long", busID: "abcdef012", want: "abcdef012"},
		{name: "NVML does not answer", busID: "0000:3b:00.0", pciFails: true, want: ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			lib := testutil.NVML(1)
			dev := lib.Devices[0].(*dgxa100.Device)
			dev.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
				if tc.pciFails {
					return nvml.PciInfo{}, nvml.ERROR_NOT_SUPPORTED
				}
				return testutil.PCI(tc.busID), nvml.SUCCESS
			}
			inv, err := nvidia.Discover(lib)
			if err != nil {
				t.Fatal(err)
			}
			g := inv.GPUs[0]
			if g.PCIBusID != tc.want {
				t.Errorf("PCI address %q, want %q", g.PCIBusID, tc.want)
			}
			if g.Brand != "Nvidia" || g.Architecture != "Ampere" || g.CUDAComputeCapability != "8.0" || g.MemoryBytes != 40<<30 {
				t.Errorf("brand %q, architecture %q, compute capability %q, memory %d", g.Brand, g.Architecture, g.CUDAComputeCapability, g.MemoryBytes)
			}
		})
	}
}

// TestDescribe: what a generated spec is said to be of: the driver, each
// GPU with its MIG devices, the control nodes present under the driver
// root, the driver files mounted; "none" where there is nothing.
func TestDescribe(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "dev"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"nvidiactl", "nvidia-uvm"} {
		if err := os.WriteFile(filepath.Join(root, "dev", n), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	full := &nvidia.Inventory{DriverVersion: "550.54.15", GPUs: []nvidia.GPU{
		{UUID: "GPU-a", MIGs: []nvidia.MIG{{UUID: "MIG-b"}, {UUID: "MIG-c"}}},
		{UUID: "GPU-d"},
	}}
	mounts := &cdispec.Spec{ContainerEdits: cdispec.ContainerEdits{Mounts: []*cdispec.Mount{{}, {}}}}
	for _, tc := range []struct {
		name string
		inv  *nvidia.Inventory
		spec *cdispec.Spec
		root string
		want string
	}{
		{"GPUs, MIG devices, nodes, files", full, mounts, root,
			"driver 550.54.15, GPUs GPU-a+MIG-b+MIG-c, GPU-d, control nodes nvidiactl nvidia-uvm, 2 driver files"},
		{"nothing", &nvidia.Inventory{DriverVersion: "1"}, &cdispec.Spec{}, t.TempDir(),
			"driver 1, GPUs none, control nodes none, 0 driver files"},
	} {
		if got := nvidia.Describe(tc.inv, tc.spec, tc.root); got != tc.want {
			t.Errorf("%s: got %q, want %q", tc.name, got, tc.want)
		}
	}
}
