package policy

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

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
		// share is how the device is shared, nil if it is not; use what
		// the holder consumes of it.
		share *Share
		use   Use
	}
	// users counts the holders of each shared piece of hardware, by its
	// first node, and what they consume.
	type use struct {
		dev   specs.Device
		share *Share
		who   []string
		used  Use
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
			u = &use{dev: o.dev, share: o.share}
			users[n] = u
			order = append(order, n)
		}
		if !slices.Contains(u.who, o.who) {
			u.who = append(u.who, o.who)
			c := p.Capacity(o.share, o.dev).use(o.use)
			u.used.Shares += c.Shares
			u.used.Memory += c.Memory
		}
	}
	byNode := map[string][]owner{}
	// apart reports whether o and the device d of a holder (counted:
	// strictly; share: how d is shared; sole: held alone) may not both
	// hold what they hold, as the pool judges it: overlapping hardware,
	// unless shared as policy.sharing allows, held strictly by either,
	// exclusive, or shared by one of them.
	apart := func(o owner, d specs.Device, counted bool, share *Share, sole bool) bool {
		if !o.dev.Overlaps(d) || ((share != nil || o.share != nil) && !sole && o.dev.Same(d)) {
			return false
		}
		return counted || o.counted || p.exclusive || share != nil || o.share != nil
	}
	// hold records holder who's device d, reporting each earlier holder
	// it may not hold it beside, once, by the first node they share.
	hold := func(who, id string, d specs.Device, counted bool, share *Share, sole bool, consumed Use) {
		reported := map[string]bool{}
		for _, n := range d.Nodes {
			for _, o := range byNode[n] {
				if key := o.id + "\x00" + o.dev.Name; o.id != id && !reported[key] && apart(o, d, counted, share, sole) {
					reported[key] = true
					report("%s (%q) and %s (%q) both hold %s", o.who, o.dev.Name, who, d.Name, n)
				}
			}
			byNode[n] = append(byNode[n], owner{who: who, id: id, dev: d, counted: counted, share: share})
		}
		count(owner{who: who, dev: d, share: share, use: consumed})
	}
	// A claim's devices are its own, as a count grant's are.
	for _, uid := range slices.Sorted(maps.Keys(a.claims)) {
		c := a.claims[uid]
		for _, d := range c.devices {
			if !p.Allowed(d.Name) {
				report("%s holds %q, which policy.devices does not allow (any more)", c.claim, d.Name)
			}
			hold(c.claim.String(), "claim:"+uid, d.Device, true, p.Sharing(d.Device), false, d.Use)
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
			share := p.Sharing(d)
			if sole {
				share = nil
			}
			hold("pod "+h.pod.String(), id, d, i >= len(h.named) || sole, share, sole, Use{})
		}
	}
	for _, n := range order {
		u := users[n]
		c := p.Capacity(u.share, u.dev)
		switch {
		case u.used.Shares > c.Shares:
			report("%d hold %q, which %s lets %d use at once: %s", len(u.who), u.dev.Name, u.share, c.Shares, strings.Join(u.who, ", "))
		case c.Memory > 0 && u.used.Memory > c.Memory:
			report("%d hold %s of %q's memory, which has %s under %s: %s", len(u.who), Quantity(u.used.Memory), u.dev.Name, Quantity(c.Memory), u.share, strings.Join(u.who, ", "))
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
