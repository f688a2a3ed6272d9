package nvidia_test

import (
	"fmt"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
	"github.com/nri-gpu/nri-gpu/pkg/specs/nvidia"
)

// withTopology gives the mock's GPUs PCI addresses, NVLinks (each GPU
// joined to every other of its island by two links) and a common
// ancestor for every pair.
func withTopology(s *dgxa100.Server, island func(i int) int, ancestor func(i, j int) nvml.GpuTopologyLevel) {
	pci := func(i int) nvml.PciInfo { return testutil.PCI(fmt.Sprintf("00000000:%02X:00.0", 0x10+i)) }
	index := map[nvml.Device]int{}
	for i, d := range s.Devices {
		index[d] = i
	}
	for i, d := range s.Devices {
		dev := d.(*dgxa100.Device)
		var peers []int
		for j := range s.Devices {
			if j != i && island != nil && island(i) == island(j) {
				peers = append(peers, j, j) // two links to each
			}
		}
		dev.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) { return pci(i), nvml.SUCCESS }
		dev.GetNvLinkStateFunc = func(link int) (nvml.EnableState, nvml.Return) {
			if link >= len(peers) {
				return 0, nvml.ERROR_INVALID_ARGUMENT
			}
			return nvml.FEATURE_ENABLED, nvml.SUCCESS
		}
		dev.GetNvLinkRemotePciInfoFunc = func(link int) (nvml.PciInfo, nvml.Return) { return pci(peers[link]), nvml.SUCCESS }
		dev.GetTopologyCommonAncestorFunc = func(o nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) {
			return ancestor(i, index[o]), nvml.SUCCESS
		}
	}
}

func gpu(i int) string { return nvidia.GPUNode(i) }

func TestDiscoverTopology(t *testing.T) {
	tests := []struct {
		name     string
		gpus     int
		island   func(i int) int
		ancestor func(i, j int) nvml.GpuTopologyLevel
		want     map[[2]int]int
	}{
		{
			name: "two NVLink islands", gpus: 8, island: func(i int) int { return i / 4 },
			ancestor: func(i, j int) nvml.GpuTopologyLevel { return nvml.TOPOLOGY_SYSTEM },
			want:     map[[2]int]int{{0, 1}: nvidia.ScoreNVLink + 2, {2, 3}: nvidia.ScoreNVLink + 2, {0, 4}: nvidia.ScoreSystem, {3, 7}: nvidia.ScoreSystem, {4, 7}: nvidia.ScoreNVLink + 2},
		},
		{
			name: "PCIe across two sockets", gpus: 4,
			ancestor: func(i, j int) nvml.GpuTopologyLevel {
				if i%2 == j%2 {
					return nvml.TOPOLOGY_NODE
				}
				return nvml.TOPOLOGY_SYSTEM
			},
			want: map[[2]int]int{{0, 2}: nvidia.ScoreNUMA, {1, 3}: nvidia.ScoreNUMA, {0, 1}: nvidia.ScoreSystem, {2, 3}: nvidia.ScoreSystem},
		},
		{
			name: "one PCIe switch, one host bridge", gpus: 4,
			ancestor: func(i, j int) nvml.GpuTopologyLevel {
				if i/2 == j/2 {
					return nvml.TOPOLOGY_SINGLE
				}
				return nvml.TOPOLOGY_HOSTBRIDGE
			},
			want: map[[2]int]int{{0, 1}: nvidia.ScoreSwitch, {2, 3}: nvidia.ScoreSwitch, {1, 2}: nvidia.ScoreHostBridge},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := server(tc.gpus)
			withTopology(s, tc.island, tc.ancestor)
			topo, err := nvidia.DiscoverTopology(s)
			if err != nil {
				t.Fatal(err)
			}
			for pair, want := range tc.want {
				if got := topo.Score(gpu(pair[0]), gpu(pair[1])); got != want {
					t.Errorf("GPUs %d and %d score %d, want %d", pair[0], pair[1], got, want)
				}
				if got := topo.Score(gpu(pair[1]), gpu(pair[0])); got != want {
					t.Errorf("GPUs %d and %d (the other way round) score %d, want %d", pair[1], pair[0], got, want)
				}
			}
		})
	}
}

// TestLinks: CDI devices are scored by their GPU node; MIG devices of one
// GPU are closest of all; devices that are no NVIDIA GPU score 0.
func TestLinks(t *testing.T) {
	topo := nvidia.Topology{{gpu(0), gpu(1)}: nvidia.ScoreNVLink + 4}
	dev := func(nodes ...string) specs.Device { return specs.Device{Nodes: nodes} }
	for _, tc := range []struct {
		a, b specs.Device
		want int
	}{
		{dev(gpu(0)), dev(gpu(1)), nvidia.ScoreNVLink + 4},
		{dev(gpu(1)), dev(gpu(0)), nvidia.ScoreNVLink + 4},
		{dev(gpu(0), "c 511:1"), dev(gpu(0), "c 511:2"), nvidia.ScoreSameGPU},
		{dev(gpu(0)), dev(gpu(2)), 0},
		{dev("c 226:128"), dev(gpu(0)), 0},
		{dev(specs.NodeID("c", nvidia.Major, 255)), dev(gpu(0)), 0}, // nvidiactl is no GPU
	} {
		if got := topo.Links(tc.a, tc.b); got != tc.want {
			t.Errorf("Links(%v, %v) = %d, want %d", tc.a.Nodes, tc.b.Nodes, got, tc.want)
		}
	}
}
