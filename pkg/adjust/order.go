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

// order walks the edits of devices in the order CDI's
// Cache.InjectDevices applies them: a spec's own edits once, before those
// of its first device, then each device's. The specs of devices in
// applied count as applied already. It allocates nothing for requests of
// up to a few specs, so it is walked again rather than kept.
type order struct {
	devices, applied []*cdi.Device
	// few and more are the specs whose edits were given.
	few  [8]*cdi.Spec
	nFew int
	more []*cdi.Spec
	// next is the index of the device whose edits come next.
	next int
}

// inOrder starts an order over devices.
func inOrder(devices, applied []*cdi.Device) order {
	return order{devices: devices, applied: applied}
}

// Next returns the next set of edits, or false at the end.
func (o *order) Next() (editSet, bool) {
	if o.next >= len(o.devices) {
		return editSet{}, false
	}
	d := o.devices[o.next]
	if spec := d.GetSpec(); !o.seen(spec) {
		if o.nFew < len(o.few) {
			o.few[o.nFew] = spec
			o.nFew++
		} else {
			o.more = append(o.more, spec)
		}
		return editSet{edits: &spec.ContainerEdits, device: d, specLevel: true}, true
	}
	o.next++
	return editSet{edits: &d.ContainerEdits, device: d}, true
}

func (o *order) seen(spec *cdi.Spec) bool {
	return slices.Contains(o.few[:o.nFew], spec) || slices.Contains(o.more, spec) ||
		slices.ContainsFunc(o.applied, func(d *cdi.Device) bool { return d.GetSpec() == spec })
}
