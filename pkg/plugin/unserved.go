package plugin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/pkg/adjust"
	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// stopper stops a running container (recovery.Killer: its process
// killed).
type stopper interface{ Stop(*api.Container) error }

// unserved says why a running container that nri-gpu did not create (it
// bears none of nri-gpu's annotations: the runtime created it while
// nri-gpu was away) is to be stopped, so that it is created again
// through nri-gpu: what it asks for cannot be read, the policy refuses
// it, or the container lacks a device it asks for. It returns "" for a
// container nri-gpu created, one that asks for nothing, and one that has
// everything it asks for (the runtime's own CDI injected it), which is
// then held as found in it (Synchronize); asks says whether the
// container asks for devices.
func unserved(st *state, snap *specs.Snapshot, pod *api.PodSandbox, ctr *api.Container, candidates []specs.Device) (why string, asks bool) {
	if _, ok := ctr.GetAnnotations()[DevicesAnnotation]; ok {
		return "", false
	}
	ask, err := st.parser.Parse(containerOf(pod, ctr))
	if err != nil {
		return fmt.Sprintf("what it asks for is refused: %v", err), true
	}
	if ask.Empty() {
		return "", false
	}
	if err := st.policy.Check(podOf(pod), ask); err != nil {
		return fmt.Sprintf("the policy refuses what it asks for: %v", err), true
	}
	var missing []string
	for _, q := range ask.Requests {
		if e, err := snap.Lookup(q.Device); err != nil || !adjust.InjectedByRuntime(e, ctr) {
			missing = append(missing, q.Device)
		}
	}
	if found := len(adjust.WithNodesOf(ctr, candidates)); found < ask.Count {
		missing = append(missing, fmt.Sprintf("%d of the %d devices it counts", ask.Count-found, ask.Count))
	}
	if len(missing) == 0 {
		return "", true
	}
	return "it was created while nri-gpu was not serving, without " + strings.Join(missing, ", "), true
}

// containerOf is what the policy's parser reads of a container.
func containerOf(pod *api.PodSandbox, ctr *api.Container) policy.Container {
	return policy.Container{
		Namespace:      pod.GetNamespace(),
		Pod:            pod.GetName(),
		Name:           ctr.GetName(),
		PodAnnotations: pod.GetAnnotations(),
		Annotations:    ctr.GetAnnotations(),
		CDIDevices:     adjust.CDIDeviceNames(ctr),
	}
}

// stopping is a container to stop, and why.
type stopping struct {
	pod *api.PodSandbox
	ctr *api.Container
	why string
}

// logTo returns log with the container's namespace, pod and name.
func logTo(log logrus.FieldLogger, s stopping) logrus.FieldLogger {
	return log.WithFields(logrus.Fields{"namespace": s.pod.GetNamespace(), "pod": s.pod.GetName(), "container": s.ctr.GetName()})
}

// stopUnserved stops a container that is not to run as the runtime
// created it, and logs why: kubelet then creates it again, through
// nri-gpu, as its pod's restart policy says (without kubelet, it stays
// stopped).
func (p *Plugin) stopUnserved(s stopping) {
	log := logTo(p.log, s)
	ev := link.Event{Namespace: s.pod.GetNamespace(), Pod: s.pod.GetName(), UID: s.pod.GetUid(), Container: s.ctr.GetName(), Action: "Stop"}
	if err := p.stopper.Stop(s.ctr); err != nil {
		log.Errorf("a container that is not to run as it is (%s) still runs: %v", s.why, err)
		ev.Reason, ev.Note = NotStoppedReason, fmt.Sprintf("nri-gpu could not stop container %s, which is not to run as it is (%s): %v", s.ctr.GetName(), s.why, err)
	} else {
		log.Warnf("stopped the container, to be created again through nri-gpu: %s", s.why)
		ev.Reason, ev.Note = StoppedReason, fmt.Sprintf("nri-gpu stopped container %s, to be created again through nri-gpu: %s", s.ctr.GetName(), s.why)
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

// How long nri-gpu, back, goes on asking whether the running containers
// it did not create use claims (the DRA driver starts after it, and the
// API server may be slow to answer), and how long one question may take.
const (
	claimCheckFor = 2 * time.Minute
	claimAskFor   = 10 * time.Second
	claimRetry    = time.Second
)

// claimless returns the running containers of found that may use a
// prepared claim nri-gpu did not give them: those of the pods of the
// namespaces of the claims prepared on the node (policy.Claim.MayBeUsedBy),
// none without DRA or with no claim prepared.
func (p *Plugin) claimless(found []stopping) []stopping {
	if p.doors.claims == nil {
		return nil
	}
	claims := p.node.alloc.Claims()
	return slices.DeleteFunc(found, func(s stopping) bool {
		return !slices.ContainsFunc(claims, func(c policy.ClaimHolding) bool { return c.Claim.MayBeUsedBy(s.pod.GetNamespace()) })
	})
}

// stopClaimless asks, for each container of check (running, created
// while nri-gpu was away, in a pod that may use a prepared claim), which
// prepared claims it uses, and stops it, with the reason, when it lacks
// their devices (or names a claim not reserved for its pod), as
// stopUnserved does; one that has them (the runtime's own CDI injected
// them) runs on. A container nri-gpu cannot tell of within
// claimCheckFor runs on, said in the log.
func (p *Plugin) stopClaimless(check []stopping) {
	deadline := time.Now().Add(claimCheckFor)
	for _, s := range check {
		why, err := p.claimUnserved(s, deadline)
		switch {
		case p.life.closed.Err() != nil:
			p.log.Info("stopped checking the claims of containers created while nri-gpu was away: another nri-gpu holds the record")
			return
		case err != nil:
			logTo(p.log, s).Warnf("could not tell whether a container created while nri-gpu was away uses DRA claims; it runs on: %v", err)
		case why != "":
			s.why = why
			p.stopUnserved(s)
		default:
			logTo(p.log, s).Info("a container created while nri-gpu was away has the devices of the DRA claims it uses: it runs on")
		}
	}
}

// claimUnserved says why the container is to be stopped ("" when it has
// the devices of every claim it uses), asking the DRA driver until it
// answers or deadline.
func (p *Plugin) claimUnserved(s stopping, deadline time.Time) (string, error) {
	ref := link.PodRef{Namespace: s.pod.GetNamespace(), Name: s.pod.GetName(), UID: s.pod.GetUid()}
	for {
		ctx, cancel := context.WithTimeout(p.life.closed, min(claimAskFor, time.Until(deadline)))
		uses, err := p.doors.claims.Uses(ctx, ref, s.ctr.GetName())
		cancel()
		if errors.Is(err, link.ErrNotReserved) {
			return fmt.Sprintf("it names a claim not reserved for its pod: %v", err), nil
		}
		if err == nil {
			return p.lacksClaimed(s.ctr, uses), nil
		}
		if time.Until(deadline) < claimRetry {
			return "", err
		}
		select {
		case <-p.life.closed.Done():
			return "", err
		case <-time.After(claimRetry):
		}
	}
}

// lacksClaimed says which of the claims a container uses it lacks the
// devices of ("" when none).
func (p *Plugin) lacksClaimed(ctr *api.Container, uses []link.ClaimUse) string {
	var missing []string
	for _, u := range uses {
		_, devs, err := p.node.alloc.Claim(u.UID, u.Requests)
		if err != nil {
			missing = append(missing, fmt.Sprintf("claim %s/%s (%v)", u.Namespace, u.Name, err))
			continue
		}
		want := make([]specs.Device, 0, len(devs))
		for _, d := range devs {
			if len(d.Nodes) > 0 { // a device of no node is not seen in a container
				want = append(want, d.Device)
			}
		}
		if len(adjust.WithNodesOf(ctr, want)) < len(want) {
			missing = append(missing, fmt.Sprintf("the devices of claim %s/%s", u.Namespace, u.Name))
		}
	}
	if len(missing) == 0 {
		return ""
	}
	return "it was created while nri-gpu was not serving, without " + strings.Join(missing, ", ")
}
