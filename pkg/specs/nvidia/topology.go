package nvidia

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// Major is the character device major of NVIDIA's GPU nodes (/dev/nvidiaN).
const Major = 195

// Link scores, higher is closer: NVLink (plus the number of links), then
// NVML's common ancestor of the pair, from the same board down to across
// CPU sockets.
const (
	ScoreNVLink     = 100
	ScoreBoard      = 60 // TOPOLOGY_INTERNAL: the same board
	ScoreSwitch     = 50 // TOPOLOGY_SINGLE: one PCIe switch
	ScoreSwitches   = 40 // TOPOLOGY_MULTIPLE: several PCIe switches
	ScoreHostBridge = 30 // TOPOLOGY_HOSTBRIDGE: one host bridge
	ScoreNUMA       = 20 // TOPOLOGY_NODE: one NUMA node
	ScoreSystem     = 10 // TOPOLOGY_SYSTEM: across CPU sockets
)

var ancestorScore = map[nvml.GpuTopologyLevel]int{
	nvml.TOPOLOGY_INTERNAL:   ScoreBoard,
	nvml.TOPOLOGY_SINGLE:     ScoreSwitch,
	nvml.TOPOLOGY_MULTIPLE:   ScoreSwitches,
	nvml.TOPOLOGY_HOSTBRIDGE: ScoreHostBridge,
	nvml.TOPOLOGY_NODE:       ScoreNUMA,
	nvml.TOPOLOGY_SYSTEM:     ScoreSystem,
}

// GPUNode is how a specs.Device names the /dev/nvidia<minor> node of a GPU.
func GPUNode(minor int) string { return specs.NodeID("c", Major, int64(minor)) }

// gpuHandle is a GPU as NVML knows it, and its device node.
type gpuHandle struct {
	dev  nvml.Device
	node string
}

// gpuHandles returns every GPU NVML (initialized) sees, with its node.
func gpuHandles(lib nvml.Interface) ([]gpuHandle, error) {
	count, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("NVML: device count: %w", ret)
	}
	var out []gpuHandle
	for i := 0; i < count; i++ {
		d, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("NVML: GPU %d: %w", i, ret)
		}
		minor, ret := d.GetMinorNumber()
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("NVML: GPU %d: minor number: %w", i, ret)
		}
		out = append(out, gpuHandle{dev: d, node: GPUNode(minor)})
	}
	return out, nil
}

// Topology is how closely each pair of a node's GPUs is connected, by the
// GPUs' device nodes (specs.NodeID of /dev/nvidiaN).
type Topology map[[2]string]int

// Score returns the score of the pair of GPU nodes a and b, 0 if unknown.
func (t Topology) Score(a, b string) int {
	if a > b {
		a, b = b, a
	}
	return t[[2]string{a, b}]
}

// DiscoverTopology asks NVML how each pair of GPUs is connected: by
// NVLink (how many links join them), else through which PCIe or CPU
// level they meet.
func DiscoverTopology(lib nvml.Interface) (Topology, error) {
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("%w: %w", ErrNVML, ret)
	}
	defer lib.Shutdown()
	handles, err := gpuHandles(lib)
	if err != nil {
		return nil, err
	}
	busIDs := make([]string, len(handles))
	for i, h := range handles {
		if pci, ret := h.dev.GetPciInfo(); ret == nvml.SUCCESS {
			busIDs[i] = busID(pci)
		}
	}
	t := Topology{}
	for i := range handles {
		for j := i + 1; j < len(handles); j++ {
			a, b := handles[i], handles[j]
			score := 0
			if links := nvlinks(a.dev, busIDs[j]); links > 0 {
				score = ScoreNVLink + links
			} else if level, ret := a.dev.GetTopologyCommonAncestor(b.dev); ret == nvml.SUCCESS {
				score = ancestorScore[level]
			}
			key := [2]string{a.node, b.node}
			if key[0] > key[1] {
				key[0], key[1] = key[1], key[0]
			}
			t[key] = score
		}
	}
	return t, nil
}

// nvlinks counts the active NVLinks of d whose far end is the GPU at
// peer (its PCI address).
func nvlinks(d nvml.Device, peer string) int {
	if peer == "" {
		return 0
	}
	n := 0
	for link := 0; link < nvml.NVLINK_MAX_LINKS; link++ {
		state, ret := d.GetNvLinkState(link)
		if ret != nvml.SUCCESS {
			break // no more links, or none at all
		}
		if state != nvml.FEATURE_ENABLED {
			continue
		}
		if pci, ret := d.GetNvLinkRemotePciInfo(link); ret == nvml.SUCCESS && busID(pci) == peer {
			n++
		}
	}
	return n
}

// busID returns a PCI address as NVML writes it, lower-cased.
func busID(pci nvml.PciInfo) string {
	var b []byte
	for _, c := range pci.BusId {
		if c == 0 {
			break
		}
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		b = append(b, byte(c))
	}
	return string(b)
}

// ScoreSameGPU scores two devices on one GPU (MIG devices of one parent):
// closer than any link, so that MIG devices pack onto few GPUs.
const ScoreSameGPU = 200

// Links scores how closely two CDI devices are connected, by the NVIDIA
// GPU node among each one's own device nodes (a MIG device's is its
// parent's): ScoreSameGPU for one GPU, the pair's score for two, 0 when
// either is no NVIDIA GPU or the pair is unknown.
func (t Topology) Links(a, b specs.Device) int {
	ga, gb := gpuNode(a), gpuNode(b)
	switch {
	case ga == "" || gb == "":
		return 0
	case ga == gb:
		return ScoreSameGPU
	}
	return t.Score(ga, gb)
}

// gpuNode returns the /dev/nvidiaN node of a device's footprint, or "".
func gpuNode(d specs.Device) string {
	for _, n := range d.Nodes {
		var minor int64
		if _, err := fmt.Sscanf(n, "c 195:%d", &minor); err == nil && minor < 254 { // 254: modeset, 255: nvidiactl
			return n
		}
	}
	return ""
}
