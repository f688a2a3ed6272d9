package adjust

import (
	"tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// editSet is one set of edits, with the device it is applied for.
type editSet struct {
	edits *cdispec.ContainerEdits
	// device is the qualified name of the device.
	device string
	// spec is the spec file, set for a spec's own (spec-level) edits.
	spec string
}

// inOrder lists the edits of devices in the order CDI's
// Cache.InjectDevices applies them: a spec's own edits once, before those
// of its first device, then each device's. The specs of devices in
// applied count as applied already.
func inOrder(devices, applied []*cdi.Device) []editSet {
	seen := make(map[*cdi.Spec]bool, len(applied))
	for _, d := range applied {
		seen[d.GetSpec()] = true
	}
	sets := make([]editSet, 0, 2*len(devices))
	for _, d := range devices {
		name := d.GetQualifiedName()
		if spec := d.GetSpec(); !seen[spec] {
			seen[spec] = true
			sets = append(sets, editSet{edits: &spec.ContainerEdits, device: name, spec: spec.GetPath()})
		}
		sets = append(sets, editSet{edits: &d.ContainerEdits, device: name})
	}
	return sets
}
