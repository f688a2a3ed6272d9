package plugin

import "github.com/nri-gpu/nri-gpu/pkg/mps"

// SharedDevices returns the devices of the default kind that the policy
// in force shares, or a claim that holds one whole shares with MPS among
// its containers, who uses each and, for MPS, each client's bounds
// (mps.Sharing.Shared), for explain and devices.
func (p *Plugin) SharedDevices() []mps.Shared {
	st, snap, pol := p.decision()
	return p.node.mps.sharing(pol, snap).Shared(st.cfg.DefaultKind, p.node.alloc.Users)
}

// MemoryBound is the driver's bound of a container's memory on one GPU,
// as nri-gpu sets it when the container starts.
type MemoryBound struct {
	Device, UUID string
	// Soft and Hard are the limits in bytes.
	Soft, Hard uint64
}

// MemoryBounds returns what the container of that ID, created through
// Create, is to be bounded to on each GPU (none: nothing), for explain.
func (p *Plugin) MemoryBounds(id string) []MemoryBound {
	c := p.limits.get(id)
	if c == nil {
		return nil
	}
	out := make([]MemoryBound, 0, len(c.gpus))
	for _, g := range c.gpus {
		out = append(out, MemoryBound{Device: g.Device, UUID: g.UUID, Soft: g.Soft, Hard: g.Hard})
	}
	return out
}
