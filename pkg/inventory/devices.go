package inventory

import (
	"regexp"
	"slices"
	"strconv"
	"strings"

	"tags.cncf.io/container-device-interface/pkg/parser"

	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

var (
	gpuNode = regexp.MustCompile(`^/dev/nvidia([0-9]+)$`)
	migName = regexp.MustCompile(`^([0-9]+):([0-9]+)$`)
)

// Identity is which NVIDIA GPU a device is, as its names say.
type Identity struct {
	// Name is its name within its kind.
	Name string
	// UUID is the UUID it is named by (GPU-..., MIG-...): its own name,
	// or another name its hardware goes by in its kind; "" when none.
	UUID string
	// Index is the index of the GPU it is or is a MIG device of, -1 when
	// its name does not say.
	Index int
	// MIG says it is a MIG device: named "GPU:MIG" as nvidia-ctk names
	// them, or by a MIG- UUID.
	MIG bool
}

// Identify returns which GPU device d of snap is.
func Identify(snap *specs.Snapshot, d specs.Device) Identity {
	_, _, name := parser.ParseDevice(d.Name)
	id := Identity{Name: name, UUID: uuidOf(snap, d), Index: -1}
	switch m := migName.FindStringSubmatch(name); {
	case m != nil:
		id.Index, _ = strconv.Atoi(m[1])
		id.MIG = true
	case strings.HasPrefix(id.UUID, "MIG-"):
		id.MIG = true
	default:
		if i, err := strconv.Atoi(name); err == nil {
			id.Index = i
		}
	}
	return id
}

// UUID returns the UUID of device d's GPU: the one it is named by, else
// NVML's for its node ("" when neither tells).
func (inv *Inventory) UUID(snap *specs.Snapshot, d specs.Device) string {
	if uuid := uuidOf(snap, d); uuid != "" {
		return uuid
	}
	return inv.GPUs()[minorOf(snap, d.Name)].UUID
}

// Info returns what is known of a device: from its spec (its name, its
// other names, its device nodes) and, for an NVIDIA GPU, NVML.
func (inv *Inventory) Info(snap *specs.Snapshot, kind string, d specs.Device) link.Info {
	id := Identify(snap, d)
	info := link.Info{Kind: kind, Name: id.Name, Index: -1, Minor: minorOf(snap, d.Name)}
	if kind != config.DefaultKind {
		return info
	}
	info.UUID, info.Index, info.Type = id.UUID, id.Index, link.TypeGPU
	if id.MIG {
		info.Type = link.TypeMIG
	}
	// A MIG device's node /dev/nvidiaN is its GPU's: it has the GPU's
	// product, versions and PCI address (as NVIDIA's DRA driver gives
	// them), its own UUID and memory.
	if g, ok := inv.GPUs()[info.Minor]; ok {
		info.ProductName, info.Brand, info.Architecture = g.Model, g.Brand, g.Architecture
		info.DriverVersion, info.CUDAComputeCapability = g.DriverVersion, g.CUDAComputeCapability
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

// DCGMEntity returns the UUID, GPU index and GPU instance id by which
// NVIDIA's DCGM exporter labels a device's series: a whole GPU's UUID and
// index, no instance; a MIG device's GPU's UUID and index and its GPU
// instance, as NVML tells them; the MIG device's own UUID and no
// instance where NVML does not tell; "" for what is not known.
func (inv *Inventory) DCGMEntity(info link.Info) (uuid, index, instance string) {
	if info.Index >= 0 {
		index = strconv.Itoa(info.Index)
	}
	uuid, instance = inv.dcgmInstance(info)
	return uuid, index, instance
}

// dcgmInstance returns DCGMEntity's UUID and GPU instance.
func (inv *Inventory) dcgmInstance(info link.Info) (uuid, instance string) {
	if info.Type != link.TypeMIG || info.ParentUUID == "" {
		return info.UUID, ""
	}
	index := "" // the MIG index of nvidia-ctk's "GPU:MIG" name
	if m := migName.FindStringSubmatch(info.Name); m != nil {
		index = m[2]
	}
	for _, m := range inv.GPUs()[info.Minor].MIGs {
		if m.UUID == info.UUID || (info.UUID == "" && index == strconv.Itoa(m.Index)) {
			return info.ParentUUID, strconv.Itoa(m.GI)
		}
	}
	return info.UUID, ""
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

// Hardware returns the devices of kind in snap whose names match globs
// and that pol's policy.devices allows, one name per piece of hardware
// (the first of a GPU's names: its index before its UUID; one that
// shares hardware with a device of seen is left out), never "all".
func Hardware(snap *specs.Snapshot, pol *policy.Policy, kind string, globs []string, seen []specs.Device) []specs.Device {
	var out []specs.Device
	for _, c := range snap.Candidates(kind) {
		_, _, id := parser.ParseDevice(c.Name)
		if !policy.MatchAny(globs, id) || !pol.Allowed(c.Name) || specs.OverlapsAny(c, seen) || specs.OverlapsAny(c, out) {
			continue
		}
		out = append(out, c)
	}
	return out
}

// MIGs returns the MIG devices of GPU d that snap lists and pol's
// policy.devices allows, one name each, in the specs' order.
func MIGs(snap *specs.Snapshot, pol *policy.Policy, kind string, d specs.Device) []specs.Device {
	var out []specs.Device
	for _, c := range snap.Candidates(kind) {
		if c.Same(d) || !c.Within(d) || !pol.Allowed(c.Name) || specs.OverlapsAny(c, out) {
			continue
		}
		if Identify(snap, c).MIG {
			out = append(out, c)
		}
	}
	return out
}

// Kinds returns the kinds of snap's trusted devices, defaultKind first.
func Kinds(snap *specs.Snapshot, defaultKind string) []string {
	out := []string{defaultKind}
	for _, d := range snap.Trusted() {
		vendor, class, _ := parser.ParseDevice(d.Name)
		if k := vendor + "/" + class; !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	slices.Sort(out[1:])
	return out
}
