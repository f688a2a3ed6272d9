package policy

import (
	"fmt"
	"slices"

	"tags.cncf.io/container-device-interface/pkg/parser"

	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// Choice is what a count request chooses among, and how.
type Choice struct {
	// Candidates are the individual devices of the default kind, in spec
	// order.
	Candidates []specs.Device
	// Usable says why the container cannot have a device (edits the
	// runtime cannot apply), or nil if it can; a nil Usable takes any.
	Usable func(specs.Device) error
	// Hooks returns the hook executables a device's spec injects, for
	// the hookPaths rule of the devices no request names (a count's
	// candidates, a door's offers); nil: none known.
	Hooks func(specs.Device) []string
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
	// Kubelet are the devices kubelet allocated other pods through a
	// device plugin (at their admission, for as long as they live),
	// whether or not their containers hold them yet. A count request
	// passes them over; a request by name is denied one under
	// policy.exclusive.
	Kubelet []KubeletAllocation
}

// KubeletAllocation is a device kubelet allocated a pod.
type KubeletAllocation struct {
	Device specs.Device
	// Pod is the pod kubelet allocated it.
	Pod PodName
}

// allocatedBy returns the pod kubelet allocated a device overlapping d,
// and whether there is one.
func (ch Choice) allocatedBy(d specs.Device) (PodName, bool) {
	for _, k := range ch.Kubelet {
		if k.Device.Overlaps(d) {
			return k.Pod, true
		}
	}
	return PodName{}, false
}

// usable says why a candidate cannot be given to the container: a hook
// outside policy.hookPaths (the admission's rule), edits the runtime
// cannot apply; nil if it can.
func (ch Choice) usable(p *Policy, d specs.Device) error {
	if ch.Hooks != nil {
		if err := p.CheckHooks(d.Name, ch.Hooks(d)); err != nil {
			return err
		}
	}
	if ch.Usable != nil {
		return ch.Usable(d)
	}
	return nil
}

// kubeletWhy is why a device kubelet allocated pod is not free.
func kubeletWhy(pod PodName) string {
	if pod == (PodName{}) {
		return "allocated by kubelet to a pod it is admitting (through the device plugin), which holds it for as long as it lives"
	}
	return "allocated by kubelet to pod " + pod.String() + " (through the device plugin), which holds it for as long as it lives"
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
		if !p.Allowed(c.Name) || specs.OverlapsAny(c, seen) {
			continue
		}
		seen = append(seen, c)
		if p.sharedTwice(c, mine) != nil {
			continue
		}
		// A device held by another pod in any way is not free, unless
		// it is shared and a replica is left.
		v := a.judge(p, who{pod: podID, claims: uses, exclusive: true}, c)
		if v.usersLeft() == 0 {
			held++
			why := "held by " + describeUsers(v.sharers)
			if len(v.blocked) > 0 {
				why = "held by " + v.blocked[0].name()
			}
			passed = append(passed, Passed{c.Name, why})
			continue
		}
		if pod, ok := ch.allocatedBy(c); ok {
			held++
			passed = append(passed, Passed{c.Name, kubeletWhy(pod)})
			continue
		}
		if ch.Unhealthy != nil {
			if err := ch.Unhealthy(c); err != nil {
				unhealthy++
				passed = append(passed, Passed{c.Name, err.Error()})
				continue
			}
		}
		if len(free) < enough {
			if err := ch.usable(p, c); err != nil {
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
	chosen, score := Pick(nil, free, used, count, ch.Links)
	return chosen, score, Considered{Free: specs.Names(free), Passed: passed}, nil
}

// Pick is the one chooser, of a count request's devices and of the
// device plugin's preferred allocation: it returns count of free
// (count <= len(free)), used saying how many users each has, the least
// used first; of those used alike, the set most closely connected to
// each other and to had (devices the holder has already) where links is
// known, else the first in order. It returns them (the least used
// before the others, each in the order of free) and their score under
// links (0 where it was not asked).
func Pick(had, free []specs.Device, used []int, count int, links func(a, b specs.Device) int) ([]specs.Device, int) {
	least, rest := leastUsed(free, used, count)
	need := count - len(least)
	if links == nil || count+len(had) < 2 {
		return append(least, rest[:need]...), 0
	}
	best, score := Closest(slices.Concat(had, least), rest, need, links)
	return append(least, best...), score
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
