package policy

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// Claim is a Dynamic Resource Allocation claim (a ResourceClaim) that
// kubelet had nri-gpu prepare on the node. The devices allocated to it
// are held by the claim, whichever pods use it: the pods it is reserved
// for share them, and no one else gets them through any door.
type Claim struct {
	// UID, Namespace and Name are the ResourceClaim's.
	UID, Namespace, Name string
	// Pods are the pods the claim was reserved for when it was
	// prepared.
	Pods []PodName
}

// MayBeUsedBy reports whether a pod of namespace may use the claim, as
// far as nri-gpu knows without the API server: any pod of the claim's
// namespace may, once the claim is reserved for it, and that may be
// later than kubelet prepared it on the node (a shared claim); the pods
// it was reserved for then are of that namespace too.
func (c Claim) MayBeUsedBy(namespace string) bool { return c.Namespace == namespace }

// String returns "claim ns/name of pod ns/pod" for messages.
func (c Claim) String() string {
	s := "claim " + c.Namespace + "/" + c.Name
	switch len(c.Pods) {
	case 0:
		return s
	case 1:
		return s + " of pod " + c.Pods[0].String()
	}
	return s + " of pods " + strings.Join(podNames(c.Pods), ", ")
}

// ClaimDevice is a device allocated to a claim.
type ClaimDevice struct {
	specs.Device
	// Requests are the claim's requests it was allocated for.
	Requests []string
	// Use is what kube-scheduler allocated the claim of the device when
	// it is shared by consumable capacity (zero: one share and the
	// default memory).
	Use Use
	// MemoryAsked says the claim asked for an amount of memory of it
	// (not kept across a restart: it was judged when prepared).
	MemoryAsked bool
	// GpuConfig is what the claim asked of how it is shared.
	GpuConfig GpuConfig
}

// ClaimHolding is a prepared claim and its devices, as kept across a
// restart.
type ClaimHolding struct {
	Claim   Claim
	Devices []ClaimDevice
}

type claimHolding struct {
	claim   Claim
	devices []ClaimDevice
}

// Footprints returns the claim's devices.
func (c ClaimHolding) Footprints() []specs.Device { return footprints(c.Devices) }

// Footprints returns the devices of devs.
func Footprints(devs []ClaimDevice) []specs.Device { return footprints(devs) }

func footprints(devs []ClaimDevice) []specs.Device {
	out := make([]specs.Device, 0, len(devs))
	for _, d := range devs {
		out = append(out, d.Device)
	}
	return out
}

// ErrNotPrepared is wrapped by the error for a claim nri-gpu has not
// prepared on the node.
var ErrNotPrepared = errors.New("claim not prepared on this node")

// AdmitClaim decides, under p's rules (the admission's every step),
// whether a claim may hold the devices it was allocated, resolved in
// the request's snapshot (each Asked's Claim says what the allocation
// gave it), and records them as the claim's. ch says what the node says
// of the devices (health, kubelet's allocations). Preparing a claim
// again with the same devices (kubelet does, after a restart) keeps
// what it holds; prepared again with others (its allocation changed
// hands), they are judged anew, as if it held nothing, and replace what
// it held, or it keeps those.
//
// It returns what undoes the change (nil when nothing changed): a claim
// whose preparation cannot be recorded is not prepared.
func (a *Allocations) AdmitClaim(p *Policy, c Claim, devices []Asked, ch Choice) (undo func(), err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	held := make([]ClaimDevice, 0, len(devices))
	for _, d := range devices {
		cd := ClaimDevice{Device: d.Device}
		if d.Claim != nil {
			cd = *d.Claim
			cd.Device = d.Device
		}
		held = append(held, cd)
	}
	old, again := a.claims[c.UID]
	if again {
		if slices.EqualFunc(old.devices, held, func(x, y ClaimDevice) bool { return x.Name == y.Name }) {
			return nil, nil
		}
		delete(a.claims, c.UID) // judged as if it held nothing
		defer func() {
			if err != nil {
				a.claims[c.UID] = old
			}
		}()
	}
	q := &question{p: p, a: a, claim: &c, door: DRA, named: slices.Clone(devices), choice: a.withAllotted(ch), exclusive: true}
	for i := range q.named {
		if q.named[i].Claim == nil {
			q.named[i].Claim = &held[i]
		}
	}
	// Whatever exclusive says: a claim's devices are its own, but for a
	// shared device's replicas.
	if err := q.decide(ofRequests, ofPool); err != nil {
		return nil, err
	}
	a.claims[c.UID] = &claimHolding{claim: c, devices: held}
	return func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		delete(a.claims, c.UID)
		if again {
			a.claims[c.UID] = old
		}
	}, nil
}

// checkClaimMax refuses a claim after whose preparation a pod it is
// reserved for would hold more than policy.maxDevicesPerPod devices,
// through every door (podHolds), or that would hold more itself where
// it is reserved for no pod.
func (a *Allocations) checkClaimMax(p *Policy, c Claim, devs []specs.Device) error {
	if len(c.Pods) == 0 {
		return p.checkMax("it", devs, nil) // the caller names the claim
	}
	for _, pod := range c.Pods {
		var holdings []*holding
		for _, id := range slices.Sorted(maps.Keys(a.pods)) {
			if h := a.pods[id]; h.pod.Named() == pod {
				holdings = append(holdings, h)
			}
		}
		if err := p.checkMax("pod "+pod.String(), slices.Concat(devs, a.podHolds(pod, holdings, nil)), nil); err != nil {
			return err
		}
	}
	return nil
}

// podClaims returns the UIDs of the claims of pod: those it uses (uses)
// and those reserved for it, each once.
func (a *Allocations) podClaims(pod PodName, uses []string) []string {
	out := slices.Clone(uses)
	for uid, c := range a.claims {
		if slices.Contains(c.claim.Pods, pod) && !slices.Contains(out, uid) {
			out = append(out, uid)
		}
	}
	return out
}

// ErrClaimInUse says a claim is still used by pods whose containers the
// pool tracks.
var ErrClaimInUse = errors.New("still used by the containers of")

// ReleaseUnused forgets claim uid as ReleaseClaim does, unless a pod the
// pool tracks uses it (its containers used it, or it was reserved for the
// pod): the claim then stays held, and the error, wrapping ErrClaimInUse,
// names the pods. It is for a claim the API server no longer has: a pod
// deleted while its node's kubelet was away may still run there, and its
// devices must not go to another pod before its containers end.
func (a *Allocations) ReleaseUnused(uid string) ([]string, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	c := a.claims[uid]
	if c == nil {
		return nil, nil
	}
	var users []string
	for _, h := range a.pods {
		if slices.Contains(h.claims, uid) || slices.Contains(c.claim.Pods, h.pod.Named()) {
			users = append(users, h.pod.String())
		}
	}
	if len(users) > 0 {
		slices.Sort(users)
		return nil, fmt.Errorf("%s %w pod %s", c.claim, ErrClaimInUse, strings.Join(users, ", "))
	}
	delete(a.claims, uid)
	return specs.Names(footprints(c.devices)), nil
}

// ReleaseClaim forgets a claim (kubelet unprepared it), and returns the
// names of the devices it held.
func (a *Allocations) ReleaseClaim(uid string) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	c := a.claims[uid]
	delete(a.claims, uid)
	if c == nil {
		return nil
	}
	return specs.Names(footprints(c.devices))
}

// Claim returns the devices of the prepared claim uid that were
// allocated for one of requests (all of them when requests is empty).
func (a *Allocations) Claim(uid string, requests []string) (Claim, []ClaimDevice, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	c := a.claims[uid]
	if c == nil {
		return Claim{}, nil, ErrNotPrepared
	}
	var out []ClaimDevice
	for _, d := range c.devices {
		if len(requests) == 0 || slices.ContainsFunc(d.Requests, func(r string) bool { return slices.Contains(requests, r) }) {
			out = append(out, d)
		}
	}
	return c.claim, out, nil
}

// Claims returns the prepared claims ordered by UID, for keeping them
// across a restart and for reports.
func (a *Allocations) Claims() []ClaimHolding {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]ClaimHolding, 0, len(a.claims))
	for _, uid := range slices.Sorted(maps.Keys(a.claims)) {
		c := a.claims[uid]
		out = append(out, ClaimHolding{Claim: c.claim, Devices: slices.Clone(c.devices)})
	}
	return out
}

// RestoreClaims records the claims kept from before a restart (kubelet
// may never prepare them again). They stay held whatever they conflict
// with; what no longer holds is returned as Check reports it.
func (a *Allocations) RestoreClaims(p *Policy, claims []ClaimHolding) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, c := range claims {
		a.claims[c.Claim.UID] = &claimHolding{claim: c.Claim, devices: slices.Clone(c.Devices)}
	}
	return a.check(p)
}

// claimDevices returns the devices the claims hold.
func (a *Allocations) claimDevices(uids []string) []specs.Device {
	var out []specs.Device
	for _, uid := range uids {
		if c := a.claims[uid]; c != nil {
			out = append(out, footprints(c.devices)...)
		}
	}
	return out
}

// ClaimHeld returns every device prepared claims hold.
func (a *Allocations) ClaimHeld() []specs.Device {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.claimHeld()
}

func (a *Allocations) claimHeld() []specs.Device {
	var out []specs.Device
	for _, c := range a.claims {
		out = append(out, footprints(c.devices)...)
	}
	return out
}

// ClaimUses returns what claims' devices consume of shared devices and
// asked of their sharing, by name: a device in two of the container's
// claims, what the two consume together, within the tighter of what
// they asked.
func ClaimUses(held []ClaimDevice) map[string]ClaimDevice {
	tighter := func(a, b int64) int64 {
		if a == 0 || (b != 0 && b < a) {
			return b
		}
		return a
	}
	out := map[string]ClaimDevice{}
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
