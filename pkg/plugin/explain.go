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
