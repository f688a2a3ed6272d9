package plugin

import (
	"context"

	"tags.cncf.io/container-device-interface/pkg/parser"

	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/deviceplugin"
	"github.com/nri-gpu/nri-gpu/pkg/inventory"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

var (
	_ deviceplugin.Source    = (*Resource)(nil)
	_ deviceplugin.Restoring = (*Resource)(nil)
	_ deviceplugin.Allotting = (*Resource)(nil)
)

// Resource is an extended resource's devices as the plugin knows them,
// for its device plugin: from the current trusted specs, and healthy
// unless the pool says a pod holds them other than through kubelet.
type Resource struct {
	p       *Plugin
	cfg     config.Resource
	offered deviceplugin.Offered
}

// Devices returns the resource's devices: each device of its kind whose
// name matches its globs and that policy.devices allows, one name per
// device (the first of a GPU's names: its index before its UUID), not
// "all"; a device policy.sharing shares N ways as N replicas. A device is
// healthy when its spec is there and trusted, its device nodes exist, its
// GPU is healthy (NVML), and no pod holds it other than through kubelet
// (an annotation or count request): kubelet is never offered a device
// such a pod holds; of a shared device, as many replicas as such pods
// and claims use are unhealthy, the last ones (deviceplugin.Offered).
func (r *Resource) Devices() []deviceplugin.Device {
	_, snap, pol := r.p.decision()
	hardware := inventory.Hardware(snap, pol, r.cfg.Kind, r.cfg.Devices, nil)
	ch := policy.Choice{Unhealthy: r.p.node.hw.Unhealthy(snap), Hooks: snap.Hooks}
	return r.offered.Devices(deviceplugin.Offers(hardware, pol, r.p.node.alloc, ch))
}

// Allot agrees to the devices kubelet allocates a pod it is admitting,
// once the pool is restored (waiting as a DRA call does), and keeps them
// as kubelet's until its pod-resources API lists them
// (policy.Allocations.Allot): the admission refuses one another door
// took since kubelet was told it healthy.
func (r *Resource) Allot(ctx context.Context, ids []string) error {
	if err := r.p.life.restore.await(ctx, kubeletBound(ctx)); err != nil {
		return err
	}
	_, snap, pol := r.p.decision()
	vendor, class := parser.ParseQualifier(r.cfg.Kind)
	names := make([]string, 0, len(ids))
	for _, id := range ids {
		names = append(names, parser.QualifiedName(vendor, class, deviceplugin.DeviceOf(id)))
	}
	ch := policy.Choice{Unhealthy: r.p.node.hw.Unhealthy(snap), Hooks: snap.Hooks}
	return r.p.node.alloc.Allot(pol, snap.Footprints(names), ch)
}

// Restored is closed once the pool holds what the record and the running
// containers say is held: kubelet is told nothing before.
func (r *Resource) Restored() <-chan struct{} { return r.p.life.restore.done }

// Preferred chooses size devices among available, mustInclude first, as
// a count request would (deviceplugin.Prefer), with the GPUs' topology
// where NVML tells it.
func (r *Resource) Preferred(available, mustInclude []string, size int) []string {
	snap := r.p.state().specs.Snapshot()
	vendor, class := parser.ParseQualifier(r.cfg.Kind)
	footprint := func(id string) specs.Device {
		f := specs.Device{Name: parser.QualifiedName(vendor, class, id)}
		if e, err := snap.Lookup(f.Name); err == nil {
			f = e.Footprint
		}
		return f
	}
	return deviceplugin.Prefer(r.Devices(), available, mustInclude, size, footprint, r.p.node.hw.Links())
}
