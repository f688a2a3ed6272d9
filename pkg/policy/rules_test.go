package policy_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// TestOneRuleEveryDoor: each rule refuses a pod's container (NRI: Plan)
// and a DRA claim (AdmitClaim) the same device for the same reason, in
// the same words, and the device plugin is offered no room on a device
// the rule keeps from every asker (policy.devices, health, who holds
// it; not policy.namespaces, which is the asker's, nor
// maxDevicesPerPod).
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
		return policy.Claim{UID: "uid-" + name, Namespace: "ns", Name: name, Pods: []policy.PodName{{Namespace: "ns", Name: pod}}}, []policy.ClaimDevice{{Device: byName[gpu]}}
	}
	// usedClaim fills the pool with claim first (GPU 0), prepared for
	// pod x and used by a container of pod p, and claim second (GPU 1),
	// prepared for pod y; with restart, the pods are then rebuilt from
	// what the pool keeps for its record, as after a restart.
	usedClaim := func(restart bool) func(t *testing.T, a *policy.Allocations, p *policy.Policy) {
		return func(t *testing.T, a *policy.Allocations, p *policy.Policy) {
			first, devs := claim("first", "x", "0")
			if _, err := a.AdmitClaim(p, first, claimAsked(devs), policy.Choice{}); err != nil {
				t.Fatal(err)
			}
			mustAdmit(t)(admit(a, p, pod("p"), nil, 0, policy.Choice{}, nil, first.UID))
			second, devs := claim("second", "y", "1")
			if _, err := a.AdmitClaim(p, second, claimAsked(devs), policy.Choice{}); err != nil {
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
		want:    `denied by policy: pods of namespace "ns" may not request devices through annotations or DRA claims: it matches none of policy.namespaces [tenant-*]`,
		offered: true,
	}, {
		name:   "policy.devices",
		policy: with(func(c *config.Policy) { c.Devices = []string{"nvidia.com/gpu=0"} }),
		gpu:    "1",
		rule:   policy.RuleDevices,
		want:   `denied by policy: device "nvidia.com/gpu=1" matches none of policy.devices [nvidia.com/gpu=0]; add a glob that matches it to policy.devices`,
	}, {
		name:   "health",
		policy: all,
		gpu:    "3",
		rule:   policy.RuleUnhealthy,
		want:   `denied by policy: device "nvidia.com/gpu=3": Xid 79; set policy.allowUnhealthy: true to allow it`,
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
					_, err := a.Plan(p, policy.Want{Pod: pod("p"), Named: byAnnotation(d), Choice: policy.Choice{Unhealthy: sick}})
					return err
				},
				"DRA": func(a *policy.Allocations) error {
					c, devs := claim("c", "p", tc.gpu)
					_, err := a.AdmitClaim(p, c, claimAsked(devs), policy.Choice{Unhealthy: sick})
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
				if got := a.Room(p, byName[tc.gpu], policy.DevicePlugin, policy.Choice{Unhealthy: sick}) > 0; door == "NRI" && got != tc.offered {
					t.Errorf("device plugin offered room: %v, want %v", got, tc.offered)
				}
			}
		})
	}
}

// byAnnotation returns devs asked for by name through the pod
// annotation gpus.nri-gpu.io, as the parser reads it.
func byAnnotation(devs ...specs.Device) []policy.Asked {
	out := make([]policy.Asked, 0, len(devs))
	for _, d := range devs {
		out = append(out, policy.Asked{Device: d, Request: &policy.Request{Device: d.Name, Item: d.Name, Key: policy.AnnotationKey, Origin: policy.OriginPod}})
	}
	return out
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

// TestFirstRuleEveryDoor: a request that breaks two rules at once is
// refused, through each door, by the first of them in the admission's
// order, in the same words after who asks: a pod's container (NRI:
// Plan) and a DRA claim (AdmitClaim) for GPUs 0 and 1 of pod ns/p; and
// the device plugin, asking what it may offer (Room), is offered no room
// on the GPU where the first rule is one of the device's. A claim's
// refusal names the claim first.
func TestFirstRuleEveryDoor(t *testing.T) {
	cands, byName := gpus()
	// GPU 1 is unhealthy and its spec injects /bin/evil, where a row
	// says so.
	all := config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices, HookPaths: []string{"/usr/bin/nvidia-cdi-hook"}}
	for _, tc := range []struct {
		name                 string
		policy               func(*config.Policy)
		sick, hooks, kubelet bool
		// before fills the pool: pod b holds GPU 1 for a count, or with
		// sharing, pods b and c share it.
		heldBy  string
		rule    string
		want    string
		offered bool
	}{
		{name: "namespaces, then devices", policy: func(c *config.Policy) { c.Namespaces, c.Devices = []string{"tenant-*"}, []string{"nvidia.com/gpu=0"} },
			rule: policy.RuleNamespaces, want: `pods of namespace "ns" may not request devices through annotations or DRA claims: it matches none of policy.namespaces [tenant-*]`, offered: false},
		{name: "namespaces, then hooks", policy: func(c *config.Policy) { c.Namespaces = []string{"tenant-*"} }, hooks: true,
			rule: policy.RuleNamespaces, want: `pods of namespace "ns" may not request devices`},
		{name: "devices, then hooks", policy: func(c *config.Policy) { c.Devices = []string{"nvidia.com/gpu=0"} }, hooks: true,
			rule: policy.RuleDevices, want: `device "nvidia.com/gpu=1" matches none of policy.devices [nvidia.com/gpu=0]`},
		{name: "hooks, then health", hooks: true, sick: true,
			rule: policy.RuleHookPaths, want: `its spec injects the hook "/bin/evil", which is not in policy.hookPaths`},
		{name: "health, then who holds it", sick: true, heldBy: "count",
			rule: policy.RuleUnhealthy, want: `device "nvidia.com/gpu=1": Xid 79; set policy.allowUnhealthy: true to allow it`},
		{name: "kubelet's allocation, then who holds it", policy: func(c *config.Policy) { c.Exclusive = true }, kubelet: true, heldBy: "count",
			rule: policy.RuleExclusive, want: `device "nvidia.com/gpu=1" is allocated by kubelet to pod ns/k (through the device plugin)`},
		{name: "who holds it, then maxDevicesPerPod", policy: func(c *config.Policy) { c.MaxDevicesPerPod = 1 }, heldBy: "count",
			rule: policy.RuleExclusive, want: `device "nvidia.com/gpu=1" is held by pod ns/b (as "nvidia.com/gpu=1"), which got it for a count request`},
		{name: "capacity, then maxDevicesPerPod", policy: func(c *config.Policy) {
			c.MaxDevicesPerPod = 1
			c.Sharing = []config.Sharing{{Devices: []string{"nvidia.com/gpu=1"}, Replicas: 2, Strategy: config.StrategyTimeSlicing}}
		}, heldBy: "sharers",
			rule: policy.RuleSharing, want: `device "nvidia.com/gpu=1" is shared by policy.sharing[0] (replicas 2, timeSlicing) and used by 2 already`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := all
			if tc.policy != nil {
				tc.policy(&cfg)
			}
			p := knowing(policy.New(cfg), append(cands, byName["all"]))
			ch := policy.Choice{}
			if tc.sick {
				ch.Unhealthy = func(d specs.Device) error {
					if d.Nodes[0] == "/dev/nvidia1" {
						return errors.New("Xid 79")
					}
					return nil
				}
			}
			hooks := func(d specs.Device) []string {
				if tc.hooks && d.Nodes[0] == "/dev/nvidia1" {
					return []string{"/bin/evil"}
				}
				return nil
			}
			ch.Hooks = hooks
			if tc.kubelet {
				ch.Kubelet = []policy.KubeletAllocation{{Device: byName["GPU-1"], Pod: policy.PodName{Namespace: "ns", Name: "k"}}}
			}
			fill := func(a *policy.Allocations) {
				open := knowing(policy.New(config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices, Sharing: cfg.Sharing}), append(cands, byName["all"]))
				switch tc.heldBy {
				case "count":
					mustAdmit(t)(admit(a, open, pod("b"), nil, 1, policy.Choice{Candidates: []specs.Device{byName["1"]}}, nil))
				case "sharers":
					mustAdmit(t)(admit(a, open, pod("b"), []specs.Device{byName["1"]}, 0, policy.Choice{}, nil))
					mustAdmit(t)(admit(a, open, pod("c"), []specs.Device{byName["GPU-1"]}, 0, policy.Choice{}, nil))
				}
			}
			ask := []specs.Device{byName["0"], byName["1"]}
			doors := map[string]func(a *policy.Allocations) error{
				"NRI": func(a *policy.Allocations) error {
					named := byAnnotation(ask...)
					for i := range named {
						named[i].Hooks = hooks(named[i].Device)
					}
					_, err := a.Plan(p, policy.Want{Pod: pod("p"), Named: named, Choice: ch})
					return err
				},
				"DRA": func(a *policy.Allocations) error {
					c := policy.Claim{UID: "uid-c", Namespace: "ns", Name: "c", Pods: []policy.PodName{{Namespace: "ns", Name: "p"}}}
					named := claimAsked([]policy.ClaimDevice{{Device: ask[0]}, {Device: ask[1]}})
					for i := range named {
						named[i].Hooks = hooks(named[i].Device)
					}
					_, err := a.AdmitClaim(p, c, named, ch)
					return err
				},
			}
			said := map[string]string{}
			for door, do := range doors {
				a := policy.NewAllocations()
				fill(a)
				err := do(a)
				wantDenied(t, err, tc.rule, tc.want)
				said[door] = reasons(err)
				// Who asks comes first: the claim through DRA.
				if claim := "claim ns/c"; (door == "DRA") != strings.HasPrefix(fmt.Sprint(err), claim) {
					t.Errorf("%s: %v; want it to begin with %q only through DRA", door, err, claim)
				}
				if door == "NRI" {
					offered := a.Room(p, byName["1"], policy.DevicePlugin, ch) > 0
					if offered != tc.offered {
						t.Errorf("the device plugin offered GPU 1: %v, want %v", offered, tc.offered)
					}
				}
			}
			if said["NRI"] != said["DRA"] {
				t.Errorf("the doors said it in other words:\nNRI: %s\nDRA: %s", said["NRI"], said["DRA"])
			}
		})
	}
}

// reasons returns what err says after "denied by policy: " on each of
// its lines: why, without who asked.
func reasons(err error) string {
	var out []string
	for _, line := range strings.Split(fmt.Sprint(err), "\n") {
		_, why, _ := strings.Cut(line, policy.ErrDenied.Error()+": ")
		out = append(out, why)
	}
	return strings.Join(out, "\n")
}
