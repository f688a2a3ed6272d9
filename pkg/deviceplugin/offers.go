package deviceplugin

import (
	"slices"
	"sync"

	"tags.cncf.io/container-device-interface/pkg/parser"

	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// Offer is a device of a resource as the pool offers it to kubelet.
type Offer struct {
	// ID is its name within the resource's kind ("0", "GPU-<uuid>").
	ID string
	// Replicas are how many ways policy.sharing shares it; 0 when it is
	// not shared.
	Replicas int
	// Room is how many more holders the pool has room for through the
	// device plugin: of an unshared device 0 or 1, of a shared one the
	// replicas left.
	Room int
}

// Offers returns what a device plugin offers kubelet of hardware, each
// device by its name within its kind, with how many more holders pool
// has room for through the device plugin as pol judges it with ch (the
// admission asked on no one's behalf: healthy, hooks allowed, beside
// what holders kubelet does not account for hold), and a shared device's
// replicas.
func Offers(hardware []specs.Device, pol *policy.Policy, pool *policy.Allocations, ch policy.Choice) []Offer {
	offers := make([]Offer, 0, len(hardware))
	for _, c := range hardware {
		_, _, id := parser.ParseDevice(c.Name)
		off := Offer{ID: id, Room: pool.Room(pol, c, policy.DevicePlugin, ch)}
		if share := pol.Sharing(c); share != nil {
			off.Replicas = share.Replicas
		}
		offers = append(offers, off)
	}
	return offers
}

// Offered is what one resource has offered kubelet so far. The zero
// Offered has offered nothing.
type Offered struct {
	mu sync.Mutex
	// known are the IDs offered so far, in the order first offered: one
	// whose device went away stays, unhealthy, so that kubelet does not
	// hand it out while a pod it gave it to still runs.
	known []string
}

// Devices returns the devices to list for offers: each device not shared,
// healthy while the pool has room for it, and each replica of a shared
// one ("0::0" to "0::N-1", so that the scheduler counts replicas), the
// first Room of them healthy; then every ID offered before and not now,
// unhealthy; all in the order first offered.
func (o *Offered) Devices(offers []Offer) []Device {
	healthy := map[string]bool{}
	var ids []string
	for _, off := range offers {
		if off.Replicas == 0 {
			healthy[off.ID] = off.Room > 0
			ids = append(ids, off.ID)
			continue
		}
		for k := range off.Replicas {
			rid := ReplicaID(off.ID, k)
			healthy[rid] = k < off.Room
			ids = append(ids, rid)
		}
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, id := range ids {
		if !slices.Contains(o.known, id) {
			o.known = append(o.known, id)
		}
	}
	out := make([]Device, 0, len(o.known))
	for _, id := range o.known {
		out = append(out, Device{ID: id, Healthy: healthy[id]})
	}
	return out
}

// Prefer returns mustInclude and then, up to size, available devices of
// devs as a count request chooses them (policy.Pick): one replica per
// device, the devices with the fewest replicas in use (not available)
// first, of those the set most closely connected to each other and to
// mustInclude where links tells the topology (nil: it does not), else
// the first in the order devs lists them (neighbours by index).
// footprint gives the device of an ID (a replica's device's). A second
// replica of a device mustInclude or the choice has already comes last,
// only to make up size (Allocate refuses a container two of one device,
// which is what kubelet then says).
func Prefer(devs []Device, available, mustInclude []string, size int, footprint func(id string) specs.Device, links func(a, b specs.Device) int) []string {
	out := slices.Clone(mustInclude)
	inUse := map[string]int{}
	for _, d := range devs {
		if !slices.Contains(available, d.ID) {
			inUse[DeviceOf(d.ID)]++
		}
	}
	var had []string
	for _, id := range out {
		had = append(had, DeviceOf(id))
	}
	var (
		free, spare []string              // devices, and replicas of those had or chosen
		used        []int                 // replicas in use of each of free
		replica     = map[string]string{} // the first available replica of each of free
		byName      = map[string]string{} // the devices of free, by their footprints' names
	)
	for _, d := range devs {
		dev := DeviceOf(d.ID)
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
	footprints := func(ids []string) []specs.Device {
		out := make([]specs.Device, 0, len(ids))
		for _, id := range ids {
			f := footprint(id)
			byName[f.Name] = id
			out = append(out, f)
		}
		return out
	}
	if want := min(size-len(out), len(free)); want > 0 {
		chosen, _ := policy.Pick(footprints(had), footprints(free), used, want, links)
		for _, d := range chosen {
			out = append(out, replica[byName[d.Name]])
		}
	}
	if n := size - len(out); n > 0 {
		out = append(out, spare[:min(n, len(spare))]...)
	}
	return out
}
