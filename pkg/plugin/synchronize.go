package plugin

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/containerd/nri/pkg/api"
	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/pkg/adjust"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// recordLost says that the state file could not be read back: it was
// set aside for the operator (aside: where, or why not; "" when only
// read), and every device found in a running container is then held by
// its pod alone (Synchronize). claims are those of the file still held
// (a newer nri-gpu's record: what this one reads of it).
func (p *Plugin) recordLost(err error, aside string, claims int) {
	kept := "left where it is"
	if aside != "" {
		kept = "kept as " + aside
	}
	if claims > 0 {
		kept += fmt.Sprintf("; the %d prepared claims it names stay held", claims)
	}
	p.log.Errorf("the record of what pods hold is unusable (%v; %s): it is rebuilt from the device nodes of the running containers, each device found held by its pod alone (as a count grant is) until the pod is removed", err, kept)
}

// Synchronize rebuilds what pods hold after a restart, from sources no
// tenant can write: the state file the plugin keeps, for the pods the
// runtime still runs, and the device nodes the runtime reports in the
// containers nri-gpu gave devices. Pods gone while the plugin was away,
// and stopped pods not yet removed (all their containers stopped, or none
// left and their sandbox stopped), hold nothing any more. Holdings that
// break the policy or each other are logged, and stay held.
func (p *Plugin) Synchronize(_ context.Context, pods []*api.PodSandbox, containers []*api.Container) ([]*api.ContainerUpdate, error) {
	st := p.state()
	reported := syncedPods(pods, containers)
	found := p.found(st, reported, containers)
	if err := p.node.alloc.Restore(p.node.hw.PolicyIn(st.policy, st.specs.Snapshot()), found.holdings); err != nil {
		p.log.Warn(err)
	}
	p.recovered.Reset(slices.Collect(maps.Keys(reported.live)), containers)
	p.watchSandboxes(reported)
	if p.node.access != nil {
		// The records of pods the runtime no longer has.
		if err := p.node.access.Keep(func(id string) bool { return reported.sandboxes[id] != nil }); err != nil {
			p.log.Warnf("removing the access files of containers of pods gone: %v", err)
		}
	}
	p.saveAndNotify()
	p.conn.setSynced()
	for _, s := range found.stop {
		p.stopUnserved(s)
	}
	if check := p.claimless(found.others); len(check) > 0 {
		// The DRA driver answers once it runs, after this.
		go p.stopClaimless(check)
	}
	for pod, devices := range p.node.alloc.Held() {
		p.log.WithFields(logrus.Fields{"namespace": pod.Namespace, "pod": pod.Name, "devices": strings.Join(devices, ",")}).
			Info("restored devices held by pod")
	}
	return nil, nil
}

// synced are the pods the runtime reported at Synchronize.
type synced struct {
	// live are the pods that may run containers, sandboxes every pod
	// reported, by ID; withContainers says which reported containers.
	live           map[string]policy.Pod
	sandboxes      map[string]*api.PodSandbox
	withContainers map[string]bool
}

// syncedPods sorts the pods the runtime reported: a stopped pod, not yet
// removed (all its containers stopped, or none left and no sandbox
// process: containerd reports a stopped sandbox with pid 0, and none of
// its exited containers), is not live: nothing of it can run, as no
// container can be created in a stopped sandbox.
func syncedPods(pods []*api.PodSandbox, containers []*api.Container) synced {
	s := synced{live: make(map[string]policy.Pod, len(pods)), sandboxes: make(map[string]*api.PodSandbox, len(pods)), withContainers: map[string]bool{}}
	for _, pod := range pods {
		s.live[pod.GetId()] = podOf(pod)
		s.sandboxes[pod.GetId()] = pod
	}
	running := map[string]bool{} // by pod ID
	for _, c := range containers {
		s.withContainers[c.GetPodSandboxId()] = true
		if c.GetState() != api.ContainerState_CONTAINER_STOPPED {
			running[c.GetPodSandboxId()] = true
		}
	}
	for id, pod := range s.sandboxes {
		if !running[id] && (s.withContainers[id] || pod.GetPid() == 0) {
			delete(s.live, id)
		}
	}
	return s
}

// foundPods is what Synchronize found of the pods: what they hold (the
// record's, for the pods still live, and what is found in their running
// containers), the containers to stop, and the running containers
// nri-gpu did not create (others).
type foundPods struct {
	holdings     []policy.Holding
	stop, others []stopping
}

// found returns what the live pods hold and which of their running
// containers are to be stopped or checked.
func (p *Plugin) found(st *state, reported synced, containers []*api.Container) foundPods {
	var out foundPods
	recorded := map[string][]specs.Device{} // by pod ID
	for _, h := range p.node.rec.TakeRestored() {
		if pod, ok := reported.live[h.Pod.ID]; ok {
			h.Pod = pod
			out.holdings = append(out.holdings, h)
			recorded[pod.ID] = append(recorded[pod.ID], slices.Concat(h.Named, h.Counted)...)
		}
	}
	snap := st.specs.Snapshot()
	// A device of a prepared claim, found in a container, is the claim's.
	claimed := p.node.alloc.ClaimHeld()
	candidates := slices.DeleteFunc(snap.Candidates(st.cfg.DefaultKind), func(d specs.Device) bool { return specs.OverlapsAny(d, claimed) })
	for _, c := range containers {
		pod, ok := reported.live[c.GetPodSandboxId()]
		if !ok || c.GetState() == api.ContainerState_CONTAINER_STOPPED {
			continue
		}
		sandbox := reported.sandboxes[c.GetPodSandboxId()]
		why, asks := unserved(st, snap, sandbox, c, candidates)
		if why != "" {
			out.stop = append(out.stop, stopping{sandbox, c, why})
			continue
		}
		if _, ours := c.GetAnnotations()[DevicesAnnotation]; !ours {
			out.others = append(out.others, stopping{pod: sandbox, ctr: c})
		}
		if h, ok := p.holdingFound(pod, c, foundIn(c, asks, candidates), recorded[pod.ID]); ok {
			out.holdings = append(out.holdings, h)
		}
	}
	return out
}

// holdingFound returns what container c of pod is found to hold: the
// devices found in it, those no record has held as strictly as they may
// have been given (by the pod alone); none when nothing is found.
func (p *Plugin) holdingFound(pod policy.Pod, c *api.Container, found, recorded []specs.Device) (policy.Holding, bool) {
	if len(found) == 0 {
		return policy.Holding{}, false
	}
	var sole []string
	for _, d := range found {
		if !specs.OverlapsAny(d, recorded) {
			sole = append(sole, d.Name)
		}
	}
	if len(sole) > 0 {
		p.log.WithFields(logrus.Fields{"namespace": pod.Namespace, "pod": pod.Name, "container": c.GetName(), "devices": strings.Join(sole, ",")}).
			Warn("devices found in a running container that no record has: held by its pod alone until the pod is removed")
	}
	return policy.Holding{Pod: pod, Named: found, Sole: sole}, true
}

// watchSandboxes watches the sandbox of each live pod reported with no
// container, its end told only by its sandbox's.
func (p *Plugin) watchSandboxes(reported synced) {
	for id := range reported.live {
		if reported.withContainers[id] {
			continue
		}
		pod := reported.sandboxes[id]
		log := p.log.WithFields(logrus.Fields{"namespace": pod.GetNamespace(), "pod": pod.GetName()})
		ended := func() {
			log.Info("the pod's sandbox ended with no container: what it held is released (the runtime restarted, and tells nothing else of its end)")
			p.release(pod)
		}
		if err := p.recovered.Watch(id, int(pod.GetPid()), ended); err != nil {
			log.Debugf("a pod with no container: its end is told by its next container's removal, not by its sandbox's (%v)", err)
		}
	}
}

// foundIn returns the candidates whose device nodes are all in a
// container nri-gpu gave devices, or that asks for devices and has them
// (the runtime's own CDI injected them while nri-gpu was away), as the
// runtime reports them (its spec). Another container (a privileged one,
// say) holds nothing.
func foundIn(c *api.Container, asks bool, candidates []specs.Device) []specs.Device {
	if _, ok := c.GetAnnotations()[DevicesAnnotation]; !ok && !asks {
		return nil
	}
	return adjust.WithNodesOf(c, candidates)
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
	if p.node.access != nil {
		if err := p.node.access.RemovePod(pod.GetId()); err != nil {
			p.log.WithFields(logrus.Fields{"namespace": pod.GetNamespace(), "pod": pod.GetName()}).
				Warnf("removing the records of what the pod's containers were given: %v", err)
		}
	}
	return nil
}

// RemoveContainer releases the devices of a pod the runtime reported at
// Synchronize once its last container is removed: after the runtime
// restarted, that is all it tells of the pod's end (see pkg/recovery).
func (p *Plugin) RemoveContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) error {
	p.forgetAccess(pod, ctr)
	if p.recovered.Remove(pod.GetId(), ctr.GetId()) {
		p.release(pod)
	}
	return nil
}

func (p *Plugin) release(pod *api.PodSandbox) {
	if released := p.node.alloc.Release(pod.GetId()); len(released) > 0 {
		p.saveAndNotify()
		p.log.WithFields(logrus.Fields{"namespace": pod.GetNamespace(), "pod": pod.GetName(), "devices": strings.Join(released, ",")}).
			Info("released devices")
	}
}

// HoldRecorded has the pool hold what the state file said pods held at
// start, as a Synchronize that found all of them running would, for a
// plugin that is not served (nri-gpu explain). It returns what the
// policy in force would not give, which the pods keep until removed (a
// *policy.ConflictError), or nil.
func (p *Plugin) HoldRecorded() error {
	st := p.state()
	return p.node.alloc.Restore(p.node.hw.PolicyIn(st.policy, st.specs.Snapshot()), p.node.rec.TakeRestored())
}

// saveAndNotify records what pods hold, in the state file and in the
// devices-held and rebuilt-record metrics, and tells the doors that keep
// a view of it (the device plugin, DRA). It returns the state file's
// error (wrapping ErrNotRecorded), which it also logs.
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
