package adjust

import (
	"errors"
	"fmt"
	"slices"

	"github.com/containerd/nri/pkg/api"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// Creation is one container's creation as the adjustment is built for
// it: the container, what the runtime applies, and the one snapshot of
// the specs in which each device it asks for is resolved once.
type Creation struct {
	Snap *specs.Snapshot
	Ctr  *api.Container
	// Runtime is what the connected runtime applies.
	Runtime Runtime
	// SkipUnsupported and HookFree are the configuration's (see
	// Options).
	SkipUnsupported, HookFree bool
	resolved                  map[string]resolved
}

// resolved is a device looked up for a creation, and whether the
// container can have it alone (usable: its edits build).
type resolved struct {
	entry  *specs.Entry
	err    error
	usable error
	built  bool
}

// Resolve looks a device up in the creation's snapshot, once per
// creation.
func (c *Creation) Resolve(name string) (*specs.Entry, error) {
	if got, ok := c.resolved[name]; ok {
		return got.entry, got.err
	}
	e, err := c.Snap.Lookup(name)
	if c.resolved == nil {
		c.resolved = map[string]resolved{}
	}
	c.resolved[name] = resolved{entry: e, err: err}
	return e, err
}

// asked returns a device asked for by name as the admission judges it:
// its footprint and hooks, or why it does not resolve.
func (c *Creation) asked(name string, q *policy.Request) (policy.Asked, *specs.Entry) {
	e, err := c.Resolve(name)
	if err != nil {
		return policy.Asked{Device: specs.Device{Name: name}, Request: q, Unresolved: err}, nil
	}
	return policy.Asked{Device: e.Footprint, Request: q, Hooks: e.Hooks}, e
}

// Usable says why the container cannot have device d: edits the runtime
// cannot apply; nil if it can. What a count request passes over.
func (c *Creation) Usable(d specs.Device) error {
	e, err := c.Resolve(d.Name)
	if err != nil {
		return err
	}
	got := c.resolved[d.Name]
	if !got.built {
		_, got.usable = Build([]*cdi.Device{e.Device}, c.Snap.HostNodes, c.Options(nil))
		got.built = true
		c.resolved[d.Name] = got
	}
	return got.usable
}

// Options are the options of Build for the creation's container, the
// devices the runtime injected itself injected.
func (c *Creation) Options(injected []*cdi.Device) Options {
	return Options{
		SpecPath:        c.Snap.SpecPath,
		SkipUnsupported: c.SkipUnsupported,
		Injected:        injected,
		UID:             c.Ctr.GetUser().GetUid(),
		GID:             c.Ctr.GetUser().GetGid(),
		AdditionalGIDs:  c.Ctr.GetUser().GetAdditionalGids(),
		UserUnknown:     c.Ctr.GetUser() == nil,
		Runtime:         c.Runtime,
		UserNS:          UserNS(c.Ctr),
		HookFree:        c.HookFree,
		Sonames:         c.Snap.Sonames,
	}
}

// Resolved is what a container asks for, resolved: the devices to
// inject (those of its claims and its requests by name), those of them
// the runtime injected itself, what the pool is asked (to hold by name,
// and the count request), and the claims it uses.
type Resolved struct {
	Inject   []*specs.Entry
	Injected []*cdi.Device
	Want     policy.Want
	Claimed  []specs.Device
	// Uses are what the claims consume of the shared devices among
	// Claimed, and asked of their sharing, by name.
	Uses map[string]policy.ClaimDevice
	// ByRuntimeCDI names the devices asked for by cdi.k8s.io that the
	// runtime's own CDI injected already: not injected again.
	ByRuntimeCDI []string
}

// HoldsAny reports whether the request asks the pool for anything: to
// hold devices, or to count the claims it uses towards its pod's (their
// devices are the claims' holdings already).
func (a Resolved) HoldsAny() bool {
	return len(a.Want.Named) > 0 || a.Want.Count > 0 || len(a.Want.Claims) > 0
}

// Decide resolves what a container asks for by name, each device once,
// for the admission to judge: the devices of the claims it uses (held,
// to be injected unless the runtime did; not held again), its requests
// (held by the pod; injected unless the runtime's own CDI did, or
// injects them from its own spec dirs).
func (c *Creation) Decide(ask policy.Ask, held []policy.ClaimDevice) Resolved {
	a := Resolved{Claimed: policy.Footprints(held), Want: policy.Want{Count: ask.Count}, Uses: policy.ClaimUses(held)}
	for i := range held {
		d, e := c.asked(held[i].Name, nil)
		d.Claim = &held[i]
		a.Want.Used = append(a.Want.Used, d)
		if e == nil {
			continue
		}
		a.Inject = append(a.Inject, e)
		if InjectedByRuntime(e, c.Ctr) {
			a.Injected = append(a.Injected, e.Device)
		}
	}
	for i := range ask.Requests {
		q := &ask.Requests[i]
		if q.Origin == policy.OriginRuntime && slices.ContainsFunc(a.Claimed, func(d specs.Device) bool { return d.Name == q.Device }) {
			continue // a claim's, above
		}
		if q.Origin == policy.OriginRuntime {
			// The runtime injects it from its own spec dirs: it is held
			// by the pod, and its spec's edits are not applied again.
			a.Want.Named = append(a.Want.Named, policy.Asked{Device: c.Snap.Footprints([]string{q.Device})[0], Request: q})
			if e, err := c.Snap.Lookup(q.Device); err == nil {
				a.Injected = append(a.Injected, e.Device)
			}
			continue
		}
		d, e := c.asked(q.Device, q)
		a.Want.Named = append(a.Want.Named, d)
		if e != nil {
			a.Inject = append(a.Inject, e)
			if q.Origin == policy.OriginCDI && InjectedByRuntime(e, c.Ctr) {
				a.Injected = append(a.Injected, e.Device)
				a.ByRuntimeCDI = append(a.ByRuntimeCDI, q.Device)
			}
		}
	}
	return a
}

// Devices returns the devices to inject of what a container is granted:
// a's (less those the runtime injected itself), then those chosen for
// its count (counted, resolved in the creation's snapshot).
func (c *Creation) Devices(a Resolved, counted []specs.Device) ([]*cdi.Device, error) {
	var devices []*cdi.Device
	for _, e := range a.Inject {
		if !slices.Contains(a.Injected, e.Device) {
			devices = append(devices, e.Device)
		}
	}
	var errs []error
	for _, d := range counted {
		e, err := c.Resolve(d.Name)
		if err != nil {
			errs = append(errs, fmt.Errorf("pod annotation %q: %w", policy.CountAnnotationKey, err))
			continue
		}
		devices = append(devices, e.Device)
	}
	return devices, errors.Join(errs...)
}
