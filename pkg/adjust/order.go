package adjust

import (
	"slices"

	"tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// editSet is one set of edits, with the device it is applied for.
type editSet struct {
	edits *cdispec.ContainerEdits
	// device is the device the edits are applied for.
	device *cdi.Device
	// specLevel is true for a spec's own (spec-level) edits.
	specLevel bool
}

// name returns the qualified name of the device, for messages.
func (s editSet) name() string { return s.device.GetQualifiedName() }

// specPath returns the spec file of spec-level edits, or "".
func (s editSet) specPath() string {
	if !s.specLevel {
		return ""
	}
	return s.device.GetSpec().GetPath()
}

// inOrder lists the edits of devices in the order CDI's
// Cache.InjectDevices applies them: a spec's own edits once, before those
// of its first device, then each device's. The specs of devices in
// applied count as applied already.
func inOrder(devices, applied []*cdi.Device) []editSet {
	// A request names few specs: a list is cheaper than a map.
	seen := make([]*cdi.Spec, 0, len(applied)+4)
	for _, d := range applied {
		seen = append(seen, d.GetSpec())
	}
	sets := make([]editSet, 0, 2*len(devices))
	for _, d := range devices {
		if spec := d.GetSpec(); !slices.Contains(seen, spec) {
			seen = append(seen, spec)
			sets = append(sets, editSet{edits: &spec.ContainerEdits, device: d, specLevel: true})
		}
		sets = append(sets, editSet{edits: &d.ContainerEdits, device: d})
	}
	return sets
}
