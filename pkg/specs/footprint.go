package specs

import (
	"slices"
	"strconv"
	"strings"
	"unicode"

	"tags.cncf.io/container-device-interface/pkg/cdi"
)

// Device is a device's name and footprint: the host device nodes of its
// own edits (not the spec-level ones all devices of a spec share). Two
// names for one GPU, by index and by UUID, have the same footprint; a
// kind's "all" device covers the footprints of the others.
type Device struct {
	// Name is the qualified CDI name.
	Name string
	// Nodes are the host paths of the device's own device nodes, sorted.
	Nodes []string
}

// Footprint returns the name and footprint of a resolved device.
func Footprint(d *cdi.Device) Device {
	var nodes []string
	for _, n := range d.ContainerEdits.DeviceNodes {
		if n != nil {
			nodes = append(nodes, HostPath(n))
		}
	}
	slices.Sort(nodes)
	return Device{Name: d.GetQualifiedName(), Nodes: slices.Compact(nodes)}
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
