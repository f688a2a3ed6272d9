package policy_test

import (
	"errors"
	"slices"

	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// admit plans and commits, as nri-gpu's request path does with nothing
// to build between the two: planning again while the plan is stale. The
// devices of fromKubelet are asked as kubelet's (the CRI request's).
func admit(a *policy.Allocations, p *policy.Policy, pod policy.Pod, named []specs.Device, count int, ch policy.Choice, fromKubelet []string, claims ...string) (policy.Grant, error) {
	asked := make([]policy.Asked, 0, len(named))
	for _, d := range named {
		a := policy.Asked{Device: d}
		if slices.Contains(fromKubelet, d.Name) {
			a.Request = &policy.Request{Device: d.Name, Item: d.Name, Origin: policy.OriginRuntime}
		}
		asked = append(asked, a)
	}
	for {
		pl, err := a.Plan(p, policy.Want{Pod: pod, Named: asked, Count: count, Choice: ch, Claims: claims})
		if err != nil {
			return policy.Grant{}, err
		}
		g, err := a.Commit(p, pl)
		if !errors.Is(err, policy.ErrStale) {
			return g, err
		}
	}
}

// asked returns devs asked for by name, through no request.
func asked(devs ...specs.Device) []policy.Asked {
	out := make([]policy.Asked, 0, len(devs))
	for _, d := range devs {
		out = append(out, policy.Asked{Device: d})
	}
	return out
}

// claimAsked returns a claim's devices as its admission is asked them.
func claimAsked(devs []policy.ClaimDevice) []policy.Asked {
	out := make([]policy.Asked, 0, len(devs))
	for i := range devs {
		out = append(out, policy.Asked{Device: devs[i].Device, Claim: &devs[i]})
	}
	return out
}

// knowing is p knowing the names each of devs goes by, as nri-gpu's
// policy knows them from the specs: those of the devices with the same
// nodes.
func knowing(p *policy.Policy, devs []specs.Device) *policy.Policy {
	return p.WithAliases(func(d specs.Device) []string {
		out := []string{d.Name}
		for _, o := range devs {
			if o.Name != d.Name && o.Same(d) {
				out = append(out, o.Name)
			}
		}
		return out
	})
}

// gpuPolicy is the policy of cfg knowing the names of gpus()' devices.
func gpuPolicy(cfg config.Policy) *policy.Policy {
	candidates, byName := gpus()
	return knowing(policy.New(cfg), append(candidates, byName["all"]))
}
