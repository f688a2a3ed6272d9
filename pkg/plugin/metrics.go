package plugin

import (
	"context"
	"slices"
	"strconv"
	"time"

	"github.com/nri-gpu/nri-gpu/pkg/inventory"
	"github.com/nri-gpu/nri-gpu/pkg/metrics"
	"github.com/nri-gpu/nri-gpu/pkg/mps"
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
	dev.UUID, dev.GPUInstance = p.node.hw.DCGMEntity(info)
	if info.Index >= 0 {
		dev.Index = strconv.Itoa(info.Index)
	}
	sh := p.node.mps.sharing(pol, snap)
	w, s, _ := sh.Of(x) // one nri-gpu cannot bound has no daemon to tell of
	if w != nil {
		dev.MPS = &metrics.MPS{Ready: p.node.mps.mgr.Ready(ctx, w.Daemon) == nil}
	}
	for _, user := range u.Users {
		if piece.HeldAs(user.Device).Name == x.Name {
			dev.Holders = append(dev.Holders, p.holdersOf(sh, x, s, user)...)
		}
	}
	return dev
}

// holdersOf returns a user of device d as the metrics name its holders:
// a pod, or a claim with each pod it was prepared for (none yet: no pod),
// what it takes of d and, where MPS shares d (s), its clients' bounds.
func (p *Plugin) holdersOf(sh mps.Sharing, d specs.Device, s *policy.MPS, u policy.User) []metrics.Holder {
	h := metrics.Holder{Door: door(u), Namespace: u.Pod.Namespace, Pod: u.Pod.Name, Shares: u.Use.Shares, Memory: u.Use.Memory}
	if s != nil {
		var use policy.ClaimDevice // a pod's: the daemon's defaults
		if u.Claim != nil {
			if _, devs, err := p.node.alloc.Claim(u.Claim.UID, nil); err == nil {
				if i := slices.IndexFunc(devs, func(c policy.ClaimDevice) bool { return c.Overlaps(d) }); i >= 0 {
					use = devs[i]
				}
			}
		}
		limits := sh.ClientLimits(s, d, use)
		h.MPSCompute, h.MPSMemory = limits.ActiveThreadPercentage, limits.PinnedMemoryMiB<<20
	}
	if u.Claim == nil {
		return []metrics.Holder{h}
	}
	h.Namespace, h.Claim = u.Claim.Namespace, u.Claim.Name
	if len(u.Claim.Pods) == 0 {
		return []metrics.Holder{h}
	}
	out := make([]metrics.Holder, 0, len(u.Claim.Pods))
	for _, pod := range u.Claim.Pods {
		h.Namespace, h.Pod = pod.Namespace, pod.Name
		out = append(out, h)
	}
	return out
}

// door names the door a user got its device through.
func door(u policy.User) string {
	switch {
	case u.Claim != nil:
		return metrics.DoorDRA
	case u.Found:
		return metrics.DoorFound
	case u.Kubelet:
		return metrics.DoorDevicePlugin
	case u.Counted:
		return metrics.DoorCount
	}
	return metrics.DoorAnnotation
}
