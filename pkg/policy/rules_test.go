package policy_test

import (
	"errors"
	"testing"

	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// TestOneRuleEveryDoor: each rule refuses a pod's container (NRI: the
// policy's Check, then the pool's Plan) and a DRA claim (AdmitClaim) the
// same device for the same reason, in the same words, and the device
// plugin is offered no room on a device the rule keeps.
func TestOneRuleEveryDoor(t *testing.T) {
	cands, byName := gpus()
	sick := func(d specs.Device) error {
		if d.Nodes[0] == "/dev/nvidia3" {
			return errors.New("Xid 79")
		}
		return nil
	}
	all := config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices}
	with := func(f func(*config.Policy)) config.Policy {
		c := all
		f(&c)
		return c
	}
	claim := func(name, pod string, gpu string) (policy.Claim, []policy.ClaimDevice) {
		return policy.Claim{UID: "uid-" + name, Namespace: "ns", Name: name, Pods: []string{pod}}, []policy.ClaimDevice{{Device: byName[gpu]}}
	}
	// usedClaim fills the pool with claim first (GPU 0), prepared for
	// pod x and used by a container of pod p, and claim second (GPU 1),
	// prepared for pod y; with restart, the pods are then rebuilt from
	// what the pool keeps for its record, as after a restart.
	usedClaim := func(restart bool) func(t *testing.T, a *policy.Allocations, p *policy.Policy) {
		return func(t *testing.T, a *policy.Allocations, p *policy.Policy) {
			first, devs := claim("first", "ns/x", "0")
			if _, err := a.AdmitClaim(p, first, devs, nil); err != nil {
				t.Fatal(err)
			}
			mustAdmit(t)(admit(a, p, pod("p"), nil, 0, policy.Choice{}, nil, first.UID))
			second, devs := claim("second", "ns/y", "1")
			if _, err := a.AdmitClaim(p, second, devs, nil); err != nil {
				t.Fatal(err)
			}
			if restart {
				if err := a.Restore(p, a.Holdings()); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	tests := []struct {
		name   string
		policy config.Policy
		// before fills the pool; the pod asking is ns/p, claim c is
		// reserved for it.
		before func(t *testing.T, a *policy.Allocations, p *policy.Policy)
		gpu    string
		// uses are the claims the asking container uses.
		uses []string
		rule string
		want string
		// offered says the device plugin is offered room on the device.
		offered bool
	}{{
		name:    "policy.namespaces",
		policy:  with(func(c *config.Policy) { c.Namespaces = []string{"tenant-*"} }),
		gpu:     "0",
		rule:    policy.RuleNamespaces,
		want:    `of namespace "ns" may not`,
		offered: true,
	}, {
		name:    "policy.devices",
		policy:  with(func(c *config.Policy) { c.Devices = []string{"nvidia.com/gpu=0"} }),
		gpu:     "1",
		rule:    policy.RuleDevices,
		want:    `denied by policy: device "nvidia.com/gpu=1" matches none of policy.devices [nvidia.com/gpu=0]; add a glob that matches it to policy.devices`,
		offered: true,
	}, {
		name:    "health",
		policy:  all,
		gpu:     "3",
		rule:    policy.RuleUnhealthy,
		want:    `denied by policy: device "nvidia.com/gpu=3": Xid 79; set policy.allowUnhealthy: true to allow it`,
		offered: true,
	}, {
		name:   "coexistence: held for a count",
		policy: all,
		before: func(t *testing.T, a *policy.Allocations, p *policy.Policy) {
			mustAdmit(t)(admit(a, p, pod("b"), nil, 1, policy.Choice{Candidates: cands[2:3]}, nil))
		},
		gpu:  "1",
		rule: policy.RuleExclusive,
		want: `denied by policy: device "nvidia.com/gpu=1" is held by pod ns/b (as "nvidia.com/gpu=1"), which got it for a count request; it is free again when pod ns/b is removed`,
	}, {
		name: "capacity: a shared GPU's replicas all used",
		policy: with(func(c *config.Policy) {
			c.Sharing = []config.Sharing{{Devices: []string{"nvidia.com/gpu=*"}, Replicas: 2, Strategy: config.StrategyTimeSlicing}}
		}),
		before: func(t *testing.T, a *policy.Allocations, p *policy.Policy) {
			mustAdmit(t)(admit(a, p, pod("b"), []specs.Device{byName["1"]}, 0, policy.Choice{}, nil))
			mustAdmit(t)(admit(a, p, pod("c"), []specs.Device{byName["GPU-1"]}, 0, policy.Choice{}, nil))
		},
		gpu:  "1",
		rule: policy.RuleSharing,
		want: `denied by policy: device "nvidia.com/gpu=1" is shared by policy.sharing[0] (replicas 2, timeSlicing) and used by 2 already: pod ns/b, pod ns/c; it is free for one more when one of them is removed, or raise replicas`,
	}, {
		name:   "maxDevicesPerPod: what the pod holds by name",
		policy: with(func(c *config.Policy) { c.MaxDevicesPerPod = 1 }),
		before: func(t *testing.T, a *policy.Allocations, p *policy.Policy) {
			mustAdmit(t)(admit(a, p, pod("p"), []specs.Device{byName["0"]}, 0, policy.Choice{}, nil))
		},
		gpu:     "1",
		rule:    policy.RuleMax,
		want:    "denied by policy: pod ns/p would hold 2 devices, more than policy.maxDevicesPerPod (1); raise policy.maxDevicesPerPod to allow it",
		offered: true,
	}, {
		// The pod's first container used a shared claim prepared for
		// another pod; its second uses another: the first claim's
		// device counts (it once did not).
		name:   "maxDevicesPerPod: a claim another container of the pod used, prepared for another pod",
		policy: with(func(c *config.Policy) { c.MaxDevicesPerPod = 1 }),
		before: usedClaim(false),
		gpu:    "1",
		uses:   []string{"uid-second"},
		rule:   policy.RuleMax,
		want:   "denied by policy: pod ns/p would hold 2 devices, more than policy.maxDevicesPerPod (1); raise policy.maxDevicesPerPod to allow it",
	}, {
		// The same after nri-gpu restarted: the pods rebuilt from what
		// the pool kept for its record.
		name:   "maxDevicesPerPod: a claim another container of the pod used, prepared for another pod, after a restart",
		policy: with(func(c *config.Policy) { c.MaxDevicesPerPod = 1 }),
		before: usedClaim(true),
		gpu:    "1",
		uses:   []string{"uid-second"},
		rule:   policy.RuleMax,
		want:   "denied by policy: pod ns/p would hold 2 devices, more than policy.maxDevicesPerPod (1); raise policy.maxDevicesPerPod to allow it",
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := knowing(policy.New(tc.policy), append(cands, byName["all"]))
			doors := map[string]func(a *policy.Allocations) error{
				"NRI": func(a *policy.Allocations) error {
					d := byName[tc.gpu]
					if tc.uses != nil {
						// The container asks for nothing by name: the
						// claim's device is its.
						_, err := a.Plan(p, policy.Want{Pod: pod("p"), Claims: tc.uses, Choice: policy.Choice{Unhealthy: sick}})
						return err
					}
					if err := p.Check(pod("p"), policy.Ask{Requests: []policy.Request{{Device: d.Name, Item: d.Name, Key: "gpus.nri-gpu.io", Origin: policy.OriginPod}}}); err != nil {
						return err
					}
					_, err := a.Plan(p, policy.Want{Pod: pod("p"), Named: []specs.Device{d}, Choice: policy.Choice{Unhealthy: sick}})
					return err
				},
				"DRA": func(a *policy.Allocations) error {
					c, devs := claim("c", "ns/p", tc.gpu)
					_, err := a.AdmitClaim(p, c, devs, sick)
					return err
				},
			}
			for door, ask := range doors {
				a := policy.NewAllocations()
				if tc.before != nil {
					tc.before(t, a, p)
				}
				if door == "DRA" && tc.uses != nil {
					a.ReleaseClaim("uid-second") // the claim being prepared is c, of the same device
				}
				wantDenied(t, ask(a), tc.rule, tc.want)
				if got := a.Room(p, byName[tc.gpu], policy.DevicePlugin) > 0; door == "NRI" && got != tc.offered {
					t.Errorf("device plugin offered room: %v, want %v", got, tc.offered)
				}
			}
		})
	}
}

// mustAdmit fails the test where an admission of its set-up is refused.
func mustAdmit(t *testing.T) func(policy.Grant, error) {
	return func(_ policy.Grant, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
}
