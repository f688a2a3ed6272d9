package nvidia_test

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
	"github.com/nri-gpu/nri-gpu/pkg/specs/nvidia"
)

// TestMIGSlots: MIG devices are looked for in the slots 0 to the
// maximum the GPU gives, less one; an empty slot does not end the search.
func TestMIGSlots(t *testing.T) {
	s := server(1)
	gpu := s.Devices[0].(*dgxa100.Device)
	gpu.MigMode = nvml.DEVICE_MIG_ENABLE
	gpu.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return 3, nvml.SUCCESS }
	gpu.GetMigDeviceHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		if i == 0 {
			return nil, nvml.ERROR_NOT_FOUND // an empty slot
		}
		// Every other slot answers, even past the maximum: only those
		// below it are asked.
		return &mock.Device{
			GetUUIDFunc:              func() (string, nvml.Return) { return "MIG-" + string(rune('0'+i)), nvml.SUCCESS },
			GetGpuInstanceIdFunc:     func() (int, nvml.Return) { return i, nvml.SUCCESS },
			GetComputeInstanceIdFunc: func() (int, nvml.Return) { return 0, nvml.SUCCESS },
		}, nvml.SUCCESS
	}
	inv, err := nvidia.Discover(s)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range inv.GPUs[0].MIGs {
		got = append(got, m.UUID)
	}
	if want := []string{"MIG-1", "MIG-2"}; !slices.Equal(got, want) {
		t.Errorf("MIG devices %v, want %v", got, want)
	}
}

// TestNVLinkCount: every one of a GPU's NVLink slots is counted (18 on
// current GPUs), and the first slot NVML refuses ends the count.
func TestNVLinkCount(t *testing.T) {
	for _, tc := range []struct {
		name string
		// state answers for a link of GPU 0.
		state func(link int) nvml.Return
		want  int
	}{
		{"all 18 links to GPU 1", func(int) nvml.Return { return nvml.SUCCESS }, nvidia.ScoreNVLink + nvml.NVLINK_MAX_LINKS},
		{"link 0 refused: none counted", func(link int) nvml.Return {
			if link == 0 {
				return nvml.ERROR_NOT_SUPPORTED
			}
			return nvml.SUCCESS
		}, nvidia.ScoreSystem},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := server(2)
			for i, d := range s.Devices[:2] {
				dev := d.(*dgxa100.Device)
				// Upper-case hex, as NVML writes it; a byte after the NUL is
				// not part of the address.
				addr := []string{"00000000:1A:00.0", "00000000:1B:00.0"}[i]
				dev.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) { return testutil.PCI(addr), nvml.SUCCESS }
				dev.GetTopologyCommonAncestorFunc = func(nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) { return nvml.TOPOLOGY_SYSTEM, nvml.SUCCESS }
			}
			gpu0 := s.Devices[0].(*dgxa100.Device)
			gpu0.GetNvLinkStateFunc = func(link int) (nvml.EnableState, nvml.Return) { return nvml.FEATURE_ENABLED, tc.state(link) }
			gpu0.GetNvLinkRemotePciInfoFunc = func(int) (nvml.PciInfo, nvml.Return) {
				return testutil.PCI("00000000:1B:00.0\x00zz"), nvml.SUCCESS
			}
			topo, err := nvidia.DiscoverTopology(s)
			if err != nil {
				t.Fatal(err)
			}
			if got := topo.Score(gpu(0), gpu(1)); got != tc.want {
				t.Errorf("score %d, want %d", got, tc.want)
			}
		})
	}
}

// TestLinksOfOtherDevices: devices that are no NVIDIA GPU (another major,
// or nvidia-modeset's minor 254) are never taken for one GPU.
func TestLinksOfOtherDevices(t *testing.T) {
	topo := nvidia.Topology{}
	dev := func(node string) specs.Device { return specs.Device{Nodes: []string{node}} }
	for _, node := range []string{"c 226:128", specs.NodeID("c", nvidia.Major, 254)} {
		if got := topo.Links(dev(node), dev(node)); got != 0 {
			t.Errorf("two devices on %s score %d, want 0", node, got)
		}
	}
	if got := topo.Links(dev(gpu(253)), dev(gpu(253))); got != nvidia.ScoreSameGPU {
		t.Errorf("two devices on GPU 253 score %d, want %d", got, nvidia.ScoreSameGPU)
	}
}

// TestWriteBesideTarget: a spec file is written through a temporary file
// in its own directory (then renamed), whatever TMPDIR is.
func TestWriteBesideTarget(t *testing.T) {
	t.Setenv("TMPDIR", filepath.Join(t.TempDir(), "absent"))
	path := filepath.Join(t.TempDir(), "nvidia.yaml")
	spec := &cdispec.Spec{Version: "0.6.0", Kind: "nvidia.com/gpu", Devices: []cdispec.Device{{Name: "0", ContainerEdits: cdispec.ContainerEdits{Env: []string{"A=1"}}}}}
	if err := nvidia.Write(spec, path, "yaml", nil); err != nil {
		t.Fatalf("writing with TMPDIR absent: %v", err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Error(err)
	}
}
