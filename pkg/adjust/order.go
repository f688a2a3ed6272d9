package adjust

import (
	"fmt"

	"tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// editSet is one set of edits and what it belongs to, for messages.
type editSet struct {
	edits *cdispec.ContainerEdits
	// device is the qualified name of the device the edits are applied for.
	device string
	// spec is the spec file of spec-level edits; "" for a device's own.
	spec string
}

// where names the set's device, and its spec for spec-level edits, for
// messages.
func (s editSet) where() string {
	if s.spec != "" {
		return fmt.Sprintf("device %q (spec-level edits of %s)", s.device, s.spec)
	}
	return fmt.Sprintf("device %q", s.device)
}

// inOrder lists the edits of devices in the order CDI's
// Cache.InjectDevices applies them: a spec's own edits once, before those
// of its first device, then each device's. The specs of the devices in
// applied count as applied already.
func inOrder(devices, applied []*cdi.Device, specPath func(*cdi.Spec) string) []editSet {
	seen := map[*cdi.Spec]bool{}
	for _, d := range applied {
		seen[d.GetSpec()] = true
	}
	var out []editSet
	for _, d := range devices {
		if spec := d.GetSpec(); !seen[spec] {
			seen[spec] = true
			path := spec.GetPath()
			if specPath != nil {
				path = specPath(spec)
			}
			out = append(out, editSet{edits: &spec.ContainerEdits, device: d.GetQualifiedName(), spec: path})
		}
		out = append(out, editSet{edits: &d.ContainerEdits, device: d.GetQualifiedName()})
	}
	return out
}
