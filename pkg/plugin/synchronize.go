package plugin

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/containerd/nri/pkg/api"
	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/pkg/recovery"
)

// recordLost says that the state file could not be read back: it was
// set aside for the operator (aside: where, or why not; "" when only
// read), and every running container is then judged by the admission as
// a new one (Synchronize). claims are those of the file still held
// (a newer nri-gpu's record: what this one reads of it).
func (p *Plugin) recordLost(err error, aside string, claims int) {
	kept := "left where it is"
	if aside != "" {
		kept = "kept as " + aside
	}
	if claims > 0 {
		kept += fmt.Sprintf("; the %d prepared claims it names stay held", claims)
	}
	p.log.Errorf("the record of what pods hold is unusable (%v; %s): it is rebuilt from the running containers, each judged by the admission as a new one, oldest first: held as what it asks for, or stopped", err, kept)
}

// Synchronize rebuilds what pods hold after a restart, from a source no
// tenant can write: the state file the plugin keeps, for the pods the
// runtime still runs. Pods gone while the plugin was away,
// and stopped pods not yet removed (all their containers stopped, or none
// left and their sandbox stopped), hold nothing any more. Holdings that
// break the policy or each other are logged, and stay held. A running
// container nri-gpu did not create, or cannot tell it did (no record),
// is a request like any other: judged by the admission against those
// holdings, held as what it asks for, or stopped with the reason. No door answers from the pool before the
// first Synchronize has restored it.
func (p *Plugin) Synchronize(ctx context.Context, pods []*api.PodSandbox, containers []*api.Container) ([]*api.ContainerUpdate, error) {
	st, snap, pol := p.decision()
	reported := recovery.Sort(pods, containers)
	judge := recovery.Judge{Parser: st.parser, Snap: snap, Kind: st.cfg.DefaultKind, Record: p.node.rec.File() != nil && !p.node.rec.Lost()}
	found := judge.Find(reported, containers, p.node.rec.TakeRestored(), p.node.alloc.ClaimHeld())
	if err := p.node.alloc.Restore(pol, found.Holdings); err != nil {
		p.log.Warn(err)
	}
	// Those nri-gpu did not create are requests like any other. What
	// kubelet is asked for them is asked within one bound, however many.
	admitCtx, cancel := context.WithTimeout(ctx, kubeletPatience)
	defer cancel()
	for _, s := range found.Admit {
		if err := p.admitRunning(admitCtx, s, nil, nil); err != nil {
			s.Why = fmt.Sprintf("the admission refuses what it asks for: %v", err)
			found.Stop = append(found.Stop, s)
			found.Others = slices.DeleteFunc(found.Others, func(o recovery.Stopping) bool { return o.Ctr == s.Ctr })
		}
	}
	found.Stop = append(found.Stop, p.boundRestored(pol, snap, reported, containers)...)
	p.recovered.Reset(slices.Collect(maps.Keys(reported.Live)), containers)
	p.watchSandboxes(reported)
	// The access files of pods the runtime no longer has.
	if err := p.node.access.Prune(func(id string) bool { return reported.Sandboxes[id] != nil }); err != nil {
		p.log.Warnf("removing the access files of containers of pods gone: %v", err)
	}
	if p.life.restore.finish() {
		p.log.WithFields(logrus.Fields{"pods": len(p.node.alloc.Held()), "claims": len(p.node.alloc.Claims())}).
			Info("restored what pods and claims hold: the doors answer from the pool from now on")
	}
	p.saveAndNotify()
	p.conn.synced.Store(true)
	for _, s := range found.Stop {
		p.stopUnserved(s)
	}
	if p.doors.claims != nil {
		if check := recovery.MayUseClaims(found.Others, p.node.alloc.Claims()); len(check) > 0 {
			// The DRA driver answers once it runs, after this.
			go p.stopClaimless(check)
		}
	}
	for pod, devices := range p.node.alloc.Held() {
		p.log.WithFields(logrus.Fields{"namespace": pod.Namespace, "pod": pod.Name, "devices": strings.Join(devices, ",")}).
			Info("restored devices held by pod")
	}
	return nil, nil
}

// watchSandboxes watches the sandbox of each live pod reported with no
// container, its end told only by its sandbox's.
func (p *Plugin) watchSandboxes(reported recovery.Reported) {
	for _, pod := range reported.Alone() {
		log := p.log.WithFields(logrus.Fields{"namespace": pod.GetNamespace(), "pod": pod.GetName()})
		release := func(ended func() bool) {
			if p.releaseIf(pod, ended) {
				log.Info("the pod's sandbox ended with no container: what it held is released (the runtime restarted, and tells nothing else of its end)")
			}
		}
		if err := p.recovered.Watch(pod.GetId(), int(pod.GetPid()), release); err != nil {
			log.Debugf("a pod with no container: its end is told by its next container's removal, not by its sandbox's (%v)", err)
		}
	}
}

// StopPodSandbox releases the devices a pod held.
func (p *Plugin) StopPodSandbox(_ context.Context, pod *api.PodSandbox) error {
	p.recovered.Forget(pod.GetId())
	p.release(pod)
	return nil
}

// RemovePodSandbox releases the devices a pod held, if its stop did not.
func (p *Plugin) RemovePodSandbox(_ context.Context, pod *api.PodSandbox) error {
	p.recovered.Forget(pod.GetId())
	p.release(pod)
	if err := p.node.access.RemovePod(pod.GetId()); err != nil {
		p.log.WithFields(logrus.Fields{"namespace": pod.GetNamespace(), "pod": pod.GetName()}).
			Warnf("removing the access files of the pod's containers: %v", err)
	}
	return nil
}

// RemoveContainer releases the devices of a pod the runtime reported at
// Synchronize once its last container is removed: after the runtime
// restarted, that is all it tells of the pod's end (see pkg/recovery).
func (p *Plugin) RemoveContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) error {
	p.liftBounds(pod, ctr)
	p.forgetAccess(pod, ctr)
	p.recovered.Remove(pod.GetId(), ctr.GetId(), func(ended func() bool) { p.releaseIf(pod, ended) })
	return nil
}

func (p *Plugin) release(pod *api.PodSandbox) {
	p.releaseIf(pod, func() bool { return true })
}

// releaseIf releases what a pod holds if ended, asked under the pool's
// lock, says the pod has ended (one step: policy.Allocations.ReleaseIf),
// records it and logs it; it returns what ended said.
func (p *Plugin) releaseIf(pod *api.PodSandbox, ended func() bool) bool {
	released, ok := p.node.alloc.ReleaseIf(pod.GetId(), ended)
	if len(released) > 0 {
		p.saveAndNotify()
		p.log.WithFields(logrus.Fields{"namespace": pod.GetNamespace(), "pod": pod.GetName(), "devices": strings.Join(released, ",")}).
			Info("released devices")
	}
	return ok
}

// HoldRecorded has the pool hold what the state file said pods held at
// start, as a Synchronize that found all of them running would, for a
// plugin that is not served (nri-gpu explain). It returns what the
// policy in force would not give, which the pods keep until removed (a
// *policy.ConflictError), or nil.
func (p *Plugin) HoldRecorded() error {
	_, _, pol := p.decision()
	defer p.life.restore.finish()
	return p.node.alloc.Restore(pol, p.node.rec.TakeRestored())
}

// saveAndNotify records what pods hold, in the state file and in the
// devices-held and rebuilt-record metrics, and tells the doors that keep
// a view of it (the device plugin, DRA). It returns the state file's
// error (wrapping record.ErrNotRecorded), which it also logs.
func (p *Plugin) saveAndNotify() error {
	err := p.node.rec.Save()
	if err != nil {
		p.log.Errorf("what pods hold is not kept for a restart: %v", err)
	}
	p.metrics.DevicesHeld(p.node.alloc.Count()) // nil metrics: nothing
	p.metrics.RecordRebuilt(p.node.rec.Lost() || p.node.alloc.Rebuilt() > 0)
	p.notifyDoors()
	return err
}

// notifyDoors tells each door that what pods hold, or what is healthy,
// changed.
func (p *Plugin) notifyDoors() {
	for _, d := range p.doors.told {
		d.Notify()
	}
}

// saveOrUndo records a change that added to what is held (a pod's grant, a
// prepared claim), or has undo take it back when the state file cannot
// keep it: a holding only memory knows would be handed out again after a
// restart.
func (p *Plugin) saveOrUndo(undo func()) error {
	err := p.saveAndNotify()
	if err == nil {
		return nil
	}
	undo()
	_ = p.saveAndNotify() // what was last written again, which needs no write
	return err
}
