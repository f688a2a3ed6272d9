package plugin

import (
	"context"
	"time"

	"github.com/nri-gpu/nri-gpu/pkg/inventory"
	"github.com/nri-gpu/nri-gpu/pkg/metrics"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// mpsWait bounds how long a scrape waits for the MPS daemons to answer.
const mpsWait = time.Second

// metricsNode returns what the metrics tell of the node's devices now
// (pkg/metrics asks at each scrape): each device of the trusted specs,
// one name per piece of hardware (a GPU by index, not again by UUID;
// never "all") and, beside a GPU, each MIG device of it the specs list;
// what each offers and who holds how much of it, whichever door each
// holder came through, each holder told once, under the device it holds
// (a MIG device's under the MIG device); and the MPS daemon of a device
// MPS shares. Until the first Synchronize has told which pods of the
// record still run, it tells no device: the pool does not yet hold what
// they hold.
func (p *Plugin) metricsNode() metrics.Node {
	p.inForce.mu.RLock()
	st, restoring := p.inForce.st, p.node.rec.Restoring()
	p.inForce.mu.RUnlock()
	if restoring {
		return metrics.Node{}
	}
	ctx, cancel := context.WithTimeout(context.Background(), mpsWait)
	defer cancel()
	snap := st.specs.Snapshot()
	pol := p.node.hw.PolicyIn(st.policy, snap)
	var out metrics.Node
	for _, piece := range inventory.Pieces(snap, st.policy, st.cfg.DefaultKind) {
		for _, x := range piece.Devices {
			out.Devices = append(out.Devices, p.metricsDevice(ctx, pol, snap, piece, x))
		}
	}
	return out
}

// metricsDevice returns what the metrics tell of device x, one of piece's
// (a piece of hardware and its MIG devices): what it offers, and its
// holders that hold it rather than another of piece's.
func (p *Plugin) metricsDevice(ctx context.Context, pol *policy.Policy, snap *specs.Snapshot, piece inventory.Piece, x specs.Device) metrics.Device {
	info := p.node.hw.Info(snap, piece.Kind, x)
	u := p.node.alloc.Usage(pol, x)
	dev := metrics.Device{
		Name:   x.Name,
		Shares: u.Capacity.Shares, SharesUsed: u.Used.Shares, Memory: u.Capacity.Memory, MemoryUsed: u.Used.Memory,
	}
	dev.UUID, dev.Index, dev.GPUInstance = p.node.hw.DCGMEntity(info)
	sh := p.node.mps.sharing(pol, snap)
	w, s, _ := sh.Of(x) // one nri-gpu cannot bound has no daemon to tell of
	if w != nil {
		dev.MPS = &metrics.MPS{Ready: p.node.mps.mgr.Ready(ctx, w.Daemon) == nil}
	}
	for _, user := range u.Users {
		if piece.HeldAs(user.Device).Name == x.Name {
			holders := metrics.HoldersOf(user)
			for i := range holders {
				holders[i].MemoryLimit = int64(p.limits.ofHolder(holders[i].Namespace, holders[i].Pod, x.Name))
			}
			if s != nil {
				limits := sh.UserLimits(s, x, user)
				for i := range holders {
					holders[i].MPSCompute, holders[i].MPSMemory = limits.ActiveThreadPercentage, limits.PinnedMemoryMiB<<20
				}
			}
			dev.Holders = append(dev.Holders, holders...)
		}
	}
	return dev
}
