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
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nri-gpu/nri-gpu/pkg/access"
	"github.com/nri-gpu/nri-gpu/pkg/adjust"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
	"github.com/nri-gpu/nri-gpu/pkg/metrics"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// CreateContainer injects the devices a container asks for, or fails its
// creation saying why. A container that asks for nothing is left alone.
// A container of a pod known from Synchronize counts among the pod's
// containers from the start of its creation, so that the removal of the
// pod's last other container meanwhile does not release what the new
// one is being given.
func (p *Plugin) CreateContainer(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	if err := p.life.restore.await(ctx, p.waitBound(ctx)); err != nil {
		return nil, nil, err
	}
	p.recovered.Add(pod.GetId(), ctr.GetId())
	adj, _, err := p.Create(ctx, pod, ctr)
	if err != nil {
		// Its other containers were removed meanwhile: the pod ends.
		p.recovered.Remove(pod.GetId(), ctr.GetId(), func(ended func() bool) { p.releaseIf(pod, ended) })
	}
	return adj, nil, err
}

// Create serves one container's creation, as CreateContainer does for
// the runtime: it decides what the container gets, builds the
// adjustment, then holds and records the grant; it records the metrics,
// logs the decision once and wraps a denial for the runtime. It also
// returns what the pool granted, with the devices a count request passed
// over and the chosen set's score, for nri-gpu explain.
func (p *Plugin) Create(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, policy.Grant, error) {
	start := time.Now()
	log := p.log.WithFields(logrus.Fields{"namespace": pod.GetNamespace(), "pod": pod.GetName(), "container": ctr.GetName()})
	st, snap, pol := p.decision() // one snapshot for the whole request
	req := &creation{
		Creation: &adjust.Creation{Snap: snap, Ctr: ctr, Runtime: p.conn.runtime(), SkipUnsupported: st.cfg.UnsupportedEdits == config.UnsupportedWarn, HookFree: st.cfg.HookFree},
		st:       st, pol: pol, pod: pod,
	}
	ctx, cancel := context.WithTimeout(ctx, p.waitBound(ctx))
	defer cancel()
	adj, grant, err := p.serve(ctx, req, log)
	devices, score := specs.Names(grant.Devices), grant.Score
	p.metrics.Request(metrics.ResultOf(err != nil, len(devices)), rule(err), time.Since(start))
	if err != nil {
		log.Errorf("denied: %v", err)
		return nil, grant, bounded(fmt.Errorf("nri-gpu: container %q of pod %s/%s: %w",
			ctr.GetName(), pod.GetNamespace(), pod.GetName(), err))
	}
	if len(devices) == 0 {
		if adj != nil {
			log.Warnf("no devices requested; removed the annotations %s and %s, which only nri-gpu writes", DevicesAnnotation, CountedAnnotation)
		} else {
			log.Debug("no devices requested")
		}
		return adj, grant, nil
	}
	entry := log.WithField("devices", strings.Join(devices, ","))
	if score > 0 {
		entry = entry.WithField("topologyScore", score)
	}
	entry.Info("injected devices")
	return adj, grant, nil
}

// waitShare is the share of the runtime's patience that a request's
// waits (the DRA driver and so the API server, an MPS daemon) may take
// together: one over waitShare. The rest is for deciding, building and
// recording the grant, and the answer's way back: past the runtime's
// patience, containerd creates the container without nri-gpu's answer
// (no devices, no policy) and drops the plugin.
const waitShare = 2

// waitBound returns how long the waits of a request may take: a share
// of what the runtime waits for the answer (ctx's deadline, which ttrpc
// carries over from the runtime, else what the runtime said at
// Configure).
func (p *Plugin) waitBound(ctx context.Context) time.Duration {
	patience := p.conn.patience()
	if dl, ok := ctx.Deadline(); ok {
		patience = min(patience, time.Until(dl))
	}
	return patience / waitShare
}

// creation is one container's creation: its pod, the configuration it
// is served under and the policy as the creation's snapshot shows the
// hardware, beside what the adjustment is built of (adjust.Creation:
// the container, the runtime, each device resolved once).
type creation struct {
	*adjust.Creation
	st  *state
	pol *policy.Policy
	pod *api.PodSandbox
	// hookless are the devices (or kinds) whose apply-cuda-memory-limits
	// hook the adjustment left out (hook-free): nri-gpu sets the limits.
	hookless []string
}

// maxPlans bounds how often a request plans again when the pool changed
// between its plan and its commit. A stale plan means another request's
// commit took a device this one chose, so the pool filled: a request
// plans again at most as often as there are devices to take, and the
// bound is only a guard.
const maxPlans = 1024

// serve runs one request: what the container asks is parsed, checked by
// the policy and resolved once; the pool plans the grant; the adjustment
// is built and MPS readiness checked; only then is the grant held and
// recorded, in one step with one undo (commit). It returns the
// adjustment (nil when nothing is asked for) and what the pool granted.
func (p *Plugin) serve(ctx context.Context, r *creation, log logrus.FieldLogger) (*api.ContainerAdjustment, policy.Grant, error) {
	ask, err := r.st.parser.Parse(adjust.ContainerOf(r.pod, r.Ctr))
	if err != nil {
		return nil, policy.Grant{}, err
	}
	claims, held, err := p.claimDevices(ctx, r.pod, r.Ctr)
	if err != nil {
		return nil, policy.Grant{}, err
	}
	if ask.Empty() && len(held) == 0 {
		return adjust.Scrub(r.Ctr), policy.Grant{}, nil
	}
	if err := askedBounds(r.Ctr); err != nil {
		return nil, policy.Grant{}, err
	}
	pod := adjust.PodOf(r.pod)
	a := r.Decide(ask, held)
	for _, d := range a.ByRuntimeCDI {
		log.WithField("device", d).Info("device already injected by the runtime's own CDI support; not injected again")
	}
	a.Want.Pod, a.Want.Claims = pod, claims
	a.Want.Choice = policy.Choice{Candidates: r.Snap.Candidates(r.st.cfg.DefaultKind), Usable: r.Usable, Hooks: r.Snap.Hooks, Unhealthy: p.node.hw.Unhealthy(r.Snap)}
	if ask.Count > 1 {
		a.Want.Choice.Links = p.node.hw.Links()
	}
	a.Want.Choice.Kubelet = p.allocatedByKubelet(ctx, r, a.Want, log)
	for attempt := 1; ; attempt++ {
		// Planned even when it holds nothing new (only claims): the
		// pod's claims and holdings are checked against
		// policy.maxDevicesPerPod.
		plan, err := p.node.alloc.Plan(r.pol, a.Want)
		if err != nil {
			return nil, policy.Grant{}, err
		}
		adj, rec, err := p.build(ctx, r, a, plan, log)
		if err != nil {
			return nil, policy.Grant{}, err
		}
		if err := p.writeAccess(r, rec, adj); err != nil {
			return nil, policy.Grant{}, err
		}
		grant := policy.Grant{Pod: pod}
		if a.HoldsAny() {
			grant, err = p.commit(r.pol, plan)
		}
		if err != nil {
			p.forgetAccess(r.pod, r.Ctr)
		}
		if errors.Is(err, policy.ErrStale) && attempt < maxPlans {
			continue
		}
		if err != nil {
			return nil, policy.Grant{}, err
		}
		grant.Devices = append(grant.Devices, a.Claimed...)
		h := holding{pod: r.pod, ctr: r.Ctr, devs: append(plan.Devices(), a.Claimed...), claims: claims, hookless: r.hookless}
		p.limits.keep(r.pod, r.Ctr, p.boundsOf(r.pol, r.Snap, h, log))
		return adj, grant, nil
	}
}

// build builds the adjustment of what the plan grants: every device of
// the container but those the runtime injected itself, with what MPS
// needs for an MPS-shared GPU (once its daemon answers), and the
// annotations that say what the container got. It returns with it the
// access file: what the adjustment gives (nil when it gives nothing).
func (p *Plugin) build(ctx context.Context, r *creation, a adjust.Resolved, plan policy.Plan, log logrus.FieldLogger) (*api.ContainerAdjustment, *cdispec.Spec, error) {
	devices, err := r.Devices(a, plan.Counted())
	if err != nil {
		return nil, nil, err
	}
	given := append(plan.Devices(), a.Claimed...)
	// MPS: the client edits of the container's one MPS-shared GPU, once
	// its daemon is ready.
	edits, device, err := p.node.mps.sharing(r.pol, r.Snap).Edits(ctx, p.node.mps.mgr, given, a.Uses)
	if err != nil {
		return nil, nil, err
	}
	opts := r.Options(a.Injected)
	if edits != nil {
		opts.Extra = []adjust.Extra{{Name: "MPS of " + device, Edits: edits}}
	}
	res, err := adjust.Build(devices, r.Snap.HostNodes, opts)
	if err != nil {
		return nil, nil, err
	}
	for _, s := range res.Skipped {
		log.WithFields(logrus.Fields{"device": s.Device, "edit": s.Edit, "spec": s.Spec}).
			Warn("skipped a CDI edit the runtime cannot apply (unsupportedEdits: warn)")
	}
	r.hookless = nil
	for _, l := range res.LeftOut {
		if l.Hook == adjust.HookMemoryLimits {
			r.hookless = append(r.hookless, l.Device) // nri-gpu sets them (boundsOf)
			continue
		}
		log.WithFields(logrus.Fields{"device": l.Device, "hook": l.Hook}).Debugf("hookFree: left the hook out; the container lacks %s", l.Lacks)
	}
	for _, s := range res.Unneeded {
		log.WithFields(logrus.Fields{"device": s.Device, "edit": s.Edit, "spec": s.Spec}).
			Info("left out a CDI edit the runtime cannot apply and the container does not need (its process runs as root or has the groups)")
	}
	adjust.Annotate(res.Adjustment, r.Ctr, specs.Names(given), specs.Names(plan.Counted()))
	var names []string // the record's: nri-gpu's devices, then the runtime's
	for _, d := range slices.Concat(devices, a.Injected) {
		names = append(names, d.GetQualifiedName())
	}
	rec, err := access.New(access.Container{Namespace: r.pod.GetNamespace(), Pod: r.pod.GetName(), Name: r.Ctr.GetName()}, names, res.Given)
	if err != nil {
		return nil, nil, err
	}
	return res.Adjustment, rec, nil
}

// writeAccess writes rec, the access file of what adj gives the request's
// container, and adds its mount to adj; nothing without access files.
func (p *Plugin) writeAccess(r *creation, rec *cdispec.Spec, adj *api.ContainerAdjustment) error {
	if rec == nil {
		return nil
	}
	if err := p.node.access.Write(r.pod.GetId(), r.Ctr.GetId(), rec, adj); err != nil {
		return fmt.Errorf("writing the container's access file (%s): %w", access.Path, err)
	}
	return nil
}

// forgetAccess removes the access file of what a container was given.
func (p *Plugin) forgetAccess(pod *api.PodSandbox, ctr *api.Container) {
	if err := p.node.access.Remove(pod.GetId(), ctr.GetId()); err != nil {
		p.log.WithFields(logrus.Fields{"namespace": pod.GetNamespace(), "pod": pod.GetName(), "container": ctr.GetName()}).
			Warnf("removing the container's access file: %v", err)
	}
}

// commit holds what the plan grants and records it, in one step with
// one undo: a grant that adds to what pods hold is written before the
// container gets it, and taken back when the record cannot keep it (a
// holding only memory knows would be handed out again after a restart).
func (p *Plugin) commit(pol *policy.Policy, plan policy.Plan) (policy.Grant, error) {
	grant, err := p.node.alloc.Commit(pol, plan)
	if err != nil || !grant.Added() {
		return grant, err
	}
	if err := p.saveOrUndo(func() { p.node.alloc.Revert(grant) }); err != nil {
		return policy.Grant{}, fmt.Errorf("devices not given, since their grant %w", err)
	}
	return grant, nil
}

// claimDevices returns the UIDs of the prepared claims the container
// uses, and their devices (link.Used); none without DRA. When the DRA
// driver cannot tell and no prepared claim may be the pod's, it goes on
// without claims, said in the log. It waits as long as ctx lets it (the
// request's share of the runtime's patience).
func (p *Plugin) claimDevices(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) ([]string, []policy.ClaimDevice, error) {
	ref := link.PodRef{Namespace: pod.GetNamespace(), Name: pod.GetName(), UID: pod.GetUid()}
	uids, devs, err := link.Used(ctx, p.doors.claims, p.node.alloc, ref, ctr.GetName())
	if errors.Is(err, link.ErrNoClaimMay) {
		p.log.WithFields(logrus.Fields{"namespace": pod.GetNamespace(), "pod": pod.GetName()}).Warn(err)
		return nil, nil, nil
	}
	return uids, devs, err
}
