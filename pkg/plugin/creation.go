package plugin

import (
	"slices"

	"github.com/containerd/nri/pkg/api"
	"github.com/sirupsen/logrus"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/nri-gpu/nri-gpu/pkg/adjust"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// creation is one container's creation: its pod and container, the
// configuration and runtime it is served under, and the one snapshot of
// the specs in which each device is resolved once.
type creation struct {
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
func (r *creation) resolve(name string) (*specs.Entry, error) {
	if got, ok := r.resolved[name]; ok {
		return got.entry, got.err
	}
	e, err := r.snap.Lookup(name)
	r.resolved[name] = resolved{entry: e, err: err}
	return e, err
}

// asked returns a device asked for by name as the admission judges it:
// its footprint and hooks, or why it does not resolve.
func (r *creation) asked(name string, q *policy.Request) (policy.Asked, *specs.Entry) {
	e, err := r.resolve(name)
	if err != nil {
		return policy.Asked{Device: specs.Device{Name: name}, Request: q, Unresolved: err}, nil
	}
	return policy.Asked{Device: e.Footprint, Request: q, Hooks: e.Hooks}, e
}

// usable says why the container cannot have device d: edits the runtime
// cannot apply; nil if it can. What a count request passes over.
func (r *creation) usable(d specs.Device) error {
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
func (r *creation) options(injected []*cdi.Device) adjust.Options {
	return adjust.Options{
		SpecPath:        r.snap.SpecPath,
		SkipUnsupported: r.st.cfg.UnsupportedEdits == config.UnsupportedWarn,
		Injected:        injected,
		UID:             r.ctr.GetUser().GetUid(),
		GID:             r.ctr.GetUser().GetGid(),
		AdditionalGIDs:  r.ctr.GetUser().GetAdditionalGids(),
		UserUnknown:     r.ctr.GetUser() == nil,
		Runtime:         r.rt,
		UserNS:          adjust.UserNS(r.ctr),
		HookFree:        r.st.cfg.HookFree,
		Sonames:         r.snap.Sonames,
	}
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

// holdsAny reports whether the request asks the pool for anything: to hold
// devices, or to count the claims it uses towards its pod's (their
// devices are the claims' holdings already).
func holdsAny(a resolvedAsk) bool {
	return len(a.want.Named) > 0 || a.want.Count > 0 || len(a.want.Claims) > 0
}

// decide resolves what a container asks for by name, each device once,
// for the admission to judge: the devices of the claims it uses (to be
// injected unless the runtime did; not held again), its requests (held
// by the pod; injected unless the runtime's own CDI did, or injects
// them from its own spec dirs).
func (r *creation) decide(ask policy.Ask, held []policy.ClaimDevice, log logrus.FieldLogger) resolvedAsk {
	a := resolvedAsk{claimed: policy.Footprints(held), want: policy.Want{Count: ask.Count}}
	for i := range held {
		d, e := r.asked(held[i].Name, nil)
		d.Claim = &held[i]
		a.want.Used = append(a.want.Used, d)
		if e == nil {
			continue
		}
		a.inject = append(a.inject, e)
		if adjust.InjectedByRuntime(e, r.ctr) {
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
			if q.Origin == policy.OriginCDI && adjust.InjectedByRuntime(e, r.ctr) {
				a.injected = append(a.injected, e.Device)
				log.WithField("device", q.Device).Info("device already injected by the runtime's own CDI support; not injected again")
			}
		}
	}
	return a
}
