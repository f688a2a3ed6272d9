package policy

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"tags.cncf.io/container-device-interface/pkg/parser"

	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// Allocations records which pod holds which devices. Devices given for a
// count request are always held by their pod alone; devices asked for by
// name are held by their pod alone when policy.exclusive is true. Its
// methods are safe for concurrent use, and an admission is atomic: two
// pods asking at once never both get a device one of them holds.
type Allocations struct {
	mu   sync.Mutex
	pods map[string]*holding
	// claims are the DRA claims prepared on the node, by UID.
	claims map[string]*claimHolding
	// allotted are the devices kubelet allocated through the device
	// plugin and does not list yet (Allot); now is the pool's clock, nil
	// for time.Now.
	allotted []allotment
	now      func() time.Time
}

// holding is what one pod holds.
type holding struct {
	pod     Pod
	named   []specs.Device
	counted []specs.Device
	// kubelet names those of named that kubelet allocated the pod (a
	// device plugin's): kubelet accounts for them itself.
	kubelet []string
	// sole names those of named that the pod holds alone whatever
	// policy.exclusive says, as a count grant: devices found in its
	// containers that no record of holdings had (the record was lost).
	sole []string
	// claims are the UIDs of the prepared claims the pod's containers
	// use: they count towards policy.maxDevicesPerPod for its next
	// containers, whichever pods the claims were reserved for when
	// prepared, and a sweep keeps them held while the pod lives.
	claims []string
}

// empty reports whether h holds no device.
func (h *holding) empty() bool { return len(h.named) == 0 && h.counted == nil }

func (h *holding) all() []specs.Device { return append(slices.Clone(h.named), h.counted...) }

// NewAllocations returns empty allocations.
func NewAllocations() *Allocations {
	return &Allocations{pods: map[string]*holding{}, claims: map[string]*claimHolding{}}
}

// name says who u is, for messages: a claim, or a pod.
func (u User) name() string {
	if u.Claim != nil {
		return u.Claim.String()
	}
	return "pod " + u.Pod.String()
}

// strict says no one else may have the device unless it is shared: a
// claim's device, a count grant, a device found held alone.
func (u User) strict() bool { return u.Claim != nil || u.Counted || u.Found }

// hint says when the device is free again, and why it is not shared
// (exclusive: policy.exclusive).
func (u User) hint(exclusive bool) string {
	switch {
	case u.Claim != nil:
		return "; a device allocated to a claim serves the pods that use the claim only; it is free again when kubelet unprepares the claim (its pods removed)"
	case u.Found:
		return fmt.Sprintf(", which nri-gpu found using it with no record of how it got it (its record of holdings was lost), so it is held by that pod alone; it is free again when pod %s is removed", u.Pod)
	case u.Counted:
		return fmt.Sprintf(", which got it for a count request; it is free again when pod %s is removed", u.Pod)
	case exclusive:
		return fmt.Sprintf(" and policy.exclusive is true; it is free again when pod %s is removed", u.Pod)
	}
	// Only an asker that is always exclusive (a DRA claim) is kept
	// from a device a pod holds by name while policy.exclusive is false.
	return fmt.Sprintf("; a claim's devices are its own, never one a pod holds; it is free again when pod %s is removed", u.Pod)
}

// key tells holders apart: one pod, one claim.
func (u User) key() string {
	if u.Claim != nil {
		return "claim:" + u.Claim.UID
	}
	return "pod:" + u.Pod.ID
}

// who asks the pool whether it may have a device: a pod (and the claims
// it uses), through a door.
type who struct {
	// pod and claims are left out of the device's holders: what they
	// hold is theirs already.
	pod    string
	claims []string
	// door leaves out the holders its own scheduler accounts for.
	door Door
	// exclusive says no other holder may have the device unless it is
	// shared (policy.exclusive for a request by name; a count request,
	// kubelet and DRA always).
	exclusive bool
	// use is what it would consume of the device when it is shared (a
	// claim's allocation; zero: one share and the default memory).
	use Use
	// alone says it holds the device alone whatever policy.sharing says
	// (found in its container with no record): it shares it with no one.
	alone bool
}

// Door is a way into the pool.
type Door int

const (
	// NRI is a container's request through the runtime: its pod's
	// annotations, its count request, the runtime's CDI devices.
	NRI Door = iota
	// DevicePlugin is kubelet's device plugin: kubelet accounts for the
	// devices it allocated.
	DevicePlugin
	// DRA is the DRA driver: kube-scheduler accounts for the devices it
	// allocated to claims.
	DRA
)

// leaves reports whether door leaves u out of a device's holders.
func (w who) leaves(u User) bool {
	switch w.door {
	case DevicePlugin:
		return u.Kubelet
	case DRA:
		return u.Claim != nil
	}
	return false
}

// users returns the holders of devices that overlap d, but those w
// leaves out: claims by UID, then pods by ID.
func (a *Allocations) users(w who, d specs.Device) []User {
	var out []User
	for _, uid := range slices.Sorted(maps.Keys(a.claims)) {
		c := a.claims[uid]
		if slices.Contains(w.claims, uid) {
			continue
		}
		for i := range c.devices {
			if c.devices[i].Overlaps(d) {
				out = append(out, User{Claim: &c.claim, Device: c.devices[i].Device, Use: c.devices[i].Use})
			}
		}
	}
	for _, id := range slices.Sorted(maps.Keys(a.pods)) {
		h := a.pods[id]
		if id == w.pod { // a pod ID is never empty, as w.pod is for a door's count
			continue
		}
		for i := range h.counted {
			if h.counted[i].Overlaps(d) {
				out = append(out, User{Pod: h.pod, Device: h.counted[i], Counted: true})
			}
		}
		for i := range h.named {
			if h.named[i].Overlaps(d) {
				out = append(out, User{Pod: h.pod, Device: h.named[i], Found: slices.Contains(h.sole, h.named[i].Name), Kubelet: h.fromKubelet(h.named[i])})
			}
		}
	}
	return slices.DeleteFunc(out, w.leaves)
}

// fromKubelet reports whether kubelet allocated the pod d: by its name,
// or by another name of hardware d is within (its UUID, found in the
// container's device nodes after a restart).
func (h *holding) fromKubelet(d specs.Device) bool {
	return slices.ContainsFunc(h.named, func(k specs.Device) bool {
		return slices.Contains(h.kubelet, k.Name) && (k.Name == d.Name || d.Within(k))
	})
}

// verdict is whether a device may be given beside what others hold.
type verdict struct {
	// blocked are every holder that keeps it (held strictly or
	// exclusively, or kept apart by a policy.sharing entry), the first
	// first: the one a denial names; a restore reports each.
	blocked []block
	// share is how the device is shared, nil if it is not; sharers are
	// the holders (one entry each) it is shared with, capacity what it
	// offers them, used what they consume and asking what the asker
	// would.
	share    *SharingEntry
	sharers  []User
	capacity Capacity
	used     Use
	asking   Use
	// twice is why it may not be given at all: two policy.sharing
	// entries match it.
	twice error
}

// usersLeft is how many more users the device may take: 0 or 1 for a device
// that is not shared, the replicas left for one that is.
func (v verdict) usersLeft() int {
	switch {
	case len(v.blocked) > 0, v.twice != nil:
		return 0
	case v.share == nil:
		return 1
	}
	return v.capacity.usersLeft(v.used)
}

// fits reports whether the asker may have the device: it is free, or
// shared with room for what the asker would consume.
func (v verdict) fits() bool {
	if v.share == nil || len(v.blocked) > 0 || v.twice != nil {
		return v.usersLeft() > 0
	}
	return v.capacity.fits(v.used, v.asking)
}

// block is a holder that keeps a device from an asker, and the
// policy.sharing entry that keeps them apart (nil: held strictly, or
// policy.exclusive).
type block struct {
	User
	apart *SharingEntry
}

// judge says whether w may have d beside what others hold. A device
// policy.sharing covers (by any name of its hardware) is shared with
// every other holder of the same hardware, whichever of its names they
// hold, up to its capacity; but a holder found with no record keeps it
// alone, and what overlaps a shared device without being it ("all", a
// MIG device of a shared GPU, a GPU one of whose MIG devices is shared)
// is never had beside it. Any other holder of overlapping hardware keeps
// it when it holds it strictly (a count grant, a claim, held alone) or w
// is exclusive. This is the pool's one rule of coexistence: every door
// asks it, and restore judges each holding against those before it with
// it.
func (a *Allocations) judge(p *Policy, w who, d specs.Device) verdict {
	share, err := p.share(d)
	if w.alone {
		share = nil
	}
	v := verdict{share: share, twice: err, asking: w.use}
	if err != nil {
		return v
	}
	if share != nil {
		v.capacity = p.Capacity(share, d)
	}
	seen := map[string]bool{}
	for _, u := range a.users(w, d) {
		if v.share != nil && !u.Found && u.Device.Same(d) {
			if !seen[u.key()] {
				seen[u.key()] = true
				v.sharers = append(v.sharers, u)
				use := v.capacity.use(u.Use)
				v.used.Shares += use.Shares
				v.used.Memory += use.Memory
			}
			continue
		}
		if u.strict() || w.exclusive {
			v.blocked = append(v.blocked, block{User: u})
		} else if apart := cmp.Or(v.share, p.Sharing(u.Device)); apart != nil {
			v.blocked = append(v.blocked, block{User: u, apart: apart})
		}
	}
	return v
}

// Room returns how many more users device d may take through door, on
// the pool as it is and under p: 0 or 1 for a device policy.sharing does
// not share, the replicas left for one it shares; 0 for one the
// admission would not give anyone (policy.devices, health as ch says
// it, devices kubelet allocated in ch). It is the admission's read-only
// question of a door's offer: holders the door's own scheduler accounts
// for are left out (kubelet's allocations for the device plugin, claims
// for DRA); every other holder counts, whichever door it came through.
func (a *Allocations) Room(p *Policy, d specs.Device, door Door, ch Choice) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	if door != DevicePlugin {
		ch = a.withAllotted(ch)
	}
	q := &question{p: p, a: a, door: door, offer: true, named: []Asked{{Device: d}}, choice: ch, exclusive: true}
	if q.decide(ofRequests, ofPool) != nil {
		return 0
	}
	return a.judge(p, q.who(q.named[0]), d).usersLeft()
}

// Offer returns what shared device d offers the users door's scheduler
// accounts for, on the pool as it is and under p: its capacity less what
// every other holder consumes (DRA: kube-scheduler counts the claims;
// pods of every door consume beside them), and false when p does not
// share it or it has no room for one more user of the default amount.
func (a *Allocations) Offer(p *Policy, d specs.Device, door Door) (Capacity, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	v := a.judge(p, who{door: door, exclusive: true}, d)
	if v.share == nil || v.usersLeft() == 0 {
		return Capacity{}, false
	}
	c := v.capacity
	c.Shares -= v.used.Shares
	if c.Memory > 0 {
		c.Memory -= v.used.Memory
		c.Maximum = min(c.Maximum, c.Memory)
	}
	return c, true
}

// coexistence is the denial of a device another holder keeps from the
// asker (held strictly or exclusively, apart from a shared device, or
// matched by two policy.sharing entries), or nil.
func (v verdict) coexistence(d specs.Device, exclusive bool) error {
	switch {
	case v.twice != nil:
		return deny(RuleSharing, fmt.Errorf("%w: device %q: %w", ErrDenied, d.Name, v.twice))
	case len(v.blocked) == 0:
		return nil
	case v.blocked[0].apart != nil:
		by := v.blocked[0]
		return deny(RuleSharing, fmt.Errorf("%w: device %q overlaps %q, held by %s, and %s shares one of them: a shared device is used by its sharers alone, never beside a device that overlaps it; it is free again when %s is removed",
			ErrDenied, d.Name, by.Device.Name, by.name(), by.apart, by.name()))
	default:
		by := v.blocked[0]
		return deny(RuleExclusive, fmt.Errorf("%w: device %q is held by %s (as %q)%s",
			ErrDenied, d.Name, by.name(), by.Device.Name, by.hint(exclusive)))
	}
}

// capacityErr is the denial of a shared device with no room for what
// the asker would consume beside its sharers, or nil.
func (v verdict) capacityErr(d specs.Device) error {
	if v.share == nil || len(v.blocked) > 0 || v.twice != nil || v.fits() {
		return nil
	}
	room := "it is free for one more when one of them is removed, or raise replicas"
	if v.capacity.Memory > 0 || !v.asking.IsZero() {
		room = fmt.Sprintf("it has %s left, and %s is needed; there is room again when one of them is removed", v.capacity.Left(v.used), v.capacity.use(v.asking))
	}
	return deny(RuleSharing, fmt.Errorf("%w: device %q is shared by %s and used by %d already: %s; %s",
		ErrDenied, d.Name, v.share, len(v.sharers), describeUsers(v.sharers), room))
}

func describeUsers(us []User) string { return strings.Join(describe(us), ", ") }

// describe returns who each of us is, for messages.
func describe(us []User) []string {
	parts := make([]string, 0, len(us))
	for _, u := range us {
		parts = append(parts, u.name())
	}
	return parts
}

// Holdings returns what each pod holds, ordered by pod ID, for keeping it
// across a restart.
func (a *Allocations) Holdings() []Holding {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]Holding, 0, len(a.pods))
	for _, id := range slices.Sorted(maps.Keys(a.pods)) {
		h := a.pods[id]
		if h.empty() && len(h.claims) == 0 {
			continue
		}
		out = append(out, Holding{Pod: h.pod, Named: slices.Clone(h.named), Counted: slices.Clone(h.counted), Kubelet: slices.Clone(h.kubelet), Sole: slices.Clone(h.sole), Claims: slices.Clone(h.claims)})
	}
	return out
}

// Users returns who holds device d's hardware (whichever of its names),
// one entry per pod or claim, in order: for showing who shares a GPU.
func (a *Allocations) Users(d specs.Device) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []string
	for _, u := range a.users(who{}, d) {
		if w := u.name(); u.Device.Same(d) && !slices.Contains(out, w) {
			out = append(out, w)
		}
	}
	return out
}

// Held returns, per pod, the names of the devices it holds.
func (a *Allocations) Held() map[Pod][]string {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[Pod][]string, len(a.pods))
	for _, h := range a.pods {
		if !h.empty() {
			out[h.pod] = specs.Names(h.all())
		}
	}
	return out
}

// Holds reports whether pod podID holds the named device, and whether it
// holds devices for a count request.
func (a *Allocations) Holds(podID string) (holds func(name string) bool, counted bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	h := a.pods[podID]
	if h == nil {
		return func(string) bool { return false }, false
	}
	names := specs.Names(h.all())
	return func(name string) bool { return slices.Contains(names, name) }, h.counted != nil
}

// Rebuilt returns how many pods hold devices alone because they were
// found in their containers with no record of how they got them.
func (a *Allocations) Rebuilt() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, h := range a.pods {
		if len(h.sole) > 0 {
			n++
		}
	}
	return n
}

// Count returns how many device names all pods and claims hold together.
func (a *Allocations) Count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, h := range a.pods {
		n += len(h.named) + len(h.counted)
	}
	for _, c := range a.claims {
		n += len(c.devices)
	}
	return n
}

// units counts the devices a set of devices amounts to: names of one
// device count once, and a kind's "all" device counts as every candidate
// it covers.
func units(devs, candidates []specs.Device) int {
	keys := map[string]bool{}
	key := func(d specs.Device) string {
		switch len(d.Nodes) {
		case 0:
			return "name:" + d.Name
		case 1:
			return d.Nodes[0]
		}
		return strings.Join(d.Nodes, "\x00")
	}
	for _, d := range devs {
		if _, _, name := parser.ParseDevice(d.Name); name == AllDevice {
			covered := false
			for _, c := range candidates {
				if c.Within(d) {
					keys[key(c)] = true
					covered = true
				}
			}
			if covered {
				continue
			}
		}
		keys[key(d)] = true
	}
	return len(keys)
}
