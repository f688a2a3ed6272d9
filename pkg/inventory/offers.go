package inventory

import (
	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// Offers returns the devices the DRA driver offers: of kinds, matching
// globs and allowed by policy.devices, one name per piece of hardware (a
// GPU by index, not again by UUID; never "all"), with room in pool for
// a claim (free, or shared with a replica no pod uses) as pol judges it
// with ch, each with what NVML says of it and why it is unhealthy where
// it is (its GPU's health, its device nodes gone): an unhealthy one stays,
// tainted, so that kube-scheduler places no new claim on it and its
// claims' pods see why. Of two names that make one DNS label, the first
// is offered.
func (inv *Inventory) Offers(snap *specs.Snapshot, pol *policy.Policy, pool *policy.Allocations, kinds, globs []string, ch policy.Choice) []link.Device {
	var (
		out     []link.Device
		offered []specs.Device
		names   = map[string]bool{}
	)
	for _, kind := range kinds {
		hw := Hardware(snap, pol, kind, globs, offered)
		offered = append(offered, hw...)
		for _, cand := range hw {
			if pool.Room(pol, cand, policy.DRA, ch) == 0 {
				continue
			}
			info := inv.Info(snap, kind, cand)
			info.Unhealthy = inv.Sickness(snap, cand)
			if offer, ok := pool.Offer(pol, cand, policy.DRA); ok {
				info.Offer = &offer
			}
			name := info.DeviceName()
			if names[name] {
				continue
			}
			names[name] = true
			out = append(out, link.Device{CDI: cand.Name, Info: info})
		}
	}
	return out
}

// Pieces returns the pieces of hardware the trusted specs of snap list,
// each a piece of hardware (one name per piece: a GPU by index, not
// again by UUID; never "all") then the MIG devices of it the specs
// list, over the kinds of snap's devices.
func Pieces(snap *specs.Snapshot, pol *policy.Policy, defaultKind string) []Piece {
	var (
		out  []Piece
		seen []specs.Device
	)
	for _, kind := range Kinds(snap, defaultKind) {
		hw := Hardware(snap, pol, kind, []string{"*"}, seen)
		seen = append(seen, hw...)
		for _, d := range hw {
			out = append(out, Piece{Kind: kind, Devices: append([]specs.Device{d}, MIGs(snap, pol, kind, d)...)})
		}
	}
	return out
}

// Piece is a piece of hardware and its MIG devices.
type Piece struct {
	Kind string
	// Devices are the piece of hardware, then its MIG devices.
	Devices []specs.Device
}

// HeldAs returns which of the piece's devices a holding of device held
// is told under: the MIG device it is, else the piece of hardware.
func (p Piece) HeldAs(held specs.Device) specs.Device {
	for _, m := range p.Devices[1:] {
		if m.Same(held) {
			return m
		}
	}
	return p.Devices[0]
}
