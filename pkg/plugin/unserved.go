package plugin

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/pkg/adjust"
	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/recovery"
)

// stopper stops a running container (recovery.Killer: its process
// killed).
type stopper interface{ Stop(*api.Container) error }

// logTo returns log with the container's namespace, pod and name.
func logTo(log logrus.FieldLogger, s recovery.Stopping) logrus.FieldLogger {
	return log.WithFields(logrus.Fields{"namespace": s.Pod.GetNamespace(), "pod": s.Pod.GetName(), "container": s.Ctr.GetName()})
}

// stopUnserved stops a container that is not to run as the runtime
// created it (recovery.Judge said why), and logs why: kubelet then
// creates it again, through nri-gpu, as its pod's restart policy says
// (without kubelet, it stays stopped).
func (p *Plugin) stopUnserved(s recovery.Stopping) {
	log := logTo(p.log, s)
	ev := link.Event{Namespace: s.Pod.GetNamespace(), Pod: s.Pod.GetName(), UID: s.Pod.GetUid(), Container: s.Ctr.GetName(), Action: "Stop"}
	if err := p.stopper.Stop(s.Ctr); err != nil {
		log.Errorf("a container that is not to run as it is (%s) still runs: %v", s.Why, err)
		ev.Reason, ev.Note = NotStoppedReason, fmt.Sprintf("nri-gpu could not stop container %s, which is not to run as it is (%s): %v", s.Ctr.GetName(), s.Why, err)
	} else {
		log.Warnf("stopped the container, to be created again through nri-gpu: %s", s.Why)
		ev.Reason, ev.Note = StoppedReason, fmt.Sprintf("nri-gpu stopped container %s, to be created again through nri-gpu: %s", s.Ctr.GetName(), s.Why)
	}
	if p.doors.events != nil {
		p.doors.events.Post(ev)
	}
}

// The reasons of the events about a container created while nri-gpu was
// away: stopped, or not stopped (it runs on as the runtime created it).
const (
	StoppedReason    = "StoppedByNRIGPU"
	NotStoppedReason = "NotStoppedByNRIGPU"
)

// stopClaimless asks, for each container of check (running, created
// while nri-gpu was away, in a pod that may use a prepared claim), which
// prepared claims it uses, and stops it, with the reason, when it lacks
// their devices (or names a claim not reserved for its pod), as
// stopUnserved does; one that has them (the runtime's own CDI injected
// them) runs on. A container nri-gpu cannot tell of within
// recovery.ClaimCheckFor runs on, said in the log.
func (p *Plugin) stopClaimless(check []recovery.Stopping) {
	deadline := time.Now().Add(recovery.ClaimCheckFor)
	claims := recovery.ClaimCheck{Finder: p.doors.claims, Pool: p.node.alloc}
	for _, s := range check {
		why, uses, err := claims.Unserved(p.life.closed, s, deadline)
		switch {
		case p.life.closed.Err() != nil:
			p.log.Info("stopped checking the claims of containers created while nri-gpu was away: another nri-gpu holds the record")
			return
		case err != nil:
			logTo(p.log, s).Warnf("could not tell whether a container created while nri-gpu was away uses DRA claims; it runs on: %v", err)
		case why != "":
			s.Why = why
			p.stopUnserved(s)
		default:
			// Its claims are its pod's, as a new container's are: counted
			// towards policy.maxDevicesPerPod, kept from the sweep.
			if err := p.admitClaims(s, uses); err != nil {
				s.Why = fmt.Sprintf("the admission refuses what it uses: %v", err)
				p.stopUnserved(s)
				continue
			}
			logTo(p.log, s).Info("a container created while nri-gpu was away has the devices of the DRA claims it uses: it runs on")
		}
	}
}

// admitRunning judges a running container nri-gpu did not create (the
// runtime created it while nri-gpu was away, or its annotation is not
// nri-gpu's) by the one admission, as a new container is, against what
// the pods hold: what it asks for by name and count, and the devices of
// the claims it uses (claims, held). What it is admitted its pod holds,
// recorded; the error says why it is not.
func (p *Plugin) admitRunning(ctx context.Context, s recovery.Stopping, claims []string, held []policy.ClaimDevice) error {
	st, snap, pol := p.decision()
	ask, err := st.parser.Parse(adjust.ContainerOf(s.Pod, s.Ctr))
	if err != nil {
		return err
	}
	r := &creation{Creation: &adjust.Creation{Snap: snap, Ctr: s.Ctr, Runtime: p.conn.runtime()}, st: st, pol: pol, pod: s.Pod}
	a := r.Decide(ask, held)
	a.Want.Pod, a.Want.Claims = adjust.PodOf(s.Pod), claims
	if !a.HoldsAny() {
		return nil
	}
	// A count is of the devices it has: what it was given.
	has := adjust.WithNodesOf(s.Ctr, snap.Candidates(st.cfg.DefaultKind))
	a.Want.Choice = policy.Choice{Candidates: has, Usable: r.Usable, Hooks: snap.Hooks, Unhealthy: p.node.hw.Unhealthy(snap)}
	a.Want.Choice.Kubelet = p.allocatedByKubelet(ctx, r, a.Want, logTo(p.log, s))
	for attempt := 1; ; attempt++ {
		plan, err := p.node.alloc.Plan(pol, a.Want)
		if err != nil {
			return err
		}
		_, err = p.commit(pol, plan)
		if err == nil {
			return p.boundRunning(pol, snap, s.Pod, s.Ctr, append(plan.Devices(), a.Claimed...))
		}
		if !errors.Is(err, policy.ErrStale) || attempt >= maxPlans {
			return err
		}
	}
}

// admitClaims has a running container nri-gpu did not create, which has
// the devices of the claims it uses (uses, as the DRA driver told),
// judged again with them (admitRunning).
func (p *Plugin) admitClaims(s recovery.Stopping, uses []link.ClaimUse) error {
	claims, held, err := link.UsedOf(p.node.alloc, uses)
	if err != nil {
		return err
	}
	return p.admitRunning(p.life.closed, s, claims, held)
}
