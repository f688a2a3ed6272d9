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
	"tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nri-gpu/nri-gpu/pkg/access"
	"github.com/nri-gpu/nri-gpu/pkg/adjust"
	"github.com/nri-gpu/nri-gpu/pkg/config"
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
	p.recovered.add(pod.GetId(), ctr.GetId())
	adj, _, err := p.Create(ctx, pod, ctr)
	if err != nil && p.recovered.remove(pod.GetId(), ctr.GetId()) {
		p.release(pod) // its other containers were removed meanwhile
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
	req := &request{st: p.state(), rt: p.conn.runtime(), pod: pod, ctr: ctr, resolved: map[string]resolved{}}
	req.snap = req.st.specs.Snapshot() // one snapshot for the whole request
	req.pol = p.hw.PolicyIn(req.st.policy, req.snap)
	ctx, cancel := context.WithTimeout(ctx, p.waitBound(ctx))
	defer cancel()
	adj, grant, err := p.serve(ctx, req, log)
	devices, score := specs.Names(grant.Devices), grant.Score
	result := metrics.ResultInjected
	switch {
	case err != nil:
		result = metrics.ResultDenied
	case len(devices) == 0:
		result = metrics.ResultNone
	}
	p.metrics.Request(result, rule(err), time.Since(start))
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

// request is one container's creation: its pod and container, the
// configuration and runtime it is served under, and the one snapshot of
// the specs in which each device is resolved once.
type request struct {
	st   *state
	snap *specs.Snapshot
	// pol is the policy as snap shows the hardware.
	pol      *policy.Policy
	rt       adjust.Runtime
	pod      *api.PodSandbox
	ctr      *api.Container
	resolved map[string]resolved
}

// resolved is a device looked up for a request, and whether the
// container can have it alone (usable: its edits build).
type resolved struct {
	entry  *specs.Entry
	err    error
	usable error
	built  bool
}

// resolve looks a device up in the request's snapshot, once per
// request.
func (r *request) resolve(name string) (*specs.Entry, error) {
	if got, ok := r.resolved[name]; ok {
		return got.entry, got.err
	}
	e, err := r.snap.Lookup(name)
	r.resolved[name] = resolved{entry: e, err: err}
	return e, err
}

// asked returns a device asked for by name as the admission judges it:
// its footprint and hooks, or why it does not resolve.
func (r *request) asked(name string, q *policy.Request) (policy.Asked, *specs.Entry) {
	e, err := r.resolve(name)
	if err != nil {
		return policy.Asked{Device: specs.Device{Name: name}, Request: q, Unresolved: err}, nil
	}
	return policy.Asked{Device: e.Footprint, Request: q, Hooks: e.Hooks}, e
}

// usable says why the container cannot have device d: edits the runtime
// cannot apply; nil if it can. What a count request passes over.
func (r *request) usable(d specs.Device) error {
	e, err := r.resolve(d.Name)
	if err != nil {
		return err
	}
	got := r.resolved[d.Name]
	if !got.built {
		_, got.usable = adjust.Build([]*cdi.Device{e.Device}, r.snap.HostNodes, r.options(nil))
		got.built = true
		r.resolved[d.Name] = got
	}
	return got.usable
}

// options are the options of adjust.Build for the request's container.
func (r *request) options(injected []*cdi.Device) adjust.Options {
	return adjust.Options{
		SpecPath:        r.snap.SpecPath,
		SkipUnsupported: r.st.cfg.UnsupportedEdits == config.UnsupportedWarn,
		Injected:        injected,
		UID:             r.ctr.GetUser().GetUid(),
		GID:             r.ctr.GetUser().GetGid(),
		AdditionalGIDs:  r.ctr.GetUser().GetAdditionalGids(),
		UserUnknown:     r.ctr.GetUser() == nil,
		Runtime:         r.rt,
		UserNS:          userNS(r.ctr),
		HookFree:        r.st.cfg.HookFree,
		Sonames:         r.snap.Sonames,
	}
}

// userNS reports whether the container has a user namespace of its own
// (a pod with hostUsers: false, CRI's userns_options).
func userNS(ctr *api.Container) bool {
	return slices.ContainsFunc(ctr.GetLinux().GetNamespaces(), func(ns *api.LinuxNamespace) bool { return ns.GetType() == "user" })
}

// resolvedAsk is what a container asks for, resolved: the devices to inject
// (those of its claims and its requests by name), those of them the
// runtime injected itself, what the pool is asked (to hold by name, and
// the count request), and the claims it uses.
type resolvedAsk struct {
	inject   []*specs.Entry
	injected []*cdi.Device
	want     policy.Want
	claimed  []specs.Device
	// uses are what the claims consume of the shared devices among
	// claimed, and asked of their sharing, by name.
	uses map[string]policy.ClaimDevice
}

// claimUses returns what the claims' devices consume of shared devices and
// asked of their sharing, by name: a device in two of the container's
// claims, what the two consume together, within the tighter of what
// they asked.
func claimUses(held []policy.ClaimDevice) map[string]policy.ClaimDevice {
	tighter := func(a, b int64) int64 {
		if a == 0 || (b != 0 && b < a) {
			return b
		}
		return a
	}
	out := map[string]policy.ClaimDevice{}
	for _, d := range held {
		u, ok := out[d.Name]
		if !ok {
			out[d.Name] = d
			continue
		}
		u.Use.Shares += d.Use.Shares
		u.Use.Memory += d.Use.Memory
		u.GpuConfig.ActiveThreadPercentage = int(tighter(int64(u.GpuConfig.ActiveThreadPercentage), int64(d.GpuConfig.ActiveThreadPercentage)))
		u.GpuConfig.PinnedMemory = tighter(u.GpuConfig.PinnedMemory, d.GpuConfig.PinnedMemory)
		out[d.Name] = u
	}
	return out
}

// holds reports whether the request asks the pool for anything: to hold
// devices, or to count the claims it uses towards its pod's (their
// devices are the claims' holdings already).
func (a resolvedAsk) holds() bool {
	return len(a.want.Named) > 0 || a.want.Count > 0 || len(a.want.Claims) > 0
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
func (p *Plugin) serve(ctx context.Context, r *request, log logrus.FieldLogger) (*api.ContainerAdjustment, policy.Grant, error) {
	ask, err := r.st.parser.Parse(containerOf(r.pod, r.ctr))
	if err != nil {
		return nil, policy.Grant{}, err
	}
	claims, held, err := p.claimDevices(ctx, r.pod, r.ctr)
	if err != nil {
		return nil, policy.Grant{}, err
	}
	claimed := policy.Footprints(held)
	if ask.Empty() && len(claimed) == 0 {
		return scrub(r.ctr), policy.Grant{}, nil
	}
	pod := podOf(r.pod)
	a := r.decide(ask, held, log)
	a.uses = claimUses(held)
	a.want.Pod, a.want.Claims = pod, claims
	a.want.Choice = policy.Choice{Candidates: r.snap.Candidates(r.st.cfg.DefaultKind), Usable: r.usable, Hooks: r.snap.Hooks, Unhealthy: p.hw.Unhealthy(r.snap)}
	if ask.Count > 1 {
		a.want.Choice.Links = p.hw.Links()
	}
	a.want.Choice.Kubelet = p.allocatedByKubelet(ctx, r, a.want, log)
	for attempt := 1; ; attempt++ {
		// Planned even when it holds nothing new (only claims): the
		// pod's claims and holdings are checked against
		// policy.maxDevicesPerPod.
		plan, err := p.alloc.Plan(r.pol, a.want)
		if err != nil {
			return nil, policy.Grant{}, err
		}
		adj, rec, err := p.build(ctx, r, a, plan, log)
		if err != nil {
			return nil, policy.Grant{}, err
		}
		if err := p.keepAccess(r, rec, adj); err != nil {
			return nil, policy.Grant{}, err
		}
		grant := policy.Grant{Pod: pod}
		if a.holds() {
			grant, err = p.commit(r.pol, plan)
		}
		if err != nil {
			p.forgetAccess(r.pod, r.ctr)
		}
		if errors.Is(err, policy.ErrStale) && attempt < maxPlans {
			continue
		}
		if err != nil {
			return nil, policy.Grant{}, err
		}
		grant.Devices = append(grant.Devices, claimed...)
		return adj, grant, nil
	}
}

// decide resolves what a container asks for by name, each device once,
// for the admission to judge: the devices of the claims it uses (to be
// injected unless the runtime did; not held again), its requests (held
// by the pod; injected unless the runtime's own CDI did, or injects
// them from its own spec dirs).
func (r *request) decide(ask policy.Ask, held []policy.ClaimDevice, log logrus.FieldLogger) resolvedAsk {
	a := resolvedAsk{claimed: policy.Footprints(held), want: policy.Want{Count: ask.Count}}
	for i := range held {
		d, e := r.asked(held[i].Name, nil)
		d.Claim = &held[i]
		a.want.Used = append(a.want.Used, d)
		if e == nil {
			continue
		}
		a.inject = append(a.inject, e)
		if injectedByRuntime(e, r.ctr) {
			a.injected = append(a.injected, e.Device)
		}
	}
	for i := range ask.Requests {
		q := &ask.Requests[i]
		if q.Origin == policy.OriginRuntime && slices.ContainsFunc(a.claimed, func(d specs.Device) bool { return d.Name == q.Device }) {
			continue // a claim's, above
		}
		if q.Origin == policy.OriginRuntime {
			// The runtime injects it from its own spec dirs: it is held
			// by the pod, and its spec's edits are not applied again.
			a.want.Named = append(a.want.Named, policy.Asked{Device: r.snap.Footprints([]string{q.Device})[0], Request: q})
			if e, err := r.snap.Lookup(q.Device); err == nil {
				a.injected = append(a.injected, e.Device)
			}
			continue
		}
		d, e := r.asked(q.Device, q)
		a.want.Named = append(a.want.Named, d)
		if e != nil {
			a.inject = append(a.inject, e)
			if q.Origin == policy.OriginCDI && injectedByRuntime(e, r.ctr) {
				a.injected = append(a.injected, e.Device)
				log.WithField("device", q.Device).Info("device already injected by the runtime's own CDI support; not injected again")
			}
		}
	}
	return a
}

// build builds the adjustment of what the plan grants: every device of
// the container but those the runtime injected itself, with what MPS
// needs for an MPS-shared GPU (once its daemon answers), and the
// annotations that say what the container got. It returns with it the
// record of what the adjustment gives (nil when it gives nothing).
func (p *Plugin) build(ctx context.Context, r *request, a resolvedAsk, plan policy.Plan, log logrus.FieldLogger) (*api.ContainerAdjustment, *cdispec.Spec, error) {
	var devices []*cdi.Device
	for _, e := range a.inject {
		if !slices.Contains(a.injected, e.Device) {
			devices = append(devices, e.Device)
		}
	}
	var errs []error
	for _, c := range plan.Counted() {
		e, err := r.resolve(c.Name)
		if err != nil {
			errs = append(errs, fmt.Errorf("pod annotation %q: %w", policy.CountAnnotationKey, err))
			continue
		}
		devices = append(devices, e.Device)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, nil, err
	}
	given := append(plan.Devices(), a.claimed...)
	// MPS: the client edits of the container's one MPS-shared GPU, once
	// its daemon is ready.
	edits, device, err := p.mps.sharing(r.pol, r.snap).Edits(ctx, p.mps.mgr, given, a.uses)
	if err != nil {
		return nil, nil, err
	}
	opts := r.options(a.injected)
	if edits != nil {
		opts.Extra = []adjust.Extra{{Name: "MPS of " + device, Edits: edits}}
	}
	res, err := adjust.Build(devices, r.snap.HostNodes, opts)
	if err != nil {
		return nil, nil, err
	}
	for _, s := range res.Skipped {
		log.WithFields(logrus.Fields{"device": s.Device, "edit": s.Edit, "spec": s.Spec}).
			Warn("skipped a CDI edit the runtime cannot apply (unsupportedEdits: warn)")
	}
	for _, l := range res.LeftOut {
		log.WithFields(logrus.Fields{"device": l.Device, "hook": l.Hook}).Debugf("hookFree: left the hook out; the container lacks %s", l.Lacks)
	}
	for _, s := range res.Unneeded {
		log.WithFields(logrus.Fields{"device": s.Device, "edit": s.Edit, "spec": s.Spec}).
			Info("left out a CDI edit the runtime cannot apply and the container does not need (its process runs as root or has the groups)")
	}
	res.Adjustment.AddAnnotation(DevicesAnnotation, strings.Join(specs.Names(given), ","))
	if counted := plan.Counted(); len(counted) > 0 {
		res.Adjustment.AddAnnotation(CountedAnnotation, strings.Join(specs.Names(counted), ","))
	} else if _, ok := r.ctr.GetAnnotations()[CountedAnnotation]; ok {
		res.Adjustment.RemoveAnnotation(CountedAnnotation)
	}
	var names []string // the record's: nri-gpu's devices, then the runtime's
	for _, d := range slices.Concat(devices, a.injected) {
		names = append(names, d.GetQualifiedName())
	}
	rec, err := access.New(access.Container{Namespace: r.pod.GetNamespace(), Pod: r.pod.GetName(), Name: r.ctr.GetName()}, names, res.Given)
	if err != nil {
		return nil, nil, err
	}
	return res.Adjustment, rec, nil
}

// keepAccess keeps rec, the record of what adj gives the request's
// container, and adds its mount to adj; nothing without records.
func (p *Plugin) keepAccess(r *request, rec *cdispec.Spec, adj *api.ContainerAdjustment) error {
	if p.access == nil || rec == nil {
		return nil
	}
	if err := p.access.Write(r.pod.GetId(), r.ctr.GetId(), rec, adj); err != nil {
		return fmt.Errorf("keeping the record of what the container is given (%s): %w", access.Path, err)
	}
	return nil
}

// forgetAccess removes the record of what a container was given.
func (p *Plugin) forgetAccess(pod *api.PodSandbox, ctr *api.Container) {
	if p.access == nil {
		return
	}
	if err := p.access.Remove(pod.GetId(), ctr.GetId()); err != nil {
		p.log.WithFields(logrus.Fields{"namespace": pod.GetNamespace(), "pod": pod.GetName(), "container": ctr.GetName()}).
			Warnf("removing the record of what the container was given: %v", err)
	}
}

// commit holds what the plan grants and records it, in one step with
// one undo: a grant that adds to what pods hold is written before the
// container gets it, and taken back when the record cannot keep it (a
// holding only memory knows would be handed out again after a restart).
func (p *Plugin) commit(pol *policy.Policy, plan policy.Plan) (policy.Grant, error) {
	grant, err := p.alloc.Commit(pol, plan)
	if err != nil || !grant.Added() {
		return grant, err
	}
	if err := p.keepOrUndo(func() { p.alloc.Revert(grant) }); err != nil {
		return policy.Grant{}, fmt.Errorf("devices not given, since their grant %w", err)
	}
	return grant, nil
}

// scrub returns the adjustment that removes the annotations nri-gpu
// writes from a container it gives nothing, or nil if it has none.
func scrub(ctr *api.Container) *api.ContainerAdjustment {
	var adj *api.ContainerAdjustment
	for _, key := range []string{DevicesAnnotation, CountedAnnotation} {
		if _, ok := ctr.GetAnnotations()[key]; ok {
			if adj == nil {
				adj = &api.ContainerAdjustment{}
			}
			adj.RemoveAnnotation(key)
		}
	}
	return adj
}

// cdiDeviceNames returns the CDI devices the runtime reports it injects
// into the container.
func cdiDeviceNames(ctr *api.Container) []string {
	var out []string
	for _, d := range ctr.GetCDIDevices() {
		out = append(out, d.GetName())
	}
	return out
}

// injectedByRuntime reports whether the runtime already injected a device
// into the container (containerd's own CDI support, enable_cdi, acting on
// a cdi.k8s.io annotation before NRI is called): the runtime reports it
// among the CDI devices it injects (containerd 2.x), or every device node
// and env entry of the device's own edits is there already. A device the
// runtime does not report and whose edits have neither cannot be told
// apart and counts as not injected.
func injectedByRuntime(e *specs.Entry, ctr *api.Container) bool {
	if slices.Contains(cdiDeviceNames(ctr), e.Footprint.Name) {
		return true
	}
	edits := e.Device.ContainerEdits
	if len(edits.DeviceNodes) == 0 && len(edits.Env) == 0 {
		return false
	}
	for _, n := range edits.DeviceNodes {
		if n != nil && !slices.ContainsFunc(ctr.GetLinux().GetDevices(), func(d *api.LinuxDevice) bool { return d.GetPath() == n.Path }) {
			return false
		}
	}
	for _, kv := range edits.Env {
		if !slices.Contains(ctr.GetEnv(), kv) {
			return false
		}
	}
	return true
}

func podOf(pod *api.PodSandbox) policy.Pod {
	return policy.Pod{ID: pod.GetId(), Namespace: pod.GetNamespace(), Name: pod.GetName()}
}
