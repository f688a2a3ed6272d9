package dra_test

import (
	"io/fs"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/nri-gpu/nri-gpu/pkg/dra"
	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
)

func str(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: &s} }
func num(n int64) resourceapi.DeviceAttribute  { return resourceapi.DeviceAttribute{IntValue: &n} }
func ver(v string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{VersionValue: &v} }

// sysfs has GPU 0000:3b:00.0 under PCIe root pci0000:3a, as
// /sys/bus/pci/devices links it.
var sysfs = fstest.MapFS{
	"devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0": {Mode: fs.ModeDir | 0o755},
	"bus/pci/devices/0000:3b:00.0":                 {Data: []byte("../../../devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0"), Mode: fs.ModeSymlink},
}

func TestDevice(t *testing.T) {
	mem := resource.NewQuantity(80<<30, resource.BinarySI)
	tests := []struct {
		name string
		info link.Info
		want resourceapi.Device
	}{{
		name: "a GPU from its spec only: what the spec tells, nothing made up",
		info: link.Info{Kind: "nvidia.com/gpu", Name: "0", Type: link.TypeGPU, Index: 0, Minor: 0, UUID: "GPU-abc"},
		want: resourceapi.Device{Name: "gpu-0", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"type": str("gpu"), "index": num(0), "minor": num(0), "uuid": str("GPU-abc"),
		}},
	}, {
		name: "a GPU NVML tells of, named by its minor as NVIDIA's driver names it",
		info: link.Info{Kind: "nvidia.com/gpu", Name: "1", Type: link.TypeGPU, Index: 1, Minor: 3, UUID: "GPU-def",
			ProductName: "NVIDIA H100 80GB HBM3", Brand: "Nvidia", Architecture: "Hopper", DriverVersion: "550.54.15",
			CUDAComputeCapability: "9.0", PCIBusID: "0000:3b:00.0", MemoryBytes: 80 << 30},
		want: resourceapi.Device{Name: "gpu-3", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"type": str("gpu"), "index": num(1), "minor": num(3), "uuid": str("GPU-def"),
			"productName": str("NVIDIA H100 80GB HBM3"), "brand": str("Nvidia"), "architecture": str("Hopper"),
			"driverVersion": ver("550.54.15"), "cudaComputeCapability": ver("9.0.0"), "pcieBusID": str("0000:3b:00.0"),
			"resource.kubernetes.io/pciBusID": str("0000:3b:00.0"), "resource.kubernetes.io/pcieRoot": str("pci0000:3a"),
		}, Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {Value: *mem}}},
	}, {
		name: "a MIG device: its parent's index and UUID",
		info: link.Info{Kind: "nvidia.com/gpu", Name: "0:1", Type: link.TypeMIG, Index: 0, Minor: 0, UUID: "MIG-1", ParentUUID: "GPU-abc", Profile: "1g.10gb"},
		want: resourceapi.Device{Name: "gpu-0-1", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"type": str("mig"), "index": num(0), "minor": num(0), "uuid": str("MIG-1"), "parentUUID": str("GPU-abc"), "profile": str("1g.10gb"),
		}},
	}, {
		name: "a device of another kind: its class and name as a DNS label, no attributes",
		info: link.Info{Kind: "vendor.com/fpga", Name: "Card_A.1", Index: -1, Minor: -1},
		want: resourceapi.Device{Name: "fpga-card-a-1", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}},
	}, {
		name: "a GPU named by UUID, minor 0: named by its minor",
		info: link.Info{Kind: "nvidia.com/gpu", Name: "GPU-abc", Type: link.TypeGPU, Index: -1, Minor: 0},
		want: resourceapi.Device{Name: "gpu-0", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"type": str("gpu"), "minor": num(0)}},
	}, {
		name: "a GPU whose minor is unknown: named from the CDI name",
		info: link.Info{Kind: "nvidia.com/gpu", Name: "GPU-ABC", Type: link.TypeGPU, Index: -1, Minor: -1},
		want: resourceapi.Device{Name: "gpu-gpu-abc", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"type": str("gpu")}},
	}, {
		name: "a name longer than a label: cut to 63",
		info: link.Info{Kind: "vendor.com/x", Name: "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-bbbb", Index: -1, Minor: -1},
		want: resourceapi.Device{Name: "x-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}},
	}, {
		name: "a name longer than a label, cut within a word: 63 characters",
		info: link.Info{Kind: "vendor.com/x", Name: strings.Repeat("a", 70), Index: -1, Minor: -1},
		want: resourceapi.Device{Name: "x-" + strings.Repeat("a", 61), Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}},
	}, {
		name: "versions NVML gives that are not versions, a bus ID not in sysfs: left out",
		info: link.Info{Kind: "nvidia.com/gpu", Name: "0", Type: link.TypeGPU, Index: 0, Minor: 0, DriverVersion: "unknown", CUDAComputeCapability: "n/a", PCIBusID: "0000:99:00.0"},
		want: resourceapi.Device{Name: "gpu-0", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"type": str("gpu"), "index": num(0), "minor": num(0), "pcieBusID": str("0000:99:00.0"), "resource.kubernetes.io/pciBusID": str("0000:99:00.0"),
		}},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := dra.DeviceOf(tc.info, sysfs)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("device (-want +got):\n%s", diff)
			}
			if len(got.Name) > 63 {
				t.Errorf("name %q is longer than a DNS label", got.Name)
			}
		})
	}
}

// TestOffer: a shared device's capacities are published as the API
// server accepts them (every amount within the value, a step only where
// one fits between the minimum and the value), and a device without
// known memory offers shares only.
func TestOffer(t *testing.T) {
	const gi = int64(1) << 30
	tests := []struct {
		name           string
		offer          policy.Capacity
		shares, memory string // "value default min max step"
	}{
		{"memory and shares", policy.Capacity{Shares: 4, Memory: 80 * gi, Default: 20 * gi, Minimum: gi, Maximum: 80 * gi, Step: gi},
			"4 1 1 4 1", "80Gi 20Gi 1Gi 80Gi 1Gi"},
		{"one share, no room for a step", policy.Capacity{Shares: 1, Memory: 20 * gi, Default: 20 * gi, Minimum: 20 * gi, Maximum: 20 * gi, Step: gi},
			"1 1 1 1 -", "20Gi 20Gi 20Gi 20Gi -"},
		{"memory unknown", policy.Capacity{Shares: 2}, "2 1 1 2 1", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := dra.DeviceOf(link.Info{Kind: "nvidia.com/gpu", Name: "0", Type: link.TypeGPU, Minor: 0, MemoryBytes: uint64(80 * gi), Offer: &tc.offer}, nil)
			if d.AllowMultipleAllocations == nil || !*d.AllowMultipleAllocations {
				t.Error("not published for several claims")
			}
			describe := func(name resourceapi.QualifiedName) string {
				c, ok := d.Capacity[name]
				if !ok {
					return ""
				}
				r := c.RequestPolicy.ValidRange
				step := "-"
				if r.Step != nil {
					step = r.Step.String()
				}
				return strings.Join([]string{c.Value.String(), c.RequestPolicy.Default.String(), r.Min.String(), r.Max.String(), step}, " ")
			}
			if got := describe(dra.CapacityShares); got != tc.shares {
				t.Errorf("shares %q, want %q", got, tc.shares)
			}
			if got := describe(dra.CapacityMemory); got != tc.memory {
				t.Errorf("memory %q, want %q (the GPU's memory is no capacity of its own once shared)", got, tc.memory)
			}
		})
	}
}
