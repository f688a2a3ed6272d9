package plugin

import (
	"slices"
	"sync"

	"tags.cncf.io/container-device-interface/pkg/parser"

	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/deviceplugin"
	"github.com/nri-gpu/nri-gpu/pkg/inventory"
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

// Devices returns the resource's devices: each device of its kind whose
// name matches its globs and that policy.devices allows, one name per
// device (the first of a GPU's names: its index before its UUID), not
// "all"; a device policy.sharing shares N ways is offered as N replicas
// ("0::0" to "0::N-1"), so that the scheduler counts replicas. A device is
// healthy when its spec is there and trusted, its device nodes exist, its
// GPU is healthy (NVML), and no pod holds it other than through kubelet
// (an annotation or count request): kubelet is never offered a device
// such a pod holds; of a shared device, as many replicas as such pods
// and claims use are unhealthy, the last ones.
func (r *Resource) Devices() []deviceplugin.Device {
	st := r.p.state()
	snap := st.specs.Snapshot()
	pol := r.p.node.hw.PolicyIn(st.policy, snap)
	// What the admission would give, asked on no one's behalf: healthy,
	// hooks allowed, room beside what holders kubelet does not account
	// for hold.
	ch := policy.Choice{Unhealthy: r.p.node.hw.Unhealthy(snap), Hooks: snap.Hooks}
	offered := inventory.Hardware(snap, st.policy, r.cfg.Kind, r.cfg.Devices, nil)
	healthy := map[string]bool{}
	var ids []string
	for _, c := range offered {
		_, _, id := parser.ParseDevice(c.Name)
		room := r.p.node.alloc.Room(pol, c, policy.DevicePlugin, ch)
		share := pol.Sharing(c)
		if share == nil {
			healthy[id] = room > 0
			ids = append(ids, id)
			continue
		}
		for k := range share.Replicas {
			rid := deviceplugin.ReplicaID(id, k)
			healthy[rid] = k < room
			ids = append(ids, rid)
		}
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	for _, id := range ids {
		if !slices.Contains(r.known, id) {
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
// as a count request chooses them (policy.Pick): one replica per device,
// the devices with the fewest replicas in use (not available) first, of
// those the set most closely connected to each other and to mustInclude
// where NVML tells the topology, else the first in the order Devices
// lists them (neighbours by index). A second replica of a device
// mustInclude or the choice has already comes last, only to make up
// size (Allocate refuses a container two of one device, which is what
// kubelet then says).
func (r *Resource) Preferred(available, mustInclude []string, size int) []string {
	out := slices.Clone(mustInclude)
	devs := r.Devices()
	inUse := map[string]int{}
	for _, d := range devs {
		if !slices.Contains(available, d.ID) {
			inUse[deviceplugin.DeviceOf(d.ID)]++
		}
	}
	var had []string
	for _, id := range out {
		had = append(had, deviceplugin.DeviceOf(id))
	}
	var (
		free, spare []string              // devices, and replicas of those had or chosen
		used        []int                 // replicas in use of each of free
		replica     = map[string]string{} // the first available replica of each of free
	)
	for _, d := range devs {
		dev := deviceplugin.DeviceOf(d.ID)
		switch {
		case !slices.Contains(available, d.ID) || slices.Contains(out, d.ID):
		case slices.Contains(had, dev) || replica[dev] != "":
			spare = append(spare, d.ID)
		default:
			replica[dev] = d.ID
			free = append(free, dev)
			used = append(used, inUse[dev])
		}
	}
	if want := min(size-len(out), len(free)); want > 0 {
		chosen, _ := policy.Pick(r.footprints(had), r.footprints(free), used, want, r.p.node.hw.Links())
		for _, d := range chosen {
			_, _, dev := parser.ParseDevice(d.Name)
			out = append(out, replica[dev])
		}
	}
	if n := size - len(out); n > 0 {
		out = append(out, spare[:min(n, len(spare))]...)
	}
	return out
}

// footprints returns the resource's devices of the given names (within
// its kind) as the specs in force give them.
func (r *Resource) footprints(names []string) []specs.Device {
	snap := r.p.state().specs.Snapshot()
	vendor, class := parser.ParseQualifier(r.cfg.Kind)
	var out []specs.Device
	for _, name := range names {
		f := specs.Device{Name: parser.QualifiedName(vendor, class, name)}
		if e, err := snap.Lookup(f.Name); err == nil {
			f = e.Footprint
		}
		out = append(out, f)
	}
	return out
}
