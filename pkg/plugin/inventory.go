package plugin

// The node's hardware as nri-gpu knows it, one inventory for every door
// (the NRI side, the device plugin, DRA, MPS): what exists (the trusted
// specs' devices, one name per piece of hardware), what NVML says of it
// (facts, health, topology), and what is free (the pool's room for it,
// through the door that asks).

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/sirupsen/logrus"
	"tags.cncf.io/container-device-interface/pkg/parser"

	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
	"github.com/nri-gpu/nri-gpu/pkg/specs/nvidia"
)

// inventory is what NVML says of the node's GPUs: facts and topology,
// asked once, and health, watched; and what of it the specs' devices
// are (which GPU, MIG or not, their nodes on the host).
type inventory struct {
	log logrus.FieldLogger
	// nvml, when set, replaces the driver's NVML under driverRoot
	// (tests).
	nvml       nvml.Interface
	driverRoot string

	gpusOnce sync.Once
	// gpuFacts is what NVML says of the GPUs, by minor; nil without NVML.
	gpuFacts map[int]gpuInfo

	topologyOnce sync.Once
	// topology is nil where NVML cannot be had.
	topology nvidia.Topology
	// health watches the NVIDIA GPUs; nil where NVML cannot be had.
	health atomic.Pointer[nvidia.Monitor]
}

// policyIn returns st's policy as snap shows the hardware: the names
// each device goes by there, and each GPU's memory (NVML): what a
// decision reads, from that snapshot alone.
func (inv *inventory) policyIn(st *state, snap *specs.Snapshot) *policy.Policy {
	return st.policy.WithAliases(snap.Aliases).WithMemory(func(d specs.Device) int64 { return inv.memoryOf(snap, d) })
}

// unhealthy says why a device of snap is unhealthy (its device nodes
// gone from the host, NVML's verdict on its GPU), or nil: the one
// account of health, which the admission reads for every door (a
// request by name, a claim, a count's candidates, the device plugin's
// offers) and DRA's taints read too (sickness). A device snap does not
// have (the runtime's own) is healthy as far as nri-gpu knows.
func (inv *inventory) unhealthy(snap *specs.Snapshot) func(specs.Device) error {
	m := inv.health.Load()
	return func(d specs.Device) error {
		if nodesGone(snap, d.Name) {
			return errNodesGone
		}
		if m != nil {
			return m.Unhealthy(d)
		}
		return nil
	}
}

// errNodesGone says a device's nodes are not on the host.
var errNodesGone = errors.New("its device nodes are not on the host")

// lib returns the NVML spec generation, health, topology and compute
// modes ask: the one given (tests), else the driver's under driverRoot.
func (inv *inventory) lib() nvml.Interface {
	if inv.nvml != nil {
		return inv.nvml
	}
	return nvidia.Library(inv.driverRoot)
}

// CheckHealth looks once at the NVIDIA GPUs' health (a GPU a check finds
// lost), for a plugin that does not Serve (nri-gpu explain); without
// NVML it does nothing.
func (p *Plugin) CheckHealth() {
	m, err := nvidia.NewMonitor(p.hw.lib())
	if err != nil {
		return
	}
	m.Check()
	m.Close() // what it found stays
	p.hw.health.Store(m)
}

// watchHealth watches the NVIDIA GPUs' health through NVML as h says
// until ctx is done, calling changed with how many are unhealthy after
// each change; without NVML it says that it takes every GPU as healthy.
// When NVML stops answering for the driver loaded (its kernel module
// reloaded) it is opened again; where this process cannot load the new
// driver's NVML (still the old one: a version mismatch), stop ends
// serving with ErrDriverChanged, so that nri-gpu starts again with it,
// as spec generation does.
func (inv *inventory) watchHealth(ctx context.Context, h config.Health, changed func(unhealthy int), stop context.CancelCauseFunc) {
	m, err := nvidia.NewMonitor(inv.lib())
	if err != nil {
		inv.log.Infof("GPU health not watched (%v): every device is taken as healthy", err)
		return
	}
	defer m.Close()
	m.RecoverAfter = h.RecoverAfter
	m.OnChange = func(node, why string) {
		if why != "" {
			inv.log.WithField("gpu", node).Warnf("GPU unhealthy: %s", why)
		} else {
			inv.log.WithField("gpu", node).Info("GPU healthy again")
		}
		changed(len(m.Unhealthies()))
	}
	m.OnReopen = func(cause, err error) {
		switch {
		case errors.Is(err, nvml.ERROR_LIB_RM_VERSION_MISMATCH):
			inv.log.Warnf("the NVIDIA driver changed under this process's NVML (GPU health: %v): starting again to load the new driver's", err)
			stop(fmt.Errorf("%w: %w", ErrDriverChanged, err))
		case err != nil:
			inv.log.Warnf("GPU health not watched until NVML opens again (it answered %v; tried at each check): %v", cause, err)
		default:
			inv.log.Infof("NVML answered %v for the GPUs it had (the NVIDIA driver reloaded): opened it again, watching the GPUs' health again", cause)
		}
	}
	inv.health.Store(m)
	defer inv.health.Store(nil)
	inv.log.Infof("watching the health of NVIDIA GPUs (critical Xid events, a check every %s)", h.Interval)
	m.Run(ctx, h.Interval)
}

// links returns how closely two devices are connected, from the GPU
// topology NVML reports (asked once), or nil where NVML cannot be had:
// count requests then take free devices in spec order.
func (inv *inventory) links() func(a, b specs.Device) int {
	inv.topologyOnce.Do(func() {
		t, err := nvidia.DiscoverTopology(inv.lib())
		if err != nil {
			inv.log.Infof("GPU topology unknown (%v): count requests take free devices in spec order", err)
			return
		}
		inv.log.Infof("GPU topology of %d pairs known: count requests take the most closely connected free devices", len(t))
		inv.topology = t
	})
	if inv.topology == nil {
		return nil
	}
	return inv.topology.Links
}

// gpuInfo is what NVML says of a GPU.
type gpuInfo struct {
	nvidia.GPU
	driverVersion string
}

var (
	gpuNode = regexp.MustCompile(`^/dev/nvidia([0-9]+)$`)
	migName = regexp.MustCompile(`^([0-9]+):([0-9]+)$`)
)

// deviceInfo returns what is known of a device: from its spec (its name, its
// other names, its device nodes) and, for an NVIDIA GPU, NVML.
func (p *Plugin) deviceInfo(snap *specs.Snapshot, kind string, d specs.Device) link.Info {
	_, _, name := parser.ParseDevice(d.Name)
	info := link.Info{Kind: kind, Name: name, Index: -1, Minor: minorOf(snap, d.Name)}
	nv := kind == config.DefaultKind
	if !nv {
		return info
	}
	info.UUID = uuidOf(snap, d)
	index, mig := indexOf(name, info.UUID)
	info.Index, info.Type = index, link.TypeGPU
	if mig {
		info.Type = link.TypeMIG
	}
	// A MIG device's node /dev/nvidiaN is its GPU's: it has the GPU's
	// product, versions and PCI address (as NVIDIA's DRA driver gives
	// them), its own UUID and memory.
	if g, ok := p.hw.gpus()[info.Minor]; ok {
		info.ProductName, info.Brand, info.Architecture = g.Model, g.Brand, g.Architecture
		info.DriverVersion, info.CUDAComputeCapability = g.driverVersion, g.CUDAComputeCapability
		info.PCIBusID = g.PCIBusID
		if info.Type == link.TypeMIG {
			info.ParentUUID = g.UUID
		} else {
			info.MemoryBytes = g.MemoryBytes
			if info.UUID == "" {
				info.UUID = g.UUID
			}
		}
	}
	return info
}

// indexOf returns the index of the NVIDIA GPU that a device named name
// (within its kind) with UUID uuid ("" if unknown) is or is a MIG device
// of (-1 when its name does not say), and whether it is a MIG device:
// named "GPU:MIG" as nvidia-ctk names them, or by a MIG- UUID.
func indexOf(name, uuid string) (index int, mig bool) {
	if m := migName.FindStringSubmatch(name); m != nil {
		i, _ := strconv.Atoi(m[1])
		return i, true
	}
	if strings.HasPrefix(uuid, "MIG-") {
		return -1, true
	}
	if i, err := strconv.Atoi(name); err == nil {
		return i, false
	}
	return -1, false
}

// gpus returns what NVML says of the GPUs (asked once), by minor; nil
// where NVML cannot be had.
func (inv *inventory) gpus() map[int]gpuInfo {
	inv.gpusOnce.Do(func() {
		found, err := nvidia.Discover(inv.lib())
		if err != nil {
			inv.log.Infof("GPU facts from the CDI specs only (%v)", err)
			return
		}
		inv.gpuFacts = map[int]gpuInfo{}
		for _, g := range found.GPUs {
			inv.gpuFacts[g.Minor] = gpuInfo{g, found.DriverVersion}
		}
	})
	return inv.gpuFacts
}

// memoryOf returns the memory of a whole GPU as NVML tells it, or 0 (a
// MIG device, another kind of device, no NVML).
func (inv *inventory) memoryOf(snap *specs.Snapshot, d specs.Device) int64 {
	_, _, name := parser.ParseDevice(d.Name)
	if _, mig := indexOf(name, uuidOf(snap, d)); mig {
		return 0
	}
	return int64(inv.gpus()[minorOf(snap, d.Name)].MemoryBytes)
}

// minorOf returns the minor of the NVIDIA GPU node (/dev/nvidiaN) the
// named device's spec gives it, or -1.
func minorOf(snap *specs.Snapshot, name string) int {
	minor := -1
	if e, err := snap.Lookup(name); err == nil {
		for _, n := range e.Device.ContainerEdits.DeviceNodes {
			if m := gpuNode.FindStringSubmatch(n.Path); m != nil {
				minor, _ = strconv.Atoi(m[1])
			}
		}
	}
	return minor
}

// uuidOf returns the UUID a device is named by (GPU-..., MIG-...): its
// own name, or another name its hardware goes by in its kind, or "".
func uuidOf(snap *specs.Snapshot, d specs.Device) string {
	vendor, class, _ := parser.ParseDevice(d.Name)
	names := append([]string{d.Name}, snap.Aliases(d)...)
	for _, name := range names {
		v, c, n := parser.ParseDevice(name)
		if v == vendor && c == class && (strings.HasPrefix(n, "GPU-") || strings.HasPrefix(n, "MIG-")) {
			return n
		}
	}
	return ""
}

// hardware returns the devices of kind whose names match globs and that
// policy.devices allows, one name per piece of hardware (the first of a
// GPU's names: its index before its UUID; one that shares hardware with
// a device of seen is left out), never "all".
func (st *state) hardware(snap *specs.Snapshot, kind string, globs []string, seen []specs.Device) []specs.Device {
	var out []specs.Device
	for _, c := range snap.Candidates(kind) {
		_, _, id := parser.ParseDevice(c.Name)
		if !policy.MatchAny(globs, id) || !st.policy.Allowed(c.Name) || specs.OverlapsAny(c, seen) || specs.OverlapsAny(c, out) {
			continue
		}
		out = append(out, c)
	}
	return out
}

// sickness returns why device d is unhealthy, or nil, as unhealthy
// says it, for DRA's taints: its device nodes are not on the host, or
// NVML found its GPU lost or with a critical Xid error.
func (inv *inventory) sickness(snap *specs.Snapshot, d specs.Device) *link.Health {
	if nodesGone(snap, d.Name) {
		return &link.Health{Problem: link.ProblemGone, Reason: errNodesGone.Error()}
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
// device nodes is not on the host now.
func nodesGone(snap *specs.Snapshot, name string) bool {
	e, err := snap.Lookup(name)
	if err != nil {
		return false
	}
	for _, n := range e.Device.ContainerEdits.DeviceNodes {
		if _, err := os.Stat(specs.HostPath(n)); err != nil {
			return true
		}
	}
	return false
}
