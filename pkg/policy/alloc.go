package policy

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

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
}

func (h *holding) all() []specs.Device { return append(slices.Clone(h.named), h.counted...) }

// NewAllocations returns empty allocations.
func NewAllocations() *Allocations {
	return &Allocations{pods: map[string]*holding{}, claims: map[string]*claimHolding{}}
}

// Grant is what Admit gives a container.
type Grant struct {
	// Pod is the pod the grant is for.
	Pod Pod
	// Devices are the named devices and then the counted ones.
	Devices []specs.Device
	// Counted are the devices chosen for the pod's count request.
	Counted []specs.Device
	// Considered is what the count request chose among and passed over.
	Considered Considered
	// Score is how closely the devices chosen for a count request are
	// connected: the sum of Links over their pairs (0 when one device was
	// chosen, the topology is unknown, or the pod had them already).
	Score int

	// added, addedKubelet and addedCount say what this grant added to
	// the pod's holding, for Revert.
	added        []string
	addedKubelet []string
	addedCount   bool
}

// Choice is what a count request chooses among, and how.
type Choice struct {
	// Candidates are the individual devices of the default kind, in spec
	// order.
	Candidates []specs.Device
	// Usable says why the container cannot have a device, or nil if it
	// can; a nil Usable takes any.
	Usable func(specs.Device) error
	// Unhealthy says why a device's hardware is unhealthy, or nil; a nil
	// Unhealthy takes every device as healthy. A count request never gets
	// an unhealthy device; a request by name is denied one unless
	// policy.allowUnhealthy.
	Unhealthy func(specs.Device) error
	// Links scores how closely two devices are connected, higher is
	// closer (NVLink, one PCIe switch, one socket); nil when the topology
	// is not known. A request for more than one device takes the free set
	// whose members are the most closely connected.
	Links func(a, b specs.Device) int
}

// Admit decides, under p's rules, whether a container of pod may have the
// named devices and, for a count request, chooses count devices as ch
// says: free ones the container can have, the most closely connected set
// where the topology is known, else the first in spec order. On success
// it records them as the pod's. Containers of one pod share its devices:
// a pod's count request is answered with the same devices every time.
// fromKubelet names those of the named devices that kubelet allocated the
// pod (through a device plugin), which kubelet accounts for itself;
// Withheld leaves them out. claims are the UIDs of the prepared DRA
// claims the container uses: the devices they hold are the pod's to use,
// and stay the claims' holdings (they are not among named).
func (a *Allocations) Admit(p *Policy, pod Pod, named []specs.Device, count int, ch Choice, fromKubelet []string, claims ...string) (Grant, error) {
	candidates := ch.Candidates
	a.mu.Lock()
	defer a.mu.Unlock()

	own := a.pods[pod.ID]
	if own == nil {
		own = &holding{pod: pod}
	}
	var errs []error
	for _, d := range named {
		if ch.Unhealthy != nil && !p.allowUnhealthy {
			if err := ch.Unhealthy(d); err != nil {
				errs = append(errs, deny(RuleUnhealthy, fmt.Errorf("%w: device %q: %w; set policy.allowUnhealthy: true to allow it", ErrDenied, d.Name, err)))
				continue
			}
		}
		if slices.ContainsFunc(own.named, func(h specs.Device) bool { return h.Name == d.Name }) {
			continue // the pod holds it: kept, as a reload or restore left it
		}
		if err := a.judge(p, pod.ID, d, p.exclusive, claims).err(d, p.exclusive); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return Grant{}, err
	}

	counted, score := own.counted, 0
	var considered Considered
	if count > 0 && counted == nil {
		var err error
		mine := slices.Concat(own.named, named, a.claimDevices(claims))
		if counted, score, considered, err = a.choose(p, pod.ID, count, ch, claims, mine); err != nil {
			return Grant{}, err
		}
	}

	if p.max > 0 {
		all := slices.Concat(own.named, own.counted, named, counted, a.claimDevices(claims))
		if n := units(all, candidates); n > p.max {
			return Grant{}, deny(RuleMax, fmt.Errorf("%w: pod %s would hold %d devices, more than policy.maxDevicesPerPod (%d); raise policy.maxDevicesPerPod to allow it",
				ErrDenied, pod, n, p.max))
		}
	}

	// The pod's counted devices are replaced whole, never modified in
	// place, so the grant may share them.
	g := Grant{Pod: pod, Devices: slices.Concat(named, counted), Counted: counted, Score: score, Considered: considered}
	for _, d := range named {
		if !slices.ContainsFunc(own.named, func(h specs.Device) bool { return h.Name == d.Name }) {
			own.named = append(own.named, d)
			g.added = append(g.added, d.Name)
		}
		if slices.Contains(fromKubelet, d.Name) && !slices.Contains(own.kubelet, d.Name) {
			own.kubelet = append(own.kubelet, d.Name)
			g.addedKubelet = append(g.addedKubelet, d.Name)
		}
	}
	g.addedCount = own.counted == nil && counted != nil
	own.counted = counted
	a.pods[pod.ID] = own
	return g, nil
}

// Added reports whether the grant added to what its pod holds (a device
// not held before, or a count grant): what must be recorded before the
// container may have it.
func (g Grant) Added() bool { return len(g.added) > 0 || len(g.addedKubelet) > 0 || g.addedCount }

// Revert undoes what a grant added, when the container it was for could
// not be given its devices after all.
func (a *Allocations) Revert(g Grant) {
	a.mu.Lock()
	defer a.mu.Unlock()
	own := a.pods[g.Pod.ID]
	if own == nil {
		return
	}
	own.named = slices.DeleteFunc(own.named, func(d specs.Device) bool { return slices.Contains(g.added, d.Name) })
	own.kubelet = slices.DeleteFunc(own.kubelet, func(n string) bool { return slices.Contains(g.addedKubelet, n) })
	if g.addedCount {
		own.counted = nil
	}
	if len(own.named) == 0 && own.counted == nil {
		delete(a.pods, g.Pod.ID)
	}
}

// holder is who holds a device: a pod, or a DRA claim.
type holder struct {
	pod   Pod
	claim *Claim
	// sole says the pod holds it alone as found without a record.
	sole bool
}

func (h holder) String() string {
	if h.claim != nil {
		return h.claim.String()
	}
	return "pod " + h.pod.String()
}

// hint says when the device is free again, and why it is not shared.
func (h holder) hint(exclusive bool) string {
	switch {
	case h.claim != nil:
		return "; a device allocated to a claim serves the pods that use the claim only; it is free again when kubelet unprepares the claim (its pods removed)"
	case h.sole:
		return fmt.Sprintf(", which nri-gpu found using it with no record of how it got it (its record of holdings was lost), so it is held by that pod alone; it is free again when pod %s is removed", h.pod)
	case exclusive:
		return fmt.Sprintf(" and policy.exclusive is true; it is free again when pod %s is removed", h.pod)
	}
	return fmt.Sprintf(", which got it for a count request; it is free again when pod %s is removed", h.pod)
}

// key tells holders apart: one pod, one claim.
func (h holder) key() string {
	if h.claim != nil {
		return "claim:" + h.claim.UID
	}
	return "pod:" + h.pod.ID
}

// user is a holder of a device that overlaps the one asked for.
type user struct {
	holder
	dev *specs.Device
	// strict says no one else may have it unless it is shared: a count
	// grant, a claim's device, a device held alone.
	strict bool
	// kubelet says kubelet allocated it to the pod (a device plugin's).
	kubelet bool
}

// users returns the holders, other than pod podID and the claims it
// uses, of devices that overlap d: claims by UID, then pods by ID.
func (a *Allocations) users(podID string, d specs.Device, uses []string) []user {
	var out []user
	for _, uid := range slices.Sorted(maps.Keys(a.claims)) {
		c := a.claims[uid]
		if slices.Contains(uses, uid) {
			continue
		}
		for i := range c.devices {
			if overlaps(c.devices[i].Device, d) {
				out = append(out, user{holder: holder{claim: &c.claim}, dev: &c.devices[i].Device, strict: true})
			}
		}
	}
	for _, id := range slices.Sorted(maps.Keys(a.pods)) {
		h := a.pods[id]
		if id == podID {
			continue
		}
		for i := range h.counted {
			if overlaps(h.counted[i], d) {
				out = append(out, user{holder: holder{pod: h.pod}, dev: &h.counted[i], strict: true})
			}
		}
		for i := range h.named {
			if overlaps(h.named[i], d) {
				sole := slices.Contains(h.sole, h.named[i].Name)
				out = append(out, user{holder: holder{pod: h.pod, sole: sole}, dev: &h.named[i], strict: sole, kubelet: slices.Contains(h.kubelet, h.named[i].Name)})
			}
		}
	}
	return out
}

// verdict is whether a device may be given beside what others hold.
type verdict struct {
	// by is a holder that keeps it, nil if none.
	by *user
	// share is how the device is shared, nil if it is not; sharers are
	// the holders (one entry each) it is shared with.
	share   *Share
	sharers []user
}

// full reports whether the device is shared and every replica is used.
func (v verdict) full() bool { return v.share != nil && len(v.sharers) >= v.share.Replicas }

// free reports whether the device may be given.
func (v verdict) free() bool { return v.by == nil && !v.full() }

// judge says whether pod podID (and the claims it uses) may have d beside
// what others hold. A device policy.sharing covers is shared with every
// other holder of the same hardware, whichever of its names they hold,
// up to its replicas; but a holder found with no record keeps it alone.
// Any other holder of overlapping hardware keeps it when it holds it
// strictly (a count grant, a claim, held alone) or exclusive is set.
func (a *Allocations) judge(p *Policy, podID string, d specs.Device, exclusive bool, uses []string) verdict {
	v := verdict{share: p.Sharing(d.Name)}
	seen := map[string]bool{}
	for _, u := range a.users(podID, d, uses) {
		if v.share != nil && !u.sole && sameHardware(*u.dev, d) {
			if !seen[u.key()] {
				seen[u.key()] = true
				v.sharers = append(v.sharers, u)
			}
			continue
		}
		if u.strict || exclusive {
			v.by = &u
			return v
		}
	}
	return v
}

// err is the denial of a device the verdict does not free, or nil.
func (v verdict) err(d specs.Device, exclusive bool) error {
	switch {
	case v.by != nil:
		return deny(RuleExclusive, fmt.Errorf("%w: device %q is held by %s (as %q)%s",
			ErrDenied, d.Name, v.by.holder, v.by.dev.Name, v.by.hint(exclusive)))
	case v.full():
		return deny(RuleSharing, fmt.Errorf("%w: device %q is shared by %s and used by %d already: %s; it is free for one more when one of them is removed, or raise replicas",
			ErrDenied, d.Name, v.share, len(v.sharers), describeUsers(v.sharers)))
	}
	return nil
}

func describeUsers(us []user) string {
	parts := make([]string, 0, len(us))
	for _, u := range us {
		parts = append(parts, u.holder.String())
	}
	return strings.Join(parts, ", ")
}

// sameHardware reports whether two devices are one piece of hardware:
// the same name, or the same device nodes (a GPU by index and by UUID).
func sameHardware(a, b specs.Device) bool {
	return a.Name == b.Name || (len(a.Nodes) > 0 && covers(a, b) && covers(b, a))
}

// choose picks count free candidates that ch.Usable accepts, one name
// per device and no shared one the pod uses already (mine): the least
// used first (shared devices by how many pods use them), then the first
// in order, or, for more than one device where ch.Links is known, the
// set whose pairs score highest among the least used (ties keep spec
// order). It returns them and their score.
func (a *Allocations) choose(p *Policy, podID string, count int, ch Choice, uses []string, mine []specs.Device) ([]specs.Device, int, Considered, error) {
	var (
		free, seen []specs.Device
		used       []int // how many pods use each of free
		unusable   []error
		passed     []Passed
	)
	// With the topology known or devices shared, every free device is a
	// candidate; else the first count do.
	enough := count
	if (ch.Links != nil && count > 1) || len(p.sharing) > 0 {
		enough = len(ch.Candidates)
	}
	held, unhealthy := 0, 0
	for _, c := range ch.Candidates {
		if !p.Allowed(c.Name) || Overlaps(c, seen) {
			continue
		}
		seen = append(seen, c)
		if Overlaps(c, mine) && p.Sharing(c.Name) != nil {
			continue // the pod uses it already: never one shared GPU twice
		}
		// A device held by another pod in any way is not free, unless
		// it is shared and a replica is left.
		v := a.judge(p, podID, c, true, uses)
		if !v.free() {
			held++
			why := "held by " + describeUsers(v.sharers)
			if v.by != nil {
				why = "held by " + v.by.holder.String()
			}
			passed = append(passed, Passed{c.Name, why})
			continue
		}
		if ch.Unhealthy != nil {
			if err := ch.Unhealthy(c); err != nil {
				unhealthy++
				passed = append(passed, Passed{c.Name, err.Error()})
				continue
			}
		}
		if len(free) < enough && ch.Usable != nil {
			if err := ch.Usable(c); err != nil {
				unusable = append(unusable, err)
				passed = append(passed, Passed{c.Name, err.Error()})
				continue
			}
		}
		free = append(free, c)
		used = append(used, len(v.sharers))
	}
	if len(free) < count {
		kind := "devices"
		if len(ch.Candidates) > 0 {
			v, c, _ := parser.ParseDevice(ch.Candidates[0].Name)
			kind = v + "/" + c + " devices"
		}
		why := ""
		if unhealthy > 0 {
			why = fmt.Sprintf("; %d more are unhealthy", unhealthy)
		}
		if len(unusable) > 0 {
			why += fmt.Sprintf("; %d more cannot be given to this container, such as: %v", len(unusable), unusable[0])
		}
		return nil, 0, Considered{}, deny(RuleCount, fmt.Errorf("pod annotation %q: %w: asks for %d %s, but %d are free and %d held by other pods (of %d allowed by policy.devices)%s; they are free again when their pods are removed",
			CountAnnotationKey, ErrDenied, count, kind, len(free), held, len(seen), why))
	}
	considered := Considered{Free: specs.Names(free), Passed: passed}
	fixed, rest := leastUsed(free, used, count)
	need := count - len(fixed)
	if ch.Links == nil || count == 1 {
		return append(fixed, rest[:need]...), 0, considered, nil
	}
	best, score := Closest(fixed, rest, need, ch.Links)
	return append(fixed, best...), score, considered, nil
}

// leastUsed splits the least-used count devices of free (shared ones by
// how many pods use them) into those that must be taken (fewer users
// than the count-th least used) and those to choose the rest among (as
// many users as it), each in the order of free.
func leastUsed(free []specs.Device, used []int, count int) (fixed, rest []specs.Device) {
	limit := slices.Sorted(slices.Values(used))[count-1]
	for i, d := range free {
		switch {
		case used[i] < limit:
			fixed = append(fixed, d)
		case used[i] == limit:
			rest = append(rest, d)
		}
	}
	return fixed, rest
}

// Considered is what a count request looked at: the free devices (not
// held, healthy) it chose among, and those it passed over, with why.
type Considered struct {
	Free   []string
	Passed []Passed
}

// Passed is a device a count request passed over, and why.
type Passed struct {
	Device, Reason string
}

// maxSets bounds the sets closest scores one by one; beyond it, sets are
// grown greedily from each device.
const maxSets = 20000

// Closest returns the count devices of free (count <= len(free)) that,
// together with fixed (devices already chosen), score highest under links
// over all their pairs, and that score (fixed's own pairs included). Of
// sets that score alike, the first in spec order wins, so the choice is
// deterministic.
func Closest(fixed, free []specs.Device, count int, links func(a, b specs.Device) int) ([]specs.Device, int) {
	base := 0
	for i := range fixed {
		for j := i + 1; j < len(fixed); j++ {
			base += links(fixed[i], fixed[j])
		}
	}
	score := func(set []int) int {
		total := base
		for i := range set {
			for _, f := range fixed {
				total += links(f, free[set[i]])
			}
			for j := i + 1; j < len(set); j++ {
				total += links(free[set[i]], free[set[j]])
			}
		}
		return total
	}
	var best []int
	bestScore := -1
	consider := func(set []int) {
		if s := score(set); s > bestScore {
			best, bestScore = slices.Clone(set), s
		}
	}
	if binomial(len(free), count) <= maxSets {
		// Every set, in lexicographic order.
		set := make([]int, count)
		for i := range set {
			set[i] = i
		}
		for {
			consider(set)
			i := count - 1
			for i >= 0 && set[i] == len(free)-count+i {
				i--
			}
			if i < 0 {
				break
			}
			set[i]++
			for j := i + 1; j < count; j++ {
				set[j] = set[j-1] + 1
			}
		}
	} else {
		// From each device, add the one closest to those chosen.
		for start := range free {
			set := []int{start}
			for len(set) < count {
				next, nextScore := -1, -1
				for c := range free {
					if slices.Contains(set, c) {
						continue
					}
					s := 0
					for _, m := range set {
						s += links(free[m], free[c])
					}
					for _, f := range fixed {
						s += links(f, free[c])
					}
					if s > nextScore {
						next, nextScore = c, s
					}
				}
				set = append(set, next)
			}
			slices.Sort(set)
			consider(set)
		}
	}
	out := make([]specs.Device, len(best))
	for i, b := range best {
		out[i] = free[b]
	}
	return out, bestScore
}

// binomial returns n choose k, or more than maxSets once it passes that.
func binomial(n, k int) int {
	r := 1
	for i := 1; i <= k; i++ {
		r = r * (n - k + i) / i
		if r > maxSets {
			return maxSets + 1
		}
	}
	return r
}

// Release forgets what a pod holds, and returns the names it held.
func (a *Allocations) Release(podID string) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	h := a.pods[podID]
	delete(a.pods, podID)
	if h == nil {
		return nil
	}
	return specs.Names(h.all())
}

// Holding is what a pod was found to hold, for Restore.
type Holding struct {
	Pod     Pod
	Named   []specs.Device
	Counted []specs.Device
	// Kubelet names those of Named that kubelet allocated the pod.
	Kubelet []string
	// Sole names those of Named the pod holds alone whatever
	// policy.exclusive says, as it holds Counted: devices found in its
	// containers that no record of holdings had.
	Sole []string
}

// Restore replaces all allocations with the given holdings, as rebuilt
// after a restart of the plugin from what tenants cannot write. Pods not
// among them hold nothing any more. Every restored device stays held,
// since a container already has it; the holdings are checked against p
// and against each other, and what no longer holds (a device p does not
// allow, a device two pods hold though one of them got it for a count
// request or p is exclusive) is returned as an error wrapping
// ErrRestoreConflict, one line per problem, for the caller to log.
// Restoring is linear in the holdings and their devices.
func (a *Allocations) Restore(p *Policy, holdings []Holding) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.pods = map[string]*holding{}
	named := map[string]map[string]bool{} // pod ID -> names held, so that restoring is linear
	for _, h := range holdings {
		own := a.pods[h.Pod.ID]
		if own == nil {
			own = &holding{pod: h.Pod}
			a.pods[h.Pod.ID] = own
			named[h.Pod.ID] = map[string]bool{}
		}
		for _, d := range h.Named {
			if !named[h.Pod.ID][d.Name] {
				named[h.Pod.ID][d.Name] = true
				own.named = append(own.named, d)
				if slices.Contains(h.Kubelet, d.Name) {
					own.kubelet = append(own.kubelet, d.Name)
				}
			}
			if slices.Contains(h.Sole, d.Name) && !slices.Contains(own.sole, d.Name) {
				own.sole = append(own.sole, d.Name)
			}
		}
		if own.counted == nil && len(h.Counted) > 0 {
			own.counted = slices.Clone(h.Counted)
		}
	}
	return a.check(p)
}

// Check reports, as Restore does, held devices p would not give (after a
// change of configuration): they stay held until their pods are removed.
func (a *Allocations) Check(p *Policy) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.check(p)
}

// ErrRestoreConflict is wrapped by the error Restore returns when restored
// holdings break the policy or each other.
var ErrRestoreConflict = errors.New("restored holdings conflict")

// maxRestoreProblems caps the problems Restore reports one by one.
const maxRestoreProblems = 16

// ConflictError is the error of Restore and Check: what the holdings break,
// one line per problem. It wraps ErrRestoreConflict.
type ConflictError struct {
	// Problems are the first maxRestoreProblems problems.
	Problems []string
	// More counts the problems left out.
	More int
}

func (e *ConflictError) Error() string {
	more := ""
	if e.More > 0 {
		more = fmt.Sprintf("\n(and %d more)", e.More)
	}
	return fmt.Sprintf("%s; the devices stay held until their pods are removed:\n%s%s", ErrRestoreConflict, strings.Join(e.Problems, "\n"), more)
}

// Unwrap returns ErrRestoreConflict.
func (e *ConflictError) Unwrap() error { return ErrRestoreConflict }

// check reports restored devices p does not allow and devices held by two
// pods where one of them may not share it. Pods and devices are visited
// in order, so the report is stable; it is linear but for pods sharing
// a node, which are compared with each other only.
func (a *Allocations) check(p *Policy) error {
	var problems []string
	report := func(format string, args ...any) {
		problems = append(problems, fmt.Sprintf(format, args...))
	}
	ids := slices.Sorted(maps.Keys(a.pods))
	type owner struct {
		who     string
		id      string
		dev     specs.Device
		counted bool
		// share is how the device is shared, nil if it is not.
		share *Share
	}
	byNode := map[string][]owner{}
	// shares reports whether o and the device d of holder id (counted:
	// strictly) share one piece of hardware as policy.sharing allows.
	shares := func(o owner, d specs.Device, share *Share, sole bool) bool {
		return (share != nil || o.share != nil) && !sole && sameHardware(o.dev, d)
	}
	// users counts the holders of each shared piece of hardware, by its
	// first node.
	type use struct {
		device string
		share  *Share
		who    []string
	}
	users := map[string]*use{}
	var order []string
	count := func(o owner) {
		if o.share == nil || len(o.dev.Nodes) == 0 {
			return
		}
		n := o.dev.Nodes[0]
		u := users[n]
		if u == nil {
			u = &use{device: o.dev.Name, share: o.share}
			users[n] = u
			order = append(order, n)
		}
		if !slices.Contains(u.who, o.who) {
			u.who = append(u.who, o.who)
		}
	}
	// A claim's devices are its own, as a count grant's are.
	for _, uid := range slices.Sorted(maps.Keys(a.claims)) {
		c := a.claims[uid]
		for _, d := range c.devices {
			if !p.Allowed(d.Name) {
				report("%s holds %q, which policy.devices does not allow (any more)", c.claim, d.Name)
			}
			share := p.Sharing(d.Name)
			for _, n := range d.Nodes {
				for _, o := range byNode[n] {
					if !shares(o, d.Device, share, false) {
						report("%s (%q) and %s (%q) both hold %s", o.who, o.dev.Name, c.claim, d.Name, n)
					}
				}
				byNode[n] = append(byNode[n], owner{c.claim.String(), "claim:" + uid, d.Device, true, share})
			}
			count(owner{who: c.claim.String(), dev: d.Device, share: share})
		}
	}
	for _, id := range ids {
		h := a.pods[id]
		for _, d := range h.all() {
			if !p.Allowed(d.Name) {
				report("pod %s holds %q, which policy.devices does not allow (any more)", h.pod, d.Name)
			}
		}
		for i, d := range h.all() {
			sole := slices.Contains(h.sole, d.Name)
			counted := i >= len(h.named) || sole
			share := p.Sharing(d.Name)
			if sole {
				share = nil
			}
			for _, n := range d.Nodes {
				for _, o := range byNode[n] {
					if o.id != id && (counted || o.counted || p.exclusive) && !shares(o, d, share, sole) {
						report("%s (%q) and pod %s (%q) both hold %s", o.who, o.dev.Name, h.pod, d.Name, n)
					}
				}
				byNode[n] = append(byNode[n], owner{"pod " + h.pod.String(), id, d, counted, share})
			}
			count(owner{who: "pod " + h.pod.String(), dev: d, share: share})
		}
	}
	for _, n := range order {
		if u := users[n]; len(u.who) > u.share.Replicas {
			report("%d hold %q, which %s lets %d use at once: %s", len(u.who), u.device, u.share, u.share.Replicas, strings.Join(u.who, ", "))
		}
	}
	if len(problems) == 0 {
		return nil
	}
	e := &ConflictError{Problems: problems}
	if len(problems) > maxRestoreProblems {
		e.Problems, e.More = problems[:maxRestoreProblems], len(problems)-maxRestoreProblems
	}
	return e
}

// Holdings returns what each pod holds, ordered by pod ID, for keeping it
// across a restart.
func (a *Allocations) Holdings() []Holding {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]Holding, 0, len(a.pods))
	for _, id := range slices.Sorted(maps.Keys(a.pods)) {
		h := a.pods[id]
		out = append(out, Holding{Pod: h.pod, Named: slices.Clone(h.named), Counted: slices.Clone(h.counted), Kubelet: slices.Clone(h.kubelet), Sole: slices.Clone(h.sole)})
	}
	return out
}

// Withheld returns the devices pods hold that kubelet did not allocate
// them through a device plugin (annotation requests, count requests, DRA
// claims): a device plugin must not offer kubelet any device that
// overlaps one of them.
func (a *Allocations) Withheld() []specs.Device {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := a.claimHeld()
	for _, h := range a.pods {
		var fromKubelet []specs.Device
		for _, d := range h.named {
			if slices.Contains(h.kubelet, d.Name) {
				fromKubelet = append(fromKubelet, d)
			}
		}
		// Another name of a device kubelet allocated (its UUID, found
		// in the container's device nodes after a restart) is kubelet's
		// too.
		for _, d := range h.all() {
			if !slices.ContainsFunc(fromKubelet, func(k specs.Device) bool { return k.Name == d.Name || covers(k, d) }) {
				out = append(out, d)
			}
		}
	}
	return out
}

// Apart returns how many of the replicas of the shared device d are
// used other than through kubelet (by pods that asked by annotation or
// count, by claims), and whether it is held so that no replica is left
// (held alone, or hardware overlapping it held): what a device plugin
// must not offer kubelet beside its own allocations.
func (a *Allocations) Apart(d specs.Device) (users int, none bool) {
	return a.sharedUse(d, func(u user) bool { return u.kubelet })
}

// PodUsers returns how many pods use the shared device d (whichever door
// they came through; claims not counted), and whether a pod holds it so
// that it cannot be shared (alone, or hardware overlapping it): for a DRA
// driver offering a shared device while a replica is left.
func (a *Allocations) PodUsers(d specs.Device) (pods int, none bool) {
	return a.sharedUse(d, func(u user) bool { return u.claim != nil })
}

// sharedUse counts the holders of the shared device d but those skip
// leaves out, one per pod or claim, and says whether one of them holds it
// so that no replica is left (held alone, or hardware overlapping it).
func (a *Allocations) sharedUse(d specs.Device, skip func(user) bool) (users int, none bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	seen := map[string]bool{}
	for _, u := range a.users("", d, nil) {
		switch {
		case skip(u):
		case u.sole || !sameHardware(*u.dev, d):
			none = true
		case !seen[u.key()]:
			seen[u.key()] = true
			users++
		}
	}
	return users, none
}

// Users returns who holds device d's hardware (whichever of its names),
// one entry per pod or claim, in order: for showing who shares a GPU.
func (a *Allocations) Users(d specs.Device) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []string
	for _, u := range a.users("", d, nil) {
		if w := u.holder.String(); sameHardware(*u.dev, d) && !slices.Contains(out, w) {
			out = append(out, w)
		}
	}
	return out
}

// Overlaps reports whether d shares hardware with any of devs (the same
// name, or one's footprint within the other's).
func Overlaps(d specs.Device, devs []specs.Device) bool {
	return slices.ContainsFunc(devs, func(o specs.Device) bool { return overlaps(d, o) })
}

// Held returns, per pod, the names of the devices it holds.
func (a *Allocations) Held() map[Pod][]string {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[Pod][]string, len(a.pods))
	for _, h := range a.pods {
		out[h.pod] = specs.Names(h.all())
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

// overlaps reports whether two devices share hardware: the same name, or
// the footprint of one within the other's (a GPU by index and by UUID; a
// GPU and "all"; a GPU and its MIG devices).
func overlaps(a, b specs.Device) bool {
	return a.Name == b.Name || covers(a, b) || covers(b, a)
}

// covers reports whether b's footprint is within a's.
func covers(a, b specs.Device) bool {
	if len(b.Nodes) == 0 {
		return false
	}
	for _, n := range b.Nodes {
		if !slices.Contains(a.Nodes, n) {
			return false
		}
	}
	return true
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
				if covers(d, c) {
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
