package policy

import (
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"

	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// ErrDenied is wrapped by every policy denial.
var ErrDenied = errors.New("denied by policy")

// ErrSharedTwice is wrapped by the error of two policy.sharing entries
// that match one device: by one of its names, or by two names of its
// hardware.
var ErrSharedTwice = errors.New("two policy.sharing entries match one device")

// Rules, as a Denial names them: the config key that decided, or "count"
// for a count request that found too few free devices.
const (
	RuleNamespaces = "namespaces"
	RuleDevices    = "devices"
	RuleAllowAll   = "allowAll"
	RuleMax        = "maxDevicesPerPod"
	RuleExclusive  = "exclusive"
	RuleCount      = "count"
	RuleHookPaths  = "hookPaths"
	RuleUnhealthy  = "allowUnhealthy"
	RuleSharing    = "sharing"
)

// Denial is a policy denial: it wraps ErrDenied and says which rule
// decided, for callers that count denials by rule.
type Denial struct {
	Rule string
	err  error
}

func (d *Denial) Error() string { return d.err.Error() }

// Unwrap returns the message's error, which wraps ErrDenied.
func (d *Denial) Unwrap() error { return d.err }

func deny(rule string, err error) error { return &Denial{Rule: rule, err: err} }

// Pod identifies a pod sandbox: the runtime's ID for it, and its name.
type Pod struct {
	// ID is the sandbox ID the runtime gave the pod.
	ID string
	// Namespace and Name are the pod's.
	Namespace, Name string
}

// String returns namespace/name.
func (p Pod) String() string { return p.Named().String() }

// Named returns the pod's name as Kubernetes' API says it.
func (p Pod) Named() PodName { return PodName{Namespace: p.Namespace, Name: p.Name} }

// PodName is a pod as Kubernetes' API names it, by namespace and name:
// how kubelet's allocations and a claim's reservations name the pods
// they are for. Its text (and so its JSON) is namespace/name.
type PodName struct {
	Namespace, Name string
}

// String returns namespace/name.
func (n PodName) String() string { return n.Namespace + "/" + n.Name }

// MarshalText returns namespace/name.
func (n PodName) MarshalText() ([]byte, error) { return []byte(n.String()), nil }

// UnmarshalText reads namespace/name.
func (n *PodName) UnmarshalText(b []byte) error {
	ns, name, ok := strings.Cut(string(b), "/")
	if !ok || ns == "" || name == "" {
		return fmt.Errorf("pod %q: not namespace/name", b)
	}
	*n = PodName{Namespace: ns, Name: name}
	return nil
}

// podNames returns the names as text, for messages.
func podNames(ns []PodName) []string {
	out := make([]string, len(ns))
	for i, n := range ns {
		out[i] = n.String()
	}
	return out
}

// Policy holds the rules of a configuration's policy block. It has no
// state: what pods hold lives in Allocations, which outlives a change of
// configuration.
type Policy struct {
	namespaces []string
	devices    []string
	allowAll   bool
	max        int
	exclusive  bool
	hookPaths  []string
	// exemptCDI exempts cdi.k8s.io requests from namespaces and allowAll.
	exemptCDI bool
	// allowUnhealthy lets a device whose GPU is unhealthy be asked for by
	// name.
	allowUnhealthy bool
	// sharing are the policy.sharing entries, in order.
	sharing []SharingEntry
	// aliases returns the names a device's hardware goes by; nil: its
	// own only.
	aliases func(specs.Device) []string
	// memory returns a device's memory in bytes (0: unknown); nil: none
	// known.
	memory func(specs.Device) int64
	// memoryLimits is policy.memoryLimits; bounding says why the driver
	// cannot bound a device's holders' memory here (nil: unknown, so it
	// cannot).
	memoryLimits config.MemoryLimits
	bounding     func(specs.Device) error
}

// SharingEntry is a policy.sharing entry: how its devices are shared.
type SharingEntry struct {
	// Index is the entry's place in policy.sharing, for messages.
	Index int
	// Replicas is how many pods may use one such device at once.
	Replicas int
	// Strategy is time-slicing or MPS.
	Strategy config.Strategy
	// ActiveThreadPercentage and PinnedMemory (bytes) bound each MPS
	// client; PinnedMemory 0 takes the GPU's memory divided by Replicas.
	ActiveThreadPercentage int
	PinnedMemory           int64
	// MemoryQuota says memory is a scheduling quota only (timeSlicing).
	MemoryQuota bool

	globs   []string
	amounts config.Amounts
}

// String describes the entry for messages: "policy.sharing[0]
// (replicas 4, timeSlicing)".
func (s *SharingEntry) String() string {
	return fmt.Sprintf("policy.sharing[%d] (replicas %d, %s)", s.Index, s.Replicas, s.Strategy)
}

// Sharing returns how device d's hardware is shared: the policy.sharing
// entry one of whose globs matches one of the names it goes by (see
// WithAliases), whichever name d is, or nil when it is not shared. Where
// two entries match (CheckSharing refuses that), it is the first.
func (p *Policy) Sharing(d specs.Device) *SharingEntry {
	s, _ := p.share(d)
	return s
}

// share returns how d's hardware is shared, and an error wrapping
// ErrSharedTwice when more than one entry matches its names.
func (p *Policy) share(d specs.Device) (*SharingEntry, error) {
	if len(p.sharing) == 0 {
		return nil, nil // nothing shared: no names to look up
	}
	names := []string{d.Name}
	if p.aliases != nil {
		names = p.aliases(d)
	}
	var (
		found *SharingEntry
		by    string
	)
	for i := range p.sharing {
		for _, name := range names {
			if !MatchAny(p.sharing[i].globs, name) {
				continue
			}
			if found != nil {
				return found, fmt.Errorf("%w: policy.sharing[%d] matches %q and policy.sharing[%d] matches %q, which is the same device; a device is shared one way: make one entry's devices not match it",
					ErrSharedTwice, found.Index, by, i, name)
			}
			found, by = &p.sharing[i], name
			break
		}
	}
	return found, nil
}

// CheckSharing returns an error wrapping ErrSharedTwice for each device
// of devs (one per piece of hardware) that two policy.sharing entries
// match, naming both, or nil.
func (p *Policy) CheckSharing(devs []specs.Device) error {
	var (
		errs []error
		seen []specs.Device
	)
	for _, d := range devs {
		if slices.ContainsFunc(seen, d.Same) {
			continue
		}
		seen = append(seen, d)
		if _, err := p.share(d); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// WithAliases returns a copy of p that knows the names each device's
// hardware goes by (a GPU's index and UUID: the specs' Aliases), so that
// whether it is shared follows the hardware, not the name asked for.
func (p *Policy) WithAliases(aliases func(specs.Device) []string) *Policy {
	c := *p
	c.aliases = aliases
	return &c
}

// New returns the policy of a validated configuration block.
func New(p config.Policy) *Policy {
	return &Policy{
		namespaces: slices.Clone(p.Namespaces),
		devices:    slices.Clone(p.Devices),
		allowAll:   p.AllowAll,
		max:        p.MaxDevicesPerPod,
		exclusive:  p.Exclusive,
		hookPaths:  slices.Clone(p.HookPaths),
		exemptCDI:  p.ExemptCDIAnnotations,

		allowUnhealthy: p.AllowUnhealthy,
		sharing:        shares(p.Sharing),
		memoryLimits:   p.MemoryLimits,
	}
}

func shares(entries []config.Sharing) []SharingEntry {
	out := make([]SharingEntry, 0, len(entries))
	for i, e := range entries {
		s := SharingEntry{Index: i, Replicas: e.Replicas, Strategy: e.Strategy, MemoryQuota: e.MemoryQuota, globs: slices.Clone(e.Devices), amounts: e.Amounts()}
		if e.Strategy == config.StrategyMPS {
			s.ActiveThreadPercentage = e.ActiveThreadPercentage
			if s.ActiveThreadPercentage == 0 {
				s.ActiveThreadPercentage = max(1, 100/e.Replicas)
			}
			s.PinnedMemory, _ = e.PinnedMemory() // validated
		}
		out = append(out, s)
	}
	return out
}

// Check applies the admission's steps that read only what was asked
// (policy.namespaces, policy.devices, policy.allowAll) to what a
// container of pod asks for, before its devices are looked up: for a
// container found running that nri-gpu did not create. It returns nil,
// or an error wrapping ErrDenied for each request the first of those
// steps to refuse refuses.
func (p *Policy) Check(pod Pod, ask Ask) error {
	q := &question{p: p, pod: pod, count: ask.Count, exclusive: p.exclusive}
	for i := range ask.Requests {
		q.named = append(q.named, Asked{Device: specs.Device{Name: ask.Requests[i].Device}, Request: &ask.Requests[i]})
	}
	return q.decide(ofRequests, ofRequests)
}

// Allowed reports whether policy.devices lets a device be given at all.
func (p *Policy) Allowed(device string) bool { return MatchAny(p.devices, device) }

// MatchAny reports whether s matches one of the globs (path.Match
// patterns, validated with the configuration).
func MatchAny(globs []string, s string) bool {
	for _, g := range globs {
		if ok, _ := path.Match(g, s); ok {
			return true
		}
	}
	return false
}
