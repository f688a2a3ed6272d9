package plugin

import (
	"fmt"

	"github.com/nri-gpu/nri-gpu/pkg/inventory"
)

// Shared is a device policy.sharing shares, as explain and devices show
// it.
type Shared struct {
	// Device is its name (the first of its names).
	Device string `json:"device"`
	// Sharing is the policy.sharing entry that shares it.
	Sharing string `json:"sharing"`
	// Users are the pods and claims that use it now.
	Users []string `json:"users"`
	// Limits are each MPS client's bounds ("" for time-slicing), or why
	// it cannot be bounded.
	Limits string `json:"limits,omitempty"`
}

// SharedDevices returns the devices of the default kind that the policy
// in force shares, or a claim that holds one whole shares with MPS among
// its containers, who uses each and, for MPS, each client's bounds.
func (p *Plugin) SharedDevices() []Shared {
	st := p.state()
	snap := st.specs.Snapshot()
	pol := p.node.hw.PolicyIn(st.policy, snap)
	sh := p.node.mps.sharing(pol, snap)
	var out []Shared
	for _, d := range inventory.Hardware(snap, st.policy, st.cfg.DefaultKind, []string{"*"}, nil) {
		s, _ := pol.MPSOf(d, sh.Claims)
		sharing := ""
		switch share := pol.Sharing(d); {
		case share != nil:
			sharing = share.String()
		case s != nil:
			sharing = "mps, for the claim that holds it (its GpuConfig)"
		default:
			continue
		}
		shared := Shared{Device: d.Name, Sharing: sharing, Users: p.node.alloc.Users(d)}
		if w, _, err := sh.Of(d); err != nil {
			shared.Limits = err.Error()
		} else if w != nil {
			shared.Limits = fmt.Sprintf("each client %d%% of compute, %d MiB of pinned memory; daemon in %s", w.Limits.ActiveThreadPercentage, w.Limits.PinnedMemoryMiB, w.Daemon.Dir)
		}
		out = append(out, shared)
	}
	return out
}
