package policy_test

import (
	"errors"
	"testing"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// TestUsedDevicesJudged: the devices of the prepared claims a container
// uses, which nri-gpu injects into it, meet the rules of what nri-gpu
// injects (in the request's snapshot of the trusted specs; hooks in
// policy.hookPaths), and not again those their claim met when it was
// prepared (policy.devices, health).
func TestUsedDevicesJudged(t *testing.T) {
	_, byName := gpus()
	gpu1 := byName["1"]
	p := gpuPolicy(config.Policy{Namespaces: []string{"*"}, Devices: []string{"nvidia.com/gpu=0"}, HookPaths: []string{"/usr/bin/nvidia-cdi-hook"}})
	open := gpuPolicy(config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices})
	sick := policy.Choice{Unhealthy: func(d specs.Device) error {
		if d.Name == gpu1.Name {
			return errors.New("Xid 79")
		}
		return nil
	}}
	for _, tc := range []struct {
		name   string
		used   policy.Asked
		choice policy.Choice
		want   string // "": admitted
	}{
		{name: "in the snapshot, its hooks trusted", used: policy.Asked{Device: gpu1, Hooks: []string{"/usr/bin/nvidia-cdi-hook"}}},
		{name: "not in the snapshot", used: policy.Asked{Device: gpu1, Unresolved: errors.New("not in the trusted specs")}, want: "not in the trusted specs"},
		{name: "a hook not trusted", used: policy.Asked{Device: gpu1, Hooks: []string{"/bin/evil"}}, want: `its spec injects the hook "/bin/evil"`},
		{name: "unhealthy since its claim was prepared", used: policy.Asked{Device: gpu1}, choice: sick},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := policy.NewAllocations()
			c := policy.Claim{UID: "uid-c", Namespace: "ns", Name: "c", Pods: []policy.PodName{{Namespace: "ns", Name: "p"}}}
			if _, err := a.AdmitClaim(open, c, claimAsked([]policy.ClaimDevice{{Device: gpu1}}), policy.Choice{}); err != nil {
				t.Fatal(err)
			}
			_, err := a.Plan(p, policy.Want{Pod: pod("p"), Claims: []string{c.UID}, Used: []policy.Asked{tc.used}, Choice: tc.choice})
			if tc.want == "" {
				if err != nil {
					t.Errorf("refused: %v", err)
				}
				return
			}
			testutil.ErrorSays(t, err, tc.want)
		})
	}
}
