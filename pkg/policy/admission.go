package policy

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// The one admission. Every door's question goes through the steps
// below, in this order: a pod's container (Plan, then Commit), a DRA
// claim (AdmitClaim), the offer of a device to a door's scheduler (Room,
// Offer: read-only), and a count request's candidates (each judged by
// the same device steps). The first step that refuses decides, with
// every refusal it makes; what a door asks is never judged by a rule of
// its own.
//
//	namespaces     policy.namespaces: who may ask at all
//	devices        policy.devices: which devices may be given
//	allowAll       policy.allowAll: a tenant's "all"
//	resolve        the device is in the trusted specs (not a rule)
//	hookPaths      policy.hookPaths: the hooks its spec injects
//	allowUnhealthy health: NVML's and its device nodes'
//	memoryLimits   whether the driver can bound a holder's memory
//	parameters     what a claim asked of the device's sharing
//	kubelet        devices kubelet allocated another pod
//	coexistence    who else holds the hardware (policy.exclusive, sharing)
//	capacity       a shared device's replicas and memory
//	count          the devices chosen for a count request
//	maxDevicesPerPod   what the pod would hold, through every door

// admission is the admission's steps in their order (a function, as the
// count step asks the device steps again).
func admission() []step {
	return []step{
		{RuleNamespaces, ofRequests, (*question).namespaces},
		{RuleDevices, ofRequests, (*question).allowed},
		{RuleAllowAll, ofRequests, (*question).allowAll},
		{"resolve", ofDevices, (*question).resolved},
		{RuleHookPaths, ofDevices, (*question).hooks},
		{RuleUnhealthy, ofDevices, (*question).healthy},
		{RuleMemoryLimits, ofDevices, (*question).bounded},
		{"parameters", ofDevices, (*question).parameters},
		{"kubelet", ofPool, (*question).kubeletFree},
		{"coexistence", ofPool, (*question).coexists},
		{"capacity", ofPool, (*question).fits},
		{RuleCount, ofPool, (*question).chosen},
		{RuleMax, ofPool, (*question).withinMax},
	}
}

// What a step reads.
const (
	// ofRequests: what was asked and by whom, no more (Check).
	ofRequests = iota
	// ofDevices: the devices' specs and health too.
	ofDevices
	// ofPool: what others hold too; Commit takes these steps again, on
	// the pool as it is then.
	ofPool
)

// step is one step of the admission.
type step struct {
	// name is the config key that decides, where one does.
	name  string
	reads int
	check func(*question) []error
}

// Asked is a device asked for by name: its footprint in the request's
// snapshot, and what the rules read of how it was asked.
type Asked struct {
	specs.Device
	// Request is the annotation or CRI request that named it; nil for a
	// device not asked through one (a claim's, an offer).
	Request *Request
	// Hooks are the hook executables its spec's edits inject.
	Hooks []string
	// Unresolved says why it is not in the trusted specs (the resolve
	// step refuses it).
	Unresolved error
	// Claim is what a DRA claim's allocation says of it; nil for a pod's.
	Claim *ClaimDevice
}

// fromKubelet reports whether kubelet allocated it (a device plugin's).
func (d Asked) fromKubelet() bool { return d.Request != nil && d.Request.FromKubelet() }

// byRuntime reports whether the runtime injects it from its own specs
// (the CRI request's CDI devices): node components chose it; it is held,
// and judged against other holders, not against what tenants may ask.
func (d Asked) byRuntime() bool { return d.Request != nil && d.Request.Origin == OriginRuntime }

// subject names how it was asked, for messages.
func (d Asked) subject(q *question) string {
	switch {
	case q.claim != nil:
		return q.claim.String()
	case d.Request != nil:
		return d.Request.String()
	}
	return fmt.Sprintf("device %q", d.Name)
}

// question is one admission under the pool's lock: who asks, through
// which door, for what, and what is found.
type question struct {
	p *Policy
	a *Allocations
	// pod is the asking container's pod; own what it holds. A claim's
	// question has claim instead; an offer neither.
	pod   Pod
	own   *holding
	claim *Claim
	door  Door
	// offer says a door asks what it may offer its scheduler: holders
	// that scheduler accounts for are left out, and no unhealthy device
	// is offered (held by nothing, it has no name asked).
	offer bool
	// uses are the claims the asking container uses.
	uses []string
	// named are the devices asked for by name; count asks for that many
	// more, chosen as choice says; used are the devices of the claims
	// the container uses (the claims', which it is to be given).
	named, used []Asked
	count       int
	choice      Choice
	// exclusive says no other holder may have a named device unless it
	// is shared (policy.exclusive for a pod; a claim and an offer always).
	exclusive bool
	// committing says the plan is being held: the plan's choice for the
	// count is checked, not made.
	committing bool
	plan       Plan
}

// decide runs the admission's steps in order, those that read at least
// from (ofPool when committing, ofRequests else), and returns the first
// refusal; upTo leaves out those that read more.
func (q *question) decide(from, upTo int) error {
	for _, s := range admission() {
		if s.reads < from || s.reads > upTo {
			continue
		}
		if errs := s.check(q); len(errs) > 0 {
			return errors.Join(errs...)
		}
	}
	return nil
}

// The devices a step judges.
const (
	// unheld are those asked by name the pod does not hold yet (what
	// it holds is kept, as a reload or a restore left it).
	unheld = iota
	// tenants' are those of them not the runtime's own.
	tenants
	// named are all those asked by name.
	named
	// injected are those nri-gpu injects: asked by name (not the
	// runtime's own) and those of the claims the container uses.
	injected
)

// each returns the refusals of judge over the devices of which.
func (q *question) each(which int, judge func(Asked) error) []error {
	devs := q.named
	if which == injected {
		devs = slices.Concat(q.named, q.used)
	}
	var errs []error
	for _, d := range devs {
		switch {
		case (which == unheld || which == tenants) && q.holds(d):
			continue
		case (which == tenants || which == injected) && d.byRuntime():
			continue
		}
		if err := judge(d); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// holds reports whether the asking pod holds d by name already.
func (q *question) holds(d Asked) bool {
	return q.own != nil && slices.ContainsFunc(q.own.named, func(h specs.Device) bool { return h.Name == d.Name })
}

// tenantWritten reports whether r came from an annotation the rules for
// tenants (namespaces, allowAll) apply to.
func (p *Policy) tenantWritten(r Request) bool {
	return r.Origin == OriginPod || (r.Origin == OriginCDI && !p.exemptCDI)
}

// namespaces applies policy.namespaces: to a claim, and to a pod that
// asks through an annotation a tenant writes (a count, a name).
func (q *question) namespaces() []error {
	switch {
	case q.claim != nil:
		return q.p.checkNamespace(q.claim.String(), q.claim.Namespace)
	case q.count > 0 && (q.own == nil || q.own.counted == nil):
		return q.p.checkNamespace(fmt.Sprintf("pod annotation %q request for %d devices", CountAnnotationKey, q.count), q.pod.Namespace)
	}
	for _, d := range q.named {
		if !q.holds(d) && d.Request != nil && q.p.tenantWritten(*d.Request) {
			return q.p.checkNamespace(d.Request.String(), q.pod.Namespace)
		}
	}
	return nil
}

// checkNamespace applies policy.namespaces to what subject asks for in
// namespace, in the same words whichever door it comes through.
func (p *Policy) checkNamespace(subject, namespace string) []error {
	if MatchAny(p.namespaces, namespace) {
		return nil
	}
	return []error{deny(RuleNamespaces, fmt.Errorf("%s: %w: pods of namespace %q may not request devices through annotations or DRA claims: it matches none of policy.namespaces [%s]; add a glob that matches it to policy.namespaces",
		subject, ErrDenied, namespace, strings.Join(p.namespaces, ", ")))}
}

// allowed applies policy.devices to every device asked by name.
func (q *question) allowed() []error {
	return q.each(tenants, func(d Asked) error { return q.p.checkDevice(d.subject(q), d.Name) })
}

// checkDevice applies policy.devices to a device subject asks for.
func (p *Policy) checkDevice(subject, device string) error {
	if p.Allowed(device) {
		return nil
	}
	return deny(RuleDevices, fmt.Errorf("%s: %w: device %q matches none of policy.devices [%s]; add a glob that matches it to policy.devices",
		subject, ErrDenied, device, strings.Join(p.devices, ", ")))
}

// allowAll refuses a tenant's request for a kind's "all" device unless
// policy.allowAll.
func (q *question) allowAll() []error {
	return q.each(tenants, func(d Asked) error {
		// A qualified name's device part follows its only "=".
		if d.Request == nil || !strings.HasSuffix(d.Name, "="+AllDevice) || !q.p.tenantWritten(*d.Request) || q.p.allowAll {
			return nil
		}
		return deny(RuleAllowAll, fmt.Errorf("%s: %w: device %q gives every device of its kind; set policy.allowAll: true to allow it",
			d.Request, ErrDenied, d.Name))
	})
}

// resolved refuses a device that is not in the request's snapshot of
// the trusted specs.
func (q *question) resolved() []error {
	return q.each(injected, func(d Asked) error {
		if d.Unresolved == nil {
			return nil
		}
		return fmt.Errorf("%s: %w", d.subject(q), d.Unresolved)
	})
}

// hooks applies policy.hookPaths to the hooks each device's spec
// injects.
func (q *question) hooks() []error {
	return q.each(injected, func(d Asked) error {
		hooks := d.Hooks
		if hooks == nil && q.choice.Hooks != nil {
			hooks = q.choice.Hooks(d.Device)
		}
		if err := q.p.CheckHooks(d.Name, hooks); err != nil {
			if q.claim != nil {
				return fmt.Errorf("%s: %w", q.claim, err)
			}
			return err
		}
		return nil
	})
}

// CheckHooks refuses a device whose edits (its own, or its spec's)
// would inject a hook executable not listed in policy.hookPaths: the
// admission's hookPaths rule, which a count's candidates meet too.
func (p *Policy) CheckHooks(device string, hookPaths []string) error {
	var errs []error
	for _, h := range hookPaths {
		if !slices.Contains(p.hookPaths, h) {
			errs = append(errs, deny(RuleHookPaths, fmt.Errorf("device %q: %w: its spec injects the hook %q, which is not in policy.hookPaths [%s]; add it to policy.hookPaths if it is trusted",
				device, ErrDenied, h, strings.Join(p.hookPaths, ", "))))
		}
	}
	return errors.Join(errs...)
}

// healthy refuses, when Plan or a claim asks (not at Commit), a device
// whose hardware is unhealthy, unless policy.allowUnhealthy (a device
// asked for by name).
func (q *question) healthy() []error {
	return q.each(named, func(d Asked) error {
		err := q.p.checkHealth(d.Device, q.choice.Unhealthy, !q.offer)
		if err != nil && q.claim != nil {
			return fmt.Errorf("%s: %w", q.claim, err)
		}
		return err
	})
}

// checkHealth refuses a device whose hardware unhealthy says is not
// healthy: always where it is not asked for by name (a count's choice,
// an offer), else unless policy.allowUnhealthy. A nil unhealthy takes
// every device as healthy. It is the one home of health: the pool's
// answer to every door.
func (p *Policy) checkHealth(d specs.Device, unhealthy func(specs.Device) error, byName bool) error {
	if unhealthy == nil || (byName && p.allowUnhealthy) {
		return nil
	}
	if err := unhealthy(d); err != nil {
		return deny(RuleUnhealthy, fmt.Errorf("%w: device %q: %w; set policy.allowUnhealthy: true to allow it", ErrDenied, d.Name, err))
	}
	return nil
}

// parameters refuses what a claim asked of its devices' sharing beyond
// what policy.sharing gives it.
func (q *question) parameters() []error {
	return q.each(named, func(d Asked) error {
		if d.Claim == nil {
			return nil
		}
		return q.p.checkAsked(*q.claim, *d.Claim)
	})
}

// kubeletFree refuses, under policy.exclusive, a device kubelet
// allocated another pod (through a device plugin) whose container does
// not hold it yet; one the pool holds for that pod is refused in the
// pool's words (coexists).
func (q *question) kubeletFree() []error {
	return q.each(unheld, func(d Asked) error {
		if pod, ok := q.choice.allocatedBy(d.Device); ok && q.exclusive && !d.fromKubelet() && !q.a.heldBy(pod, d.Device) {
			return q.claimed(deny(RuleExclusive, fmt.Errorf("%w: device %q is %s; it is free again when that pod is removed", ErrDenied, d.Name, kubeletWhy(pod))))
		}
		return nil
	})
}

// who is the asker as the pool's judge sees it.
func (q *question) who(d Asked) who {
	w := who{pod: q.pod.ID, claims: q.uses, exclusive: q.exclusive}
	if q.offer {
		w.door = q.door
	}
	if d.Claim != nil {
		w.use = d.Claim.Use
	}
	return w
}

// coexists refuses a device another holder keeps from the asker: held
// strictly or exclusively, or apart from a shared device it overlaps,
// or matched by two policy.sharing entries.
func (q *question) coexists() []error {
	return q.each(unheld, func(d Asked) error {
		return q.claimed(q.a.judge(q.p, q.who(d), d.Device).coexistence(d.Device, q.p.exclusive))
	})
}

// fits refuses a shared device with no room left for what the asker
// would consume, and memory asked of a device time-slicing shares where
// the driver cannot bound it, unless the entry makes it a scheduling
// quota.
func (q *question) fits() []error {
	return q.each(unheld, func(d Asked) error {
		s := q.p.Sharing(d.Device)
		if d.Claim != nil && d.Claim.MemoryAsked && s != nil && s.Strategy == config.StrategyTimeSlicing && !s.MemoryQuota {
			if counted, why := q.p.MemoryBound(d.Device); !counted || why != nil {
				return deny(RuleSharing, fmt.Errorf("%s: %w: device %q: the claim asks for an amount of memory, which %s cannot bound here (%w); ask for none, or set its memoryQuota: true to allocate memory as a scheduling quota only",
					q.claim, ErrDenied, d.Name, s, cmp.Or(why, errNotCounted)))
			}
		}
		return q.claimed(q.a.judge(q.p, q.who(d), d.Device).capacityErr(d.Device))
	})
}

// claimed names the claim asking before err, where a claim asks.
func (q *question) claimed(err error) error {
	if err != nil && q.claim != nil {
		return fmt.Errorf("%s: %w", q.claim, err)
	}
	return err
}

// chosen chooses the devices of a count request the pod has none for
// yet (Plan), or checks that those chosen are still free (Commit).
func (q *question) chosen() []error {
	own := q.own
	if own == nil {
		own = &holding{pod: q.pod}
	}
	pl := &q.plan
	if !q.committing {
		pl.counted = own.counted
		if q.count == 0 || own.counted != nil {
			return nil
		}
		var err error
		pl.counted, pl.score, pl.considered, err = q.a.choose(q.p, q.pod.ID, q.count, q.choice, q.uses, q.mine(own))
		pl.fresh = err == nil
		return errs(err)
	}
	if !pl.fresh {
		if !slices.EqualFunc(pl.counted, own.counted, func(x, y specs.Device) bool { return x.Name == y.Name }) {
			return []error{fmt.Errorf("%w: pod %s's devices for its count request changed meanwhile", ErrStale, q.pod)}
		}
		return nil
	}
	if own.counted != nil {
		return []error{fmt.Errorf("%w: pod %s was given devices for its count request meanwhile", ErrStale, q.pod)}
	}
	for _, c := range pl.counted {
		if q.p.sharedTwice(c, q.mine(own)) != nil || q.a.judge(q.p, who{pod: q.pod.ID, claims: q.uses, exclusive: true}, c).usersLeft() == 0 {
			return []error{fmt.Errorf("%w: device %q, chosen for pod %s, was taken meanwhile", ErrStale, c.Name, q.pod)}
		}
		if _, ok := q.choice.allocatedBy(c); ok {
			return []error{fmt.Errorf("%w: device %q, chosen for pod %s, was allocated by kubelet meanwhile", ErrStale, c.Name, q.pod)}
		}
	}
	return nil
}

// mine is what the pod has already: what it holds by name, asks by
// name, and the devices of the claims its container uses.
func (q *question) mine(own *holding) []specs.Device {
	return slices.Concat(own.named, footprintsOf(q.named), q.a.claimDevices(q.uses))
}

func errs(err error) []error {
	if err == nil {
		return nil
	}
	return []error{err}
}

// withinMax applies policy.maxDevicesPerPod: to a pod, what it would
// hold through every door (by name, for its count, the claims its
// containers use or that are reserved for it); to a claim, what each
// pod it is reserved for would then hold (itself, where it is reserved
// for none).
func (q *question) withinMax() []error {
	if q.p.max == 0 {
		return nil // no bound: nothing to count
	}
	if q.claim != nil {
		if err := q.a.checkClaimMax(q.p, *q.claim, footprintsOf(q.named)); err != nil {
			return []error{fmt.Errorf("%s: %w", q.claim, err)}
		}
		return nil
	}
	if q.door != NRI || q.pod.ID == "" {
		return nil // an offer holds nothing
	}
	own := q.own
	if own == nil {
		own = &holding{pod: q.pod}
	}
	all := slices.Concat(q.a.podHolds(q.pod.Named(), []*holding{own}, q.uses), footprintsOf(q.named), q.plan.counted)
	return errs(q.p.checkMax("pod "+q.pod.String(), all, q.choice.Candidates))
}

// checkMax refuses a holding after which who (a pod, or a claim reserved
// for no pod) would hold more devices than policy.maxDevicesPerPod:
// all, through every door, counted as units counts them.
func (p *Policy) checkMax(who string, all, candidates []specs.Device) error {
	if p.max == 0 {
		return nil
	}
	if n := units(all, candidates); n > p.max {
		return deny(RuleMax, fmt.Errorf("%w: %s would hold %d devices, more than policy.maxDevicesPerPod (%d); raise policy.maxDevicesPerPod to allow it",
			ErrDenied, who, n, p.max))
	}
	return nil
}

// podHolds returns every device the pod holds through every door: what
// its holdings hold by name and for a count, and the devices of every
// claim it uses (uses, and those its containers used) or that is
// reserved for it.
func (a *Allocations) podHolds(pod PodName, holdings []*holding, uses []string) []specs.Device {
	var all []specs.Device
	claims := slices.Clone(uses)
	for _, h := range holdings {
		all = slices.Concat(all, h.named, h.counted)
		claims = append(claims, h.claims...)
	}
	return append(all, a.claimDevices(a.podClaims(pod, claims))...)
}

// ErrSameDeviceTwice is wrapped by the refusal of one shared device
// given one holder twice.
var ErrSameDeviceTwice = errors.New("one shared device twice")

// sharedTwice refuses d where policy.sharing shares it and it overlaps
// one of mine (what the holder has already): a holder never uses one
// shared GPU twice, its replicas being for others.
func (p *Policy) sharedTwice(d specs.Device, mine []specs.Device) error {
	if p.Sharing(d) == nil || !specs.OverlapsAny(d, mine) {
		return nil
	}
	return SameDeviceTwice(d.Name)
}

// SameDeviceTwice is the refusal of one shared device given one holder
// twice (two of its replicas, or two of its names), whichever door asks:
// the one message of that rule.
func SameDeviceTwice(device string) error {
	return deny(RuleSharing, fmt.Errorf("%w: %w: device %q is shared, and one holder uses a shared device once, its replicas being for others; ask for fewer devices than there are, or one replica per container",
		ErrDenied, ErrSameDeviceTwice, device))
}

// footprintsOf returns the devices of asked.
func footprintsOf(asked []Asked) []specs.Device {
	out := make([]specs.Device, 0, len(asked))
	for _, d := range asked {
		out = append(out, d.Device)
	}
	return out
}

// heldBy reports whether pod holds a device overlapping d in the pool.
func (a *Allocations) heldBy(pod PodName, d specs.Device) bool {
	for _, h := range a.pods {
		if h.pod.Named() == pod && slices.ContainsFunc(h.all(), d.Overlaps) {
			return true
		}
	}
	return false
}
