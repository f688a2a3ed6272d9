package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Node is what the metrics tell of the node's devices at a scrape: each
// device (one name per piece of hardware), what it offers, and who holds
// how much of it.
type Node struct {
	Devices []Device
}

// Device is one device of the node.
type Device struct {
	// Name is its CDI name; UUID, Index and GPUInstance are how NVIDIA's
	// DCGM exporter labels its series ("" where not known): a whole
	// GPU's UUID and index with no instance; for a MIG device, its GPU's
	// UUID and index and its GPU instance id.
	Name, UUID, Index, GPUInstance string
	// Shares and Memory (bytes) are what it offers its holders together:
	// one share for a device no policy.sharing entry shares; Memory 0
	// where memory is not counted. SharesUsed and MemoryUsed are what
	// they take of it.
	Shares, SharesUsed int
	Memory, MemoryUsed int64
	// Holders are who holds it.
	Holders []Holder
	// MPS is its MPS daemon, nil where MPS does not share it.
	MPS *MPS
}

// Holder is a holder of a device: a pod, or a DRA claim and the pods it
// was prepared for.
type Holder struct {
	// Door is how it got the device (one of the Door constants).
	Door string
	// Namespace and Pod are the pod's; Claim the claim's name, of
	// Namespace, for a claim ("" for a pod's own holding).
	Namespace, Pod, Claim string
	// Shares and Memory (bytes) are what it takes of the device.
	Shares int
	Memory int64
	// MPSCompute (percent) and MPSMemory (bytes) are the bounds MPS holds
	// its clients to, where MPS shares the device.
	MPSCompute int
	MPSMemory  int64
	// MemoryLimit (bytes) is the hard limit the driver holds its
	// containers' memory to (the largest of them), where nri-gpu set one:
	// 0 where it set none.
	MemoryLimit int64
}

// Doors a holder got its device through.
const (
	DoorAnnotation   = "annotation"    // by name: pod annotations, cdi.k8s.io, the runtime's CDI devices
	DoorCount        = "count"         // a count request
	DoorDevicePlugin = "device-plugin" // kubelet's allocation
	DoorDRA          = "dra"           // a prepared DRA claim
	DoorFound        = "found"         // found in its containers with no record of how
)

// MPS is the MPS control daemon of a device.
type MPS struct {
	// Ready says the daemon answers on its control socket (nri-gpu
	// gives the device only then).
	Ready bool
}

// Label names: UUID, gpu and GPU_I_ID are those of DCGM's exporter, so
// that its series join nri-gpu's on (UUID, GPU_I_ID), MIG devices' too.
var (
	deviceLabels = []string{"cdi_device", "UUID", "gpu", "GPU_I_ID"}
	holderLabels = append(append([]string(nil), deviceLabels...), "door", "namespace", "pod", "claim")
)

// nodeCollector asks read what the node's devices are at each scrape:
// nothing is kept between scrapes, so a holding that ends has no series
// at the next one, and the request path does no work for the metrics.
type nodeCollector struct {
	read func() Node

	shares, sharesUsed, memory, memoryUsed         *prometheus.Desc
	holder, holderShares, holderMemory             *prometheus.Desc
	mpsReady, mpsClients, mpsCompute, mpsPinnedMem *prometheus.Desc
	memoryLimit                                    *prometheus.Desc
}

func newNodeCollector(read func() Node) *nodeCollector {
	d := func(name, help string, labels []string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, nil)
	}
	return &nodeCollector{
		read:         read,
		shares:       d("nri_gpu_device_shares", "Shares a device offers its holders together: the replicas of the policy.sharing entry that shares it, 1 for one it does not.", deviceLabels),
		sharesUsed:   d("nri_gpu_device_shares_used", "Shares of a device its holders take, through every door.", deviceLabels),
		memory:       d("nri_gpu_device_memory_bytes", "Memory a shared device offers its holders together, where it is counted.", deviceLabels),
		memoryUsed:   d("nri_gpu_device_memory_used_bytes", "Memory of a shared device its holders take, where it is counted.", deviceLabels),
		holder:       d("nri_gpu_device_holder", "1 for each holder of a device: a pod, or a DRA claim and each pod it was prepared for; joins DCGM's series on (UUID, GPU_I_ID).", holderLabels),
		holderShares: d("nri_gpu_device_holder_shares", "Shares of a device one holder takes.", holderLabels),
		holderMemory: d("nri_gpu_device_holder_memory_bytes", "Memory of a shared device one holder takes, where it is counted.", holderLabels),
		mpsReady:     d("nri_gpu_mps_daemon_ready", "1 while the MPS control daemon of an MPS-shared device answers, else 0.", deviceLabels),
		mpsClients:   d("nri_gpu_mps_clients", "Holders of an MPS-shared device, each a client of its daemon.", deviceLabels),
		mpsCompute:   d("nri_gpu_mps_client_compute_percent", "The share of compute (active threads) MPS holds a holder's clients to.", holderLabels),
		mpsPinnedMem: d("nri_gpu_mps_client_pinned_memory_bytes", "The device memory MPS holds a holder's clients to.", holderLabels),
		memoryLimit:  d("nri_gpu_device_holder_memory_limit_bytes", "The GPU memory the driver holds a holder's containers to (its per-cgroup hard limit), where nri-gpu set one.", holderLabels),
	}
}

// Describe sends the descriptions of every metric.
func (c *nodeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.shares, c.sharesUsed, c.memory, c.memoryUsed, c.holder, c.holderShares, c.holderMemory, c.mpsReady, c.mpsClients, c.mpsCompute, c.mpsPinnedMem, c.memoryLimit} {
		ch <- d
	}
}

// Collect reads the node and sends its metrics.
func (c *nodeCollector) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	for _, dev := range c.read().Devices {
		l := []string{dev.Name, dev.UUID, dev.Index, dev.GPUInstance}
		gauge(c.shares, float64(dev.Shares), l...)
		gauge(c.sharesUsed, float64(dev.SharesUsed), l...)
		if dev.Memory > 0 {
			gauge(c.memory, float64(dev.Memory), l...)
			gauge(c.memoryUsed, float64(dev.MemoryUsed), l...)
		}
		if dev.MPS != nil {
			gauge(c.mpsReady, bool01(dev.MPS.Ready), l...)
			gauge(c.mpsClients, float64(len(dev.Holders)), l...)
		}
		for _, h := range holders(dev.Holders) {
			hl := append(append([]string(nil), l...), h.Door, h.Namespace, h.Pod, h.Claim)
			gauge(c.holder, 1, hl...)
			gauge(c.holderShares, float64(h.Shares), hl...)
			if dev.Memory > 0 {
				gauge(c.holderMemory, float64(h.Memory), hl...)
			}
			if h.MemoryLimit > 0 {
				gauge(c.memoryLimit, float64(h.MemoryLimit), hl...)
			}
			if dev.MPS != nil {
				gauge(c.mpsCompute, float64(h.MPSCompute), hl...)
				gauge(c.mpsPinnedMem, float64(h.MPSMemory), hl...)
			}
		}
	}
}

// holders returns hs with those of one label set (two sandboxes of a pod
// of one name, one being deleted) as one, taking what they take together:
// a scrape with a label set twice would fail whole.
func holders(hs []Holder) []Holder {
	type key struct{ door, namespace, pod, claim string }
	var out []Holder
	at := map[key]int{}
	for _, h := range hs {
		k := key{h.Door, h.Namespace, h.Pod, h.Claim}
		i, ok := at[k]
		if !ok {
			at[k] = len(out)
			out = append(out, h)
			continue
		}
		out[i].Shares += h.Shares
		out[i].Memory += h.Memory
		out[i].MPSCompute = max(out[i].MPSCompute, h.MPSCompute)
		out[i].MPSMemory = max(out[i].MPSMemory, h.MPSMemory)
		out[i].MemoryLimit = max(out[i].MemoryLimit, h.MemoryLimit)
	}
	return out
}

func bool01(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// WatchNode has every scrape tell the node's devices as read returns
// them then, read replacing the one watched before (a plugin built
// again). Like every method, it does nothing on nil Metrics (metrics
// off): read is then never called.
func (m *Metrics) WatchNode(read func() Node) {
	if m == nil {
		return
	}
	m.node.Store(&read)
	m.nodeOnce.Do(func() {
		m.registry.MustRegister(newNodeCollector(func() Node { return (*m.node.Load())() }))
	})
}
