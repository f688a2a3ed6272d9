// Package inventory is the node's hardware as nri-gpu knows it, one
// account for every door (the NRI side, the device plugin, DRA, MPS,
// the metrics): what exists (the trusted specs' devices, one name per
// piece of hardware, and the MIG devices of a GPU), which GPU each is
// (its index, UUID, minor, MIG or not: Identify), what NVML says of it
// (facts, topology, health, memory), and a policy bound to one snapshot
// of the specs (PolicyIn), so that a decision reads that snapshot alone.
// It decides nothing and logs nothing: what it could not learn is said
// through its Say function.
package inventory

import (
	"errors"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
	"github.com/nri-gpu/nri-gpu/pkg/memlimit"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
	"github.com/nri-gpu/nri-gpu/pkg/specs/nvidia"
)

// Inventory is what NVML says of the node's GPUs: facts and topology,
// asked once when first needed, and health, watched while a monitor
// runs (Watching).
type Inventory struct {
	// nvml, when set, replaces the driver's NVML under driverRoot
	// (tests).
	nvml       nvml.Interface
	driverRoot string
	// say is told, once each, what NVML could not tell.
	say func(format string, args ...any)

	gpusOnce sync.Once
	// gpus is what NVML says of the GPUs, by minor; nil without NVML.
	gpus map[int]GPU

	topologyOnce sync.Once
	// topology is nil where NVML cannot be had.
	topology nvidia.Topology
	// health watches the NVIDIA GPUs; nil where NVML cannot be had.
	health atomic.Pointer[nvidia.Monitor]
	// present are the host device nodes found there, by path, and
	// when (nodesGone).
	present sync.Map

	// cgroups is where containers' cgroups are found.
	cgroups    memlimit.Cgroups
	limitsOnce sync.Once
	// limits is whether the driver can bound GPU memory per cgroup,
	// asked once (support); nil, and limitsErr why, without NVML.
	limits    *memlimit.Support
	limitsErr error
}

// presentFor is how long a host device node found there is taken to be
// there without looking again: health is asked at every request, of
// each device it names, and a node goes only with its GPU or driver; a
// node found gone is looked for at every question.
const presentFor = time.Second

// New returns the inventory of the GPUs under driverRoot, asked through
// lib where it is set (tests) and else the driver's NVML; say is told
// what NVML could not tell (logged by the caller).
func New(driverRoot string, lib nvml.Interface, say func(format string, args ...any)) *Inventory {
	return &Inventory{nvml: lib, driverRoot: driverRoot, say: say, cgroups: memlimit.Host}
}

// Lib returns the NVML spec generation, health, topology and compute
// modes ask: the one given (tests), else the driver's under driverRoot.
func (inv *Inventory) Lib() nvml.Interface {
	if inv.nvml != nil {
		return inv.nvml
	}
	return nvidia.Library(inv.driverRoot)
}

// GPU is what NVML says of a GPU.
type GPU struct {
	nvidia.GPU
	DriverVersion string
}

// GPUs returns what NVML says of the GPUs (asked once), by minor; nil
// where NVML cannot be had.
func (inv *Inventory) GPUs() map[int]GPU {
	inv.gpusOnce.Do(func() {
		found, err := nvidia.Discover(inv.Lib())
		if err != nil {
			inv.say("GPU facts from the CDI specs only (%v)", err)
			return
		}
		inv.gpus = map[int]GPU{}
		for _, g := range found.GPUs {
			inv.gpus[g.Minor] = GPU{g, found.DriverVersion}
		}
	})
	return inv.gpus
}

// Links returns how closely two devices are connected, from the GPU
// topology NVML reports (asked once), or nil where NVML cannot be had:
// count requests then take free devices in spec order.
func (inv *Inventory) Links() func(a, b specs.Device) int {
	inv.topologyOnce.Do(func() {
		t, err := nvidia.DiscoverTopology(inv.Lib())
		if err != nil {
			inv.say("GPU topology unknown (%v): count requests take free devices in spec order", err)
			return
		}
		inv.say("GPU topology of %d pairs known: count requests take the most closely connected free devices", len(t))
		inv.topology = t
	})
	if inv.topology == nil {
		return nil
	}
	return inv.topology.Links
}

// Watching makes m the monitor whose verdicts Unhealthy and Sickness
// read (nil: none, every GPU healthy).
func (inv *Inventory) Watching(m *nvidia.Monitor) { inv.health.Store(m) }

// Memory returns the memory of a whole GPU as NVML tells it, or 0 (a MIG
// device, another kind of device, no NVML).
func (inv *Inventory) Memory(snap *specs.Snapshot, d specs.Device) int64 {
	if Identify(snap, d).MIG {
		return 0
	}
	return int64(inv.GPUs()[minorOf(snap, d.Name)].MemoryBytes)
}

// PolicyIn returns pol as snap shows the hardware: the names each device
// goes by there, each GPU's memory (NVML) and whether the driver can
// bound its holders' memory: what a decision reads, from that snapshot
// alone.
func (inv *Inventory) PolicyIn(pol *policy.Policy, snap *specs.Snapshot) *policy.Policy {
	return pol.WithAliases(snap.Aliases).WithMemory(func(d specs.Device) int64 { return inv.Memory(snap, d) }).WithBounding(inv.Bounding(snap))
}

// Unhealthy says why a device of snap is unhealthy (its device nodes
// gone from the host, NVML's verdict on its GPU), or nil: the one
// account of health, which the admission reads for every door (a
// request by name, a claim, a count's candidates, the device plugin's
// offers) and DRA's taints read too (Sickness). A device snap does not
// have (the runtime's own) is healthy as far as nri-gpu knows.
func (inv *Inventory) Unhealthy(snap *specs.Snapshot) func(specs.Device) error {
	m := inv.health.Load()
	return func(d specs.Device) error {
		if inv.nodesGone(snap, d.Name) {
			return ErrNodesGone
		}
		if m != nil {
			return m.Unhealthy(d)
		}
		return nil
	}
}

// ErrNodesGone says a device's nodes are not on the host.
var ErrNodesGone = errors.New("its device nodes are not on the host")

// Sickness returns why device d is unhealthy, or nil, as Unhealthy says
// it, for DRA's taints: its device nodes are not on the host, or NVML
// found its GPU lost or with a critical Xid error.
func (inv *Inventory) Sickness(snap *specs.Snapshot, d specs.Device) *link.Health {
	if inv.nodesGone(snap, d.Name) {
		return &link.Health{Problem: link.ProblemGone, Reason: ErrNodesGone.Error()}
	}
	m := inv.health.Load()
	if m == nil {
		return nil
	}
	h, bad := m.Health(d)
	switch {
	case !bad:
		return nil
	case h.Lost:
		return &link.Health{Problem: link.ProblemLost, Reason: h.Reason}
	}
	return &link.Health{Problem: link.ProblemXid, Value: strconv.FormatUint(h.Xid, 10), Reason: h.Reason}
}

// nodesGone reports whether the named device is in snap and one of its
// device nodes is not on the host now (or, found there, presentFor ago).
func (inv *Inventory) nodesGone(snap *specs.Snapshot, name string) bool {
	e, err := snap.Lookup(name)
	if err != nil {
		return false
	}
	now := time.Now()
	for _, n := range e.Device.ContainerEdits.DeviceNodes {
		path := specs.HostPath(n)
		if at, ok := inv.present.Load(path); ok && now.Sub(at.(time.Time)) < presentFor {
			continue
		}
		if _, err := os.Stat(path); err != nil {
			inv.present.Delete(path)
			return true
		}
		inv.present.Store(path, now)
	}
	return false
}
