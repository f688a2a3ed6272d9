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
	// Claims are the UIDs of the prepared claims the pod's containers
	// used, whichever pods the claims were reserved for: they count
	// towards policy.maxDevicesPerPod for its next containers.
	Claims []string
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
		for _, uid := range h.Claims {
			if !slices.Contains(own.claims, uid) {
				own.claims = append(own.claims, uid)
			}
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

// check reports held devices p does not allow, and holdings that the
// pool's judge would not let be had beside those before them: each claim
// (by UID) and then each pod (by ID) is judged, device by device, against
// the claims and pods before it, as a new holder of what it holds would
// be (a claim's devices and a count grant held strictly, a device found
// with no record held alone, named devices as policy.exclusive says), so
// that what is reported does not depend on the order.
func (a *Allocations) check(p *Policy) error {
	var problems []string
	report := func(format string, args ...any) {
		problems = append(problems, fmt.Sprintf(format, args...))
	}
	// full are the problems of shared hardware past its capacity, by the
	// hardware's first node: reported once, with every holder.
	full := map[string]int{}
	judged := NewAllocations()
	judge := func(h User, w who, d specs.Device) {
		v := judged.judge(p, w, d)
		for _, b := range v.blocked {
			report("%s (%q) and %s (%q) both hold %s", b.name(), b.Device.Name, h.name(), d.Name, commonNode(b.Device, d))
		}
		if len(v.blocked) > 0 || v.share == nil || v.fits() {
			return
		}
		key := d.Name
		if len(d.Nodes) > 0 {
			key = d.Nodes[0]
		}
		n, ok := full[key]
		if !ok {
			n = len(problems)
			full[key] = n
			problems = append(problems, "")
		}
		who := append(describe(v.sharers), h.name())
		c, used := v.capacity, v.used
		use := c.use(w.use)
		used.Shares += use.Shares
		used.Memory += use.Memory
		if used.Shares > c.Shares {
			problems[n] = fmt.Sprintf("%d hold %q, which %s lets %d use at once: %s", len(who), v.sharers[0].Device.Name, v.share, c.Shares, strings.Join(who, ", "))
		} else {
			problems[n] = fmt.Sprintf("%d hold %s of %q's memory, which has %s under %s: %s", len(who), Quantity(used.Memory), v.sharers[0].Device.Name, Quantity(c.Memory), v.share, strings.Join(who, ", "))
		}
	}
	for _, uid := range slices.Sorted(maps.Keys(a.claims)) {
		c := a.claims[uid]
		for _, d := range c.devices {
			if !p.Allowed(d.Name) {
				report("%s holds %q, which policy.devices does not allow (any more)", c.claim, d.Name)
			}
			judge(User{Claim: &c.claim}, who{exclusive: true, use: d.Use}, d.Device)
		}
		judged.claims[uid] = c
	}
	for _, id := range slices.Sorted(maps.Keys(a.pods)) {
		h := a.pods[id]
		for _, d := range h.all() {
			if !p.Allowed(d.Name) {
				report("pod %s holds %q, which policy.devices does not allow (any more)", h.pod, d.Name)
			}
		}
		for i, d := range h.all() {
			sole := slices.Contains(h.sole, d.Name)
			judge(User{Pod: h.pod}, who{pod: id, exclusive: p.exclusive || i >= len(h.named) || sole, alone: sole}, d)
		}
		judged.pods[id] = h
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

// commonNode returns the first of d's nodes that o has too: where two
// holders of overlapping hardware meet (d's name where it has none).
func commonNode(o, d specs.Device) string {
	for _, n := range d.Nodes {
		if slices.Contains(o.Nodes, n) {
			return n
		}
	}
	return d.Name
}
