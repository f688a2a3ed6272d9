package policy_test

import (
	"errors"

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
