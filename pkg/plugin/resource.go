package plugin

import (
	"os"
	"slices"
	"sync"

	"tags.cncf.io/container-device-interface/pkg/parser"

	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/deviceplugin"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

var _ deviceplugin.Source = (*Resource)(nil)

// Resource is an extended resource's devices as the plugin knows them,
// for its device plugin: from the current trusted specs, and healthy
// unless the pool says a pod holds them other than through kubelet.
type Resource struct {
	p   *Plugin
	cfg config.Resource

	mu sync.Mutex
	// known are the IDs offered so far, in the order first offered: one
	// whose device went away stays, unhealthy, so that kubelet does not
	// hand it out while a pod it gave it to still runs.
	known []string
}

// Resource returns the devices of extended resource r.
func (p *Plugin) Resource(r config.Resource) *Resource { return &Resource{p: p, cfg: r} }

// OnHeldChange has f called whenever what pods hold changes (a device
// plugin then tells kubelet which devices it may hand out). It must be
// called before Serve.
func (p *Plugin) OnHeldChange(f func()) { p.onHeld = append(p.onHeld, f) }

// Devices returns the resource's devices: each device of its kind whose
// name matches its globs and that policy.devices allows, one name per
// device (the first of a GPU's names: its index before its UUID), not
// "all". A device is healthy when its spec is there and trusted, its
// device nodes exist, its GPU is healthy (NVML), and no pod holds it
// other than through kubelet (an annotation or count request): kubelet is
// never offered a device such a pod holds.
func (r *Resource) Devices() []deviceplugin.Device {
	st := r.p.state()
	snap := st.specs.Snapshot()
	withheld := r.p.alloc.Withheld()
	offered := st.hardware(snap, r.cfg.Kind, r.cfg.Devices, nil)
	healthy := map[string]bool{}
	for _, c := range offered {
		_, _, id := parser.ParseDevice(c.Name)
		healthy[id] = r.p.free(snap, c, withheld)
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range offered {
		if _, _, id := parser.ParseDevice(c.Name); !slices.Contains(r.known, id) {
			r.known = append(r.known, id)
		}
	}
	out := make([]deviceplugin.Device, 0, len(r.known))
	for _, id := range r.known {
		out = append(out, deviceplugin.Device{ID: id, Healthy: healthy[id]})
	}
	return out
}

// Preferred returns mustInclude and then, up to size, available devices
// as a count request chooses them: the set most closely connected to each
// other and to mustInclude where NVML tells the topology, else the first
// in the order Devices lists them (neighbours by index).
func (r *Resource) Preferred(available, mustInclude []string, size int) []string {
	out := slices.Clone(mustInclude)
	var rest []string
	for _, d := range r.Devices() {
		if slices.Contains(available, d.ID) && !slices.Contains(out, d.ID) {
			rest = append(rest, d.ID)
		}
	}
	want := min(size-len(out), len(rest))
	if want <= 0 {
		return out
	}
	links := r.p.links()
	if links == nil || want+len(out) < 2 {
		return append(out, rest[:want]...)
	}
	snap := r.p.state().specs.Snapshot()
	vendor, class := parser.ParseQualifier(r.cfg.Kind)
	footprints := func(ids []string) []specs.Device {
		var fs []specs.Device
		for _, id := range ids {
			f := specs.Device{Name: parser.QualifiedName(vendor, class, id)}
			if e, err := snap.Lookup(f.Name); err == nil {
				f = e.Footprint
			}
			fs = append(fs, f)
		}
		return fs
	}
	best, _ := policy.Closest(footprints(out), footprints(rest), want, links)
	for _, d := range best {
		_, _, id := parser.ParseDevice(d.Name)
		out = append(out, id)
	}
	return out
}

// hardware returns the devices of kind whose names match globs and that
// policy.devices allows, one name per piece of hardware (the first of a
// GPU's names: its index before its UUID; one that shares hardware with
// a device of seen is left out), never "all".
func (st *state) hardware(snap *specs.Snapshot, kind string, globs []string, seen []specs.Device) []specs.Device {
	var out []specs.Device
	for _, c := range snap.Candidates(kind) {
		_, _, id := parser.ParseDevice(c.Name)
		if !policy.MatchAny(globs, id) || !st.policy.Allowed(c.Name) || policy.Overlaps(c, seen) || policy.Overlaps(c, out) {
			continue
		}
		out = append(out, c)
	}
	return out
}

// free reports whether a device may be handed out now: no device of held
// overlaps it, its device nodes exist and its GPU is healthy (NVML).
func (p *Plugin) free(snap *specs.Snapshot, d specs.Device, held []specs.Device) bool {
	sick := p.unhealthy()
	return !policy.Overlaps(d, held) && nodesExist(snap, d.Name) && (sick == nil || sick(d) == nil)
}

// nodesExist reports whether every device node of the named device is on
// the host now.
func nodesExist(snap *specs.Snapshot, name string) bool {
	e, err := snap.Lookup(name)
	if err != nil {
		return false
	}
	for _, n := range e.Device.ContainerEdits.DeviceNodes {
		if _, err := os.Stat(specs.HostPath(n)); err != nil {
			return false
		}
	}
	return true
}
