package policy_test

import (
	"errors"

	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// admit plans and commits, as nri-gpu's request path does with nothing
// to build between the two: planning again while the plan is stale.
func admit(a *policy.Allocations, p *policy.Policy, pod policy.Pod, named []specs.Device, count int, ch policy.Choice, fromKubelet []string, claims ...string) (policy.Grant, error) {
	for {
		pl, err := a.Plan(p, policy.Want{Pod: pod, Named: named, Count: count, Choice: ch, FromKubelet: fromKubelet, Claims: claims})
		if err != nil {
			return policy.Grant{}, err
		}
		g, err := a.Commit(p, pl)
		if !errors.Is(err, policy.ErrStale) {
			return g, err
		}
	}
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
