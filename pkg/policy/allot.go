package policy

import (
	"fmt"
	"slices"
	"time"

	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// AllotFor is how long a device kubelet allocated through nri-gpu's
// device plugin is kept as kubelet's before its pod-resources API lists
// it (Allot). kubelet records an allocation as soon as the device
// plugin's Allocate answers, within its admission of the pod; a minute
// outlasts that by far, and a device whose pod kubelet then failed
// anyway is chosen again after it.
const AllotFor = time.Minute

// allotment is a device kubelet allocated a pod it is admitting, kept
// until a time.
type allotment struct {
	device specs.Device
	until  time.Time
}

// Allot keeps devs, which kubelet allocates through nri-gpu's device
// plugin to a pod it is admitting (the plugin's Allocate), as kubelet's
// until the pod's container holds them (Commit of kubelet's request) or
// for AllotFor: kubelet's pod-resources API lists them only once its
// admission ends, and until then no count request, claim or request by
// name under policy.exclusive takes them, nor does a Commit planned
// before (ErrStale). It first asks the admission, as Room does for the
// device plugin's offer, whether the door may still give each device
// now: kubelet chose from a list it was told before another door took
// one (both at once, as after a restart); then nothing is kept and the
// admission's reason returned, and kubelet fails that pod's admission
// instead of leaving its container refused for as long as the other
// holder lives. A shared device's replicas are not kept (kubelet counts
// them itself), only judged.
func (a *Allocations) Allot(p *Policy, devs []specs.Device, ch Choice) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, d := range devs {
		q := &question{p: p, a: a, door: DevicePlugin, offer: true, named: []Asked{{Device: d}}, choice: ch, exclusive: true}
		if err := q.decide(ofRequests, ofPool); err != nil {
			return err
		}
		v := a.judge(p, q.who(q.named[0]), d)
		if v.usersLeft() > 0 {
			continue
		}
		if err := v.coexistence(d, true); err != nil {
			return err
		}
		return deny(RuleSharing, fmt.Errorf("%w: device %q: its users are as many as policy.sharing lets it have", ErrDenied, d.Name))
	}
	now := a.clock()
	a.allotted = slices.DeleteFunc(a.allotted, func(k allotment) bool { return !now.Before(k.until) })
	for _, d := range devs {
		if p.Sharing(d) == nil {
			a.allotted = append(a.allotted, allotment{device: d, until: now.Add(AllotFor)})
		}
	}
	return nil
}

// consumeAllotted forgets what Allot keeps of d, under a.mu: the pod
// kubelet allocated it holds it now, and it is free once that pod is
// released.
func (a *Allocations) consumeAllotted(d specs.Device) {
	a.allotted = slices.DeleteFunc(a.allotted, func(k allotment) bool { return k.device.Overlaps(d) })
}

// withAllotted returns ch with the devices Allot keeps added to what
// kubelet allocated (to a pod not named yet), under a.mu.
func (a *Allocations) withAllotted(ch Choice) Choice {
	now := a.clock()
	ch.Kubelet = slices.Clip(ch.Kubelet) // the caller's slice is not written
	for _, k := range a.allotted {
		if now.Before(k.until) {
			ch.Kubelet = append(ch.Kubelet, KubeletAllocation{Device: k.device})
		}
	}
	return ch
}

// clock is the pool's time: time.Now unless a test set now.
func (a *Allocations) clock() time.Time {
	if a.now != nil {
		return a.now()
	}
	return time.Now()
}
