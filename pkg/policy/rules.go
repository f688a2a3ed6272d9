package policy

import (
	"fmt"
	"slices"
	"strings"

	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// The rules every door's admission applies, each written once: a pod's
// container (Plan, Commit) and a DRA claim (AdmitClaim) are refused by
// the same rule with the same words, the claim's name before them.

// checkNamespace applies policy.namespaces to a holder of namespace:
// holders names what may be refused ("pods", "claims") and act what
// they would do ("request devices through annotations", "be prepared").
func (p *Policy) checkNamespace(subject, holders, namespace, act string) error {
	if MatchAny(p.namespaces, namespace) {
		return nil
	}
	return deny(RuleNamespaces, fmt.Errorf("%s: %w: %s of namespace %q may not %s: it matches none of policy.namespaces [%s]; add a glob that matches it to policy.namespaces",
		subject, ErrDenied, holders, namespace, act, strings.Join(p.namespaces, ", ")))
}

// checkDevice applies policy.devices to a device subject asks for.
func (p *Policy) checkDevice(subject, device string) error {
	if p.Allowed(device) {
		return nil
	}
	return deny(RuleDevices, fmt.Errorf("%s: %w: device %q matches none of policy.devices [%s]; add a glob that matches it to policy.devices",
		subject, ErrDenied, device, strings.Join(p.devices, ", ")))
}

// checkHealth refuses a device whose hardware unhealthy says is not
// healthy, unless policy.allowUnhealthy; a nil unhealthy takes every
// device as healthy.
func (p *Policy) checkHealth(d specs.Device, unhealthy func(specs.Device) error) error {
	if unhealthy == nil || p.allowUnhealthy {
		return nil
	}
	if err := unhealthy(d); err != nil {
		return deny(RuleUnhealthy, fmt.Errorf("%w: device %q: %w; set policy.allowUnhealthy: true to allow it", ErrDenied, d.Name, err))
	}
	return nil
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
// reserved for it (pod: namespace/name).
func (a *Allocations) podHolds(pod string, holdings []*holding, uses []string) []specs.Device {
	var all []specs.Device
	claims := slices.Clone(uses)
	for _, h := range holdings {
		all = slices.Concat(all, h.named, h.counted)
		claims = append(claims, h.claims...)
	}
	return append(all, a.claimDevices(a.podClaims(pod, claims))...)
}

// usedTwice reports whether d is shared by policy.sharing and overlaps
// one of mine (what the pod uses already): a pod never uses one shared
// GPU twice, its replicas being for other pods.
func (p *Policy) usedTwice(d specs.Device, mine []specs.Device) bool {
	return p.Sharing(d) != nil && specs.OverlapsAny(d, mine)
}
