package specs

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"github.com/NVIDIA/nvidia-container-toolkit/pkg/system/nvdevices"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// Device is a device's name and footprint: the host device nodes of its
// own edits (not the spec-level ones all devices of a spec share), by
// what they are. Two names for one GPU, by index and by UUID, have the
// same footprint, and so do two paths for one node; a kind's "all" device
// covers the footprints of the others.
type Device struct {
	// Name is the qualified CDI name.
	Name string
	// Nodes identify the device's own device nodes, sorted: "c 195:0"
	// (type and numbers, from the host node or else the spec), or, for a
	// node that is neither there nor fully specified, "path /dev/x".
	Nodes []string
	// Parts are those of Nodes that narrow the device to a part of the
	// hardware its other nodes name, known by their major (PartMajors):
	// a MIG device's capability nodes beside its GPU's node. Sorted.
	Parts []string
}

// Overlaps reports whether d and o share hardware: the same name, or the
// footprint of one within the other's (a GPU by index and by UUID; a GPU
// and "all"; a GPU and its MIG devices; "all" and a MIG device, whether
// or not "all" lists its capability nodes). Two MIG devices of one GPU do
// not: each has parts the other lacks. Devices that merely list one node
// in common (AMD's /dev/kfd, an InfiniBand node) do not either.
func (d Device) Overlaps(o Device) bool {
	return d.Name == o.Name || d.Within(o) || o.Within(d)
}

// Within reports whether d's footprint is within o's: each of d's nodes
// is one of o's, d's parts aside when o has none (a MIG device is within
// whatever gives its whole GPU).
func (d Device) Within(o Device) bool {
	nodes := d.Nodes
	if len(o.Parts) == 0 {
		nodes = slices.DeleteFunc(slices.Clone(d.Nodes), func(n string) bool { return slices.Contains(d.Parts, n) })
	}
	if len(nodes) == 0 {
		return false
	}
	for _, n := range nodes {
		if !slices.Contains(o.Nodes, n) {
			return false
		}
	}
	return true
}

// Same reports whether d and o are one piece of hardware: the same name,
// or the same device nodes (a GPU by index and by UUID).
func (d Device) Same(o Device) bool {
	return d.Name == o.Name || (len(d.Nodes) > 0 && slices.Equal(d.Nodes, o.Nodes))
}

// OverlapsAny reports whether d shares hardware with any of devs.
func OverlapsAny(d Device, devs []Device) bool {
	return slices.ContainsFunc(devs, d.Overlaps)
}

// Names returns the names of devices, in order.
func Names(devices []Device) []string {
	out := make([]string, len(devices))
	for i, d := range devices {
		out[i] = d.Name
	}
	return out
}

// footprint returns the name and footprint of a resolved device, its
// nodes identified from the host nodes stat'ed at load (type and numbers,
// else the cleaned host path), its parts those of a character major in
// parts.
func footprint(d *cdi.Device, hosts map[string]HostNode, parts []int64) Device {
	var nodes, own []string
	for _, n := range d.ContainerEdits.DeviceNodes {
		if n == nil {
			continue
		}
		typ, major, minor, ok := numbers(n, hosts[HostPath(n)])
		if !ok {
			nodes = append(nodes, "path "+filepath.Clean(HostPath(n)))
			continue
		}
		id := NodeID(typ, major, minor)
		nodes = append(nodes, id)
		if typ == "c" && slices.Contains(parts, major) {
			own = append(own, id)
		}
	}
	slices.Sort(nodes)
	slices.Sort(own)
	return Device{Name: d.GetQualifiedName(), Nodes: slices.Compact(nodes), Parts: slices.Compact(own)}
}

// PartMajors gives the majors of the character devices whose nodes narrow
// a device to a part of the hardware its other nodes name. A load asks
// each time: a driver may be loaded after nri-gpu starts.
type PartMajors func() []int64

// NVIDIACaps is the major of the NVIDIA driver's capability nodes, as the
// host's /proc/devices lists it ("nvidia-caps"), read through NVIDIA's
// toolkit: a MIG device's GPU instance and compute instance are each one
// (their minors in /proc/driver/nvidia-caps/mig-minors), wherever its
// spec puts their nodes. None where the driver is not loaded.
func NVIDIACaps() []int64 {
	devs, err := nvdevices.New(nvdevices.WithDryRun(true))
	if err != nil || devs.Devices == nil {
		return nil
	}
	if major, ok := devs.Get(capsName); ok {
		return []int64{int64(major)}
	}
	return nil
}

// capsName is the NVIDIA capability nodes' driver in /proc/devices.
const capsName = "nvidia-caps"

// numbers gives a node's type and numbers as the host has them, or as the
// spec gives them.
func numbers(n *cdispec.DeviceNode, host HostNode) (typ string, major, minor int64, ok bool) {
	switch {
	case host.Err == nil && host.Type != "":
		return host.Type, host.Major, host.Minor, true
	case n.Type != "" && n.Major != 0:
		return n.Type, n.Major, n.Minor, true
	}
	return "", 0, 0, false
}

// NodeID is how a Device's Nodes name a device node of this type and
// numbers: "c 195:0".
func NodeID(typ string, major, minor int64) string {
	return fmt.Sprintf("%s %d:%d", typ, major, minor)
}

// naturalCompare orders names so that embedded numbers compare by value:
// gpu=2 before gpu=10.
func naturalCompare(a, b string) int {
	for a != "" && b != "" {
		ad, bd := unicode.IsDigit(rune(a[0])), unicode.IsDigit(rune(b[0]))
		if ad && bd {
			an, arest := leadingNumber(a)
			bn, brest := leadingNumber(b)
			if an != bn {
				if an < bn {
					return -1
				}
				return 1
			}
			a, b = arest, brest
			continue
		}
		if a[0] != b[0] {
			return strings.Compare(a[:1], b[:1])
		}
		a, b = a[1:], b[1:]
	}
	return len(a) - len(b)
}

func leadingNumber(s string) (uint64, string) {
	i := strings.IndexFunc(s, func(r rune) bool { return !unicode.IsDigit(r) })
	if i < 0 {
		i = len(s)
	}
	n, err := strconv.ParseUint(s[:i], 10, 64)
	if err != nil {
		n = ^uint64(0)
	}
	return n, s[i:]
}
