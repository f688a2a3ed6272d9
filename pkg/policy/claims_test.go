package policy_test

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// claimOf is claim ns/name (UID uid-name) of pod ns/p holding the GPUs
// by index, each for request "gpus".
func claimOf(name string, byName map[string]specs.Device, gpus ...string) (policy.Claim, []policy.ClaimDevice) {
	c := policy.Claim{UID: "uid-" + name, Namespace: "ns", Name: name, Pods: []policy.PodName{{Namespace: "ns", Name: "p"}}}
	var devs []policy.ClaimDevice
	for _, g := range gpus {
		devs = append(devs, policy.ClaimDevice{Device: byName[g], Requests: []string{"gpus"}})
	}
	return c, devs
}

func TestAdmitClaim(t *testing.T) {
	_, byName := gpus()
	sick := func(d specs.Device) error {
		if d.Name == "nvidia.com/gpu=GPU-3" {
			return errors.New("Xid 79")
		}
		return nil
	}
	tests := []struct {
		name   string
		policy config.Policy
		// holdBefore's holdings are there, unless fresh.
		claim string
		gpus  []string
		// fresh: nothing held before.
		fresh bool
		// unreserved: the claim is reserved for no pod yet.
		unreserved bool
		rule       string
		wantErr    []string
	}{
		{name: "a free device", policy: config.Policy{Namespaces: []string{"ns"}, Devices: config.DefaultDevices}, claim: "c", gpus: []string{"3"}},
		{name: "a device a pod holds by name, exclusive or not", policy: config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices}, claim: "c", gpus: []string{"0"},
			rule: policy.RuleExclusive, wantErr: []string{"claim ns/c of pod ns/p", `device "nvidia.com/gpu=0" is held by pod ns/a`}},
		{name: "a device a pod got for a count", policy: config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices}, claim: "c", gpus: []string{"1"},
			rule: policy.RuleExclusive, wantErr: []string{"is held by pod ns/b"}},
		{name: "a device another claim holds", policy: config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices}, claim: "c", gpus: []string{"GPU-2"},
			rule: policy.RuleExclusive, wantErr: []string{`"nvidia.com/gpu=GPU-2" is held by claim ns/old of pod ns/p (as "nvidia.com/gpu=2")`, "unprepares the claim"}},
		{name: "a namespace policy.namespaces does not match", policy: config.Policy{Namespaces: []string{"tenant-*"}, Devices: config.DefaultDevices}, claim: "c", gpus: []string{"3"},
			rule: policy.RuleNamespaces, wantErr: []string{`claim ns/c of pod ns/p: denied by policy: pods of namespace "ns" may not request devices through annotations or DRA claims`, "policy.namespaces [tenant-*]"}},
		{name: "a device policy.devices does not allow", policy: config.Policy{Namespaces: []string{"*"}, Devices: []string{"nvidia.com/gpu=0"}}, claim: "c", gpus: []string{"3"},
			rule: policy.RuleDevices, wantErr: []string{`device "nvidia.com/gpu=3" matches none of policy.devices`}},
		{name: "an unhealthy GPU", policy: config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices}, claim: "c", gpus: []string{"GPU-3"},
			rule: policy.RuleUnhealthy, wantErr: []string{`device "nvidia.com/gpu=GPU-3": Xid 79`, "policy.allowUnhealthy"}},
		{name: "every device refused is named: two policy.devices does not allow", policy: config.Policy{Namespaces: []string{"*"}, Devices: []string{"nvidia.com/gpu=0"}}, claim: "c", gpus: []string{"3", "GPU-3"},
			rule: policy.RuleDevices, wantErr: []string{`device "nvidia.com/gpu=3" matches none`, `device "nvidia.com/gpu=GPU-3" matches none`}},
		// The first rule in the admission's order decides: health before
		// who holds what.
		{name: "unhealthy and held: refused for its health", policy: config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices}, claim: "c", gpus: []string{"1", "GPU-3"},
			rule: policy.RuleUnhealthy, wantErr: []string{`device "nvidia.com/gpu=GPU-3": Xid 79`}},
		{name: "every device refused is named: two held", policy: config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices}, claim: "c", gpus: []string{"0", "1"},
			rule: policy.RuleExclusive, wantErr: []string{`device "nvidia.com/gpu=0" is held by pod ns/a`, `device "nvidia.com/gpu=1" is held by pod ns/b`}},
		{name: "an unhealthy GPU where policy.allowUnhealthy", policy: config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices, AllowUnhealthy: true}, claim: "c", gpus: []string{"GPU-3"}},
		{name: "more than policy.maxDevicesPerPod", policy: config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices, MaxDevicesPerPod: 1}, claim: "c", gpus: []string{"0", "1"}, fresh: true,
			rule: policy.RuleMax, wantErr: []string{"pod ns/p would hold 2 devices, more than policy.maxDevicesPerPod (1)"}},
		{name: "more than policy.maxDevicesPerPod, reserved for no pod: the claim named once", policy: config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices, MaxDevicesPerPod: 1}, claim: "c", gpus: []string{"0", "1"}, fresh: true, unreserved: true,
			rule: policy.RuleMax, wantErr: []string{"claim ns/c: denied by policy: it would hold 2 devices, more than policy.maxDevicesPerPod (1)"}},
		{name: "as many as policy.maxDevicesPerPod, one GPU by two names", policy: config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices, MaxDevicesPerPod: 1}, claim: "c", gpus: []string{"0", "GPU-0"}, fresh: true},
		{name: "the same claim again with the same device (kubelet after a restart): kept, whatever the policy now", policy: config.Policy{Namespaces: []string{"tenant-*"}, Devices: config.DefaultDevices}, claim: "old", gpus: []string{"2"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := policy.New(tc.policy)
			a := policy.NewAllocations()
			if !tc.fresh {
				holdBefore(t, a, byName)
			}
			c, devs := claimOf(tc.claim, byName, tc.gpus...)
			if tc.unreserved {
				c.Pods = nil
			}
			_, err := a.AdmitClaim(p, c, claimAsked(devs), policy.Choice{Unhealthy: sick})
			if tc.rule == "" {
				if err != nil {
					t.Fatal(err)
				}
				_, held, _ := a.Claim(c.UID, nil)
				if len(held) != len(devs) || held[0].Name != devs[0].Name {
					t.Errorf("claim holds %v, want %v", held, devs)
				}
				return
			}
			testutil.ErrorSays(t, err, tc.wantErr...)
			var d *policy.Denial
			if !errors.As(err, &d) || d.Rule != tc.rule || !errors.Is(err, policy.ErrDenied) {
				t.Errorf("denial %v, want rule %s wrapping ErrDenied", err, tc.rule)
			}
			if _, _, err := a.Claim(c.UID, nil); !errors.Is(err, policy.ErrNotPrepared) {
				t.Errorf("a refused claim is held: %v", err)
			}
		})
	}
}

// TestClaimInThePool: a claim's devices are held like every other
// holding: a pod not using the claim is refused them by name (exclusive
// or not) and a count passes them over, naming the claim; the pods using
// it get them, their count counted against policy.maxDevicesPerPod; the
// device plugin and the DRA driver see them as the pool says; released,
// they are free.
func TestClaimInThePool(t *testing.T) {
	cands, byName := gpus()
	p := policy.New(config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices, MaxDevicesPerPod: 2})
	a := policy.NewAllocations()
	c, devs := claimOf("c", byName, "0", "1")
	devs[1].Requests = []string{"other"}
	if _, err := a.AdmitClaim(p, c, claimAsked(devs), policy.Choice{}); err != nil {
		t.Fatal(err)
	}

	_, err := admit(a, p, pod("x"), []specs.Device{byName["GPU-0"]}, 0, policy.Choice{}, nil)
	testutil.ErrorSays(t, err, `device "nvidia.com/gpu=GPU-0" is held by claim ns/c of pod ns/p (as "nvidia.com/gpu=0")`)

	g, err := admit(a, p, pod("x"), nil, 2, policy.Choice{Candidates: cands}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := specs.Names(g.Counted); !slices.Equal(got, []string{"nvidia.com/gpu=2", "nvidia.com/gpu=3"}) {
		t.Errorf("a count got %v, want the GPUs no claim holds", got)
	}
	if !slices.ContainsFunc(g.Considered.Passed, func(ps policy.Passed) bool {
		return ps.Device == "nvidia.com/gpu=0" && ps.Reason == "held by claim ns/c of pod ns/p"
	}) {
		t.Errorf("passed over %v, want gpu 0 held by the claim", g.Considered.Passed)
	}
	a.Release("id-x")

	// A pod using another claim is refused them all the same.
	other, otherDevs := claimOf("another", byName, "3")
	other.Pods = []policy.PodName{{Namespace: "ns", Name: "y"}}
	if _, err := a.AdmitClaim(p, other, claimAsked(otherDevs), policy.Choice{}); err != nil {
		t.Fatal(err)
	}
	_, err = admit(a, p, pod("y"), []specs.Device{byName["0"]}, 0, policy.Choice{}, nil, other.UID)
	testutil.ErrorSays(t, err, "is held by claim ns/c")
	a.ReleaseClaim(other.UID)

	// The claim's own pod: it may use them, and they count.
	if _, err := admit(a, p, pod("p"), []specs.Device{byName["0"]}, 0, policy.Choice{}, nil, c.UID); err != nil {
		t.Errorf("the claim's pod refused its device: %v", err)
	}
	_, err = admit(a, p, pod("p"), []specs.Device{byName["2"]}, 0, policy.Choice{}, nil, c.UID)
	testutil.ErrorSays(t, err, "pod ns/p would hold 3 devices, more than policy.maxDevicesPerPod (2)")
	a.Release("id-p")

	if _, got, _ := a.Claim(c.UID, []string{"other"}); len(got) != 1 || got[0].Name != "nvidia.com/gpu=1" {
		t.Errorf("request other of the claim: %v, want gpu 1", got)
	}
	if _, got, _ := a.Claim(c.UID, nil); len(got) != 2 {
		t.Errorf("the whole claim: %v, want both", got)
	}
	if n := a.Count(); n != 2 {
		t.Errorf("Count %d, want the claim's 2", n)
	}
	var withheld, offered []string
	for _, n := range []string{"0", "1", "2", "3"} {
		d := byName[n]
		if a.Room(p, d, policy.DevicePlugin, policy.Choice{}) == 0 {
			withheld = append(withheld, d.Name)
		}
		if a.Room(p, d, policy.DRA, policy.Choice{}) == 1 {
			offered = append(offered, d.Name)
		}
	}
	if !slices.Equal(withheld, []string{"nvidia.com/gpu=0", "nvidia.com/gpu=1"}) {
		t.Errorf("withheld from the device plugin %v, want the claim's", withheld)
	}
	if len(offered) != 4 {
		t.Errorf("room through DRA on %v, want every GPU (the DRA driver keeps offering a claim's devices)", offered)
	}
	// A restart of the pods' record keeps the claims.
	if err := a.Restore(p, nil); err != nil {
		t.Fatal(err)
	}
	if released := a.ReleaseClaim(c.UID); !slices.Equal(released, []string{"nvidia.com/gpu=0", "nvidia.com/gpu=1"}) {
		t.Errorf("released %v", released)
	}
	if a.ReleaseClaim(c.UID) != nil {
		t.Error("a claim released twice released something")
	}
	if _, err := admit(a, p, pod("x"), []specs.Device{byName["0"]}, 0, policy.Choice{}, nil); err != nil {
		t.Errorf("after the claim was released: %v", err)
	}
	if _, _, err := a.Claim(c.UID, nil); !errors.Is(err, policy.ErrNotPrepared) {
		t.Errorf("a released claim: %v", err)
	}
}

// TestRestoreClaims: claims kept across a restart are held again, and
// what conflicts (a pod holding one of their devices) is reported and
// stays held.
func TestRestoreClaims(t *testing.T) {
	_, byName := gpus()
	p := policy.New(config.Policy{Namespaces: []string{"*"}, Devices: []string{"nvidia.com/gpu=[0-2]"}})
	a := policy.NewAllocations()
	if err := a.Restore(p, []policy.Holding{{Pod: pod("a"), Counted: []specs.Device{byName["0"]}}}); err != nil {
		t.Fatal(err)
	}
	c, devs := claimOf("c", byName, "0", "3")
	err := a.RestoreClaims(p, []policy.ClaimHolding{{Claim: c, Devices: devs}})
	testutil.ErrorSays(t, err, `claim ns/c of pod ns/p ("nvidia.com/gpu=0") and pod ns/a ("nvidia.com/gpu=0") both hold /dev/nvidia0`,
		`claim ns/c of pod ns/p holds "nvidia.com/gpu=3", which policy.devices does not allow`)
	if !errors.Is(err, policy.ErrRestoreConflict) {
		t.Errorf("%v does not wrap ErrRestoreConflict", err)
	}
	got := a.Claims()
	if len(got) != 1 || got[0].Claim.UID != c.UID || len(got[0].Devices) != 2 {
		t.Errorf("claims %+v, want the restored one", got)
	}
	if s := c.String(); s != "claim ns/c of pod ns/p" {
		t.Errorf("String %q", s)
	}
	if s := (policy.Claim{Namespace: "ns", Name: "c", Pods: []policy.PodName{{Namespace: "ns", Name: "a"}, {Namespace: "ns", Name: "b"}}}).String(); s != "claim ns/c of pods ns/a, ns/b" {
		t.Errorf("String %q", s)
	}
	if s := (policy.Claim{Namespace: "ns", Name: "c"}).String(); !strings.HasSuffix(s, "ns/c") {
		t.Errorf("String %q", s)
	}
}

// holdBefore has pod "a" hold GPU 0 by name, pod "b" GPU 1 for a count
// and claim "old" GPU 2.
func holdBefore(t *testing.T, a *policy.Allocations, byName map[string]specs.Device) {
	t.Helper()
	any := policy.New(config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices})
	if _, err := admit(a, any, pod("a"), []specs.Device{byName["0"]}, 0, policy.Choice{}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := admit(a, any, pod("b"), nil, 1, policy.Choice{Candidates: []specs.Device{byName["1"]}}, nil); err != nil {
		t.Fatal(err)
	}
	old := policy.Claim{UID: "uid-old", Namespace: "ns", Name: "old", Pods: []policy.PodName{{Namespace: "ns", Name: "p"}}}
	if _, err := a.AdmitClaim(any, old, claimAsked([]policy.ClaimDevice{{Device: byName["2"]}}), policy.Choice{}); err != nil {
		t.Fatal(err)
	}
}

// TestMaxDevicesAcrossClaimsAndDoors: policy.maxDevicesPerPod counts what
// a pod holds through every door and every claim reserved for it: two
// one-GPU claims of one pod exceed a limit of one when the second is
// prepared, and a pod holding a GPU by name may not have a claim
// prepared that would make two; a container that uses a claim without
// asking for anything is refused when the pod's claims and holdings
// exceed it (the limit was lowered by a reload).
func TestMaxDevicesAcrossClaimsAndDoors(t *testing.T) {
	cands, byName := gpus()
	one := policy.New(config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices, MaxDevicesPerPod: 1})
	two := policy.New(config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices, MaxDevicesPerPod: 2})

	a := policy.NewAllocations()
	first, firstDevs := claimOf("first", byName, "0")
	if _, err := a.AdmitClaim(one, first, claimAsked(firstDevs), policy.Choice{}); err != nil {
		t.Fatal(err)
	}
	second, secondDevs := claimOf("second", byName, "1")
	_, err := a.AdmitClaim(one, second, claimAsked(secondDevs), policy.Choice{})
	testutil.ErrorSays(t, err, "claim ns/second of pod ns/p", "pod ns/p would hold 2 devices, more than policy.maxDevicesPerPod (1)")
	if _, _, err := a.Claim(second.UID, nil); !errors.Is(err, policy.ErrNotPrepared) {
		t.Errorf("a refused claim is held: %v", err)
	}
	// Under a limit of two it is prepared; lowered to one, a container
	// using just the first claim is refused: the pod holds two.
	if _, err := a.AdmitClaim(two, second, claimAsked(secondDevs), policy.Choice{}); err != nil {
		t.Fatal(err)
	}
	// Planned only: a container that holds nothing new is not committed.
	_, err = a.Plan(one, policy.Want{Pod: pod("p"), Choice: policy.Choice{Candidates: cands}, Claims: []string{first.UID}})
	testutil.ErrorSays(t, err, "pod ns/p would hold 2 devices, more than policy.maxDevicesPerPod (1)")

	// A pod holding a GPU by name: a claim for it that makes two is
	// refused.
	b := policy.NewAllocations()
	if _, err := admit(b, one, pod("p"), []specs.Device{byName["2"]}, 0, policy.Choice{}, nil); err != nil {
		t.Fatal(err)
	}
	_, err = b.AdmitClaim(one, first, claimAsked(firstDevs), policy.Choice{})
	testutil.ErrorSays(t, err, "pod ns/p would hold 2 devices, more than policy.maxDevicesPerPod (1)")
}

// TestClaimPreparedAgain: a claim prepared again with other devices (its
// allocation changed hands) has them judged as a new claim's would be:
// refused, it keeps what it held; admitted, they replace what it held,
// which is free again; undone (the record could not keep it), it holds
// what it held before.
func TestClaimPreparedAgain(t *testing.T) {
	_, byName := gpus()
	any := policy.New(config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices})
	a := policy.NewAllocations()
	holdBefore(t, a, byName) // pod a holds GPU 0, claim old GPU 2
	old, _ := claimOf("old", byName)
	holds := func(want string) {
		t.Helper()
		_, held, err := a.Claim(old.UID, nil)
		if err != nil || len(held) != 1 || held[0].Name != want {
			t.Errorf("claim old holds %v, %v; want %s", held, err, want)
		}
	}
	_, devs := claimOf("old", byName, "0")
	undo, err := a.AdmitClaim(any, old, claimAsked(devs), policy.Choice{})
	testutil.ErrorSays(t, err, `device "nvidia.com/gpu=0" is held by pod ns/a`)
	if undo != nil {
		t.Error("a refusal returned an undo")
	}
	holds("nvidia.com/gpu=2")

	_, devs = claimOf("old", byName, "3")
	undo, err = a.AdmitClaim(any, old, claimAsked(devs), policy.Choice{})
	if err != nil || undo == nil {
		t.Fatalf("prepared again on a free GPU: %v (undo %v)", err, undo != nil)
	}
	holds("nvidia.com/gpu=3")
	if _, err := admit(a, any, pod("x"), []specs.Device{byName["2"]}, 0, policy.Choice{}, nil); err != nil {
		t.Errorf("the GPU it held before: %v, want it free", err)
	}
	a.Release("id-x")
	undo()
	holds("nvidia.com/gpu=2")
	if undo, err := a.AdmitClaim(any, old, claimAsked([]policy.ClaimDevice{{Device: byName["2"]}}), policy.Choice{}); err != nil || undo != nil {
		t.Errorf("prepared again as it is: %v, undo %v; want nothing to record", err, undo != nil)
	}
}

// TestClaimMayBeUsedBy: without the API server, a claim may be used by
// any pod of its namespace (reserved for it since), never by a pod of
// another namespace.
func TestClaimMayBeUsedBy(t *testing.T) {
	c := policy.Claim{UID: "u", Namespace: "ns", Name: "c", Pods: []policy.PodName{{Namespace: "ns", Name: "p"}}}
	for ns, want := range map[string]bool{"ns": true, "other": false, "nsx": false} {
		if got := c.MayBeUsedBy(ns); got != want {
			t.Errorf("a pod of %s: %v, want %v", ns, got, want)
		}
	}
}

// TestClaimDenials: a claim's device that a rule refuses is refused by
// that rule alone (not also as held); one a pod holds is refused saying
// why it is not shared: a count grant, policy.exclusive, or, with
// exclusive off, that a claim's devices are its own.
func TestClaimDenials(t *testing.T) {
	_, byName := gpus()
	sick := func(d specs.Device) error {
		if d.Name == "nvidia.com/gpu=1" {
			return errors.New("Xid 79")
		}
		return nil
	}
	for _, tc := range []struct {
		name      string
		exclusive bool
		holding   policy.Holding
		gpu       string
		rule      string
		want      string
		not       string
	}{
		{"not allowed and held", false, policy.Holding{Pod: pod("a"), Counted: []specs.Device{byName["3"]}}, "3", policy.RuleDevices, "matches none of policy.devices", "held by"},
		{"unhealthy and held", false, policy.Holding{Pod: pod("a"), Counted: []specs.Device{byName["1"]}}, "1", policy.RuleUnhealthy, "Xid 79", "held by"},
		{"counted by a pod", true, policy.Holding{Pod: pod("a"), Counted: []specs.Device{byName["0"]}}, "0", policy.RuleExclusive, "which got it for a count request; it is free again when pod ns/a is removed", "policy.exclusive"},
		{"named by a pod, exclusive", true, policy.Holding{Pod: pod("a"), Named: []specs.Device{byName["0"]}}, "0", policy.RuleExclusive, "and policy.exclusive is true; it is free again when pod ns/a is removed", "count request"},
		{"named by a pod, not exclusive", false, policy.Holding{Pod: pod("a"), Named: []specs.Device{byName["GPU-0"]}}, "0", policy.RuleExclusive, `held by pod ns/a (as "nvidia.com/gpu=GPU-0"); a claim's devices are its own, never one a pod holds`, "count request"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := policy.New(config.Policy{Namespaces: []string{"*"}, Devices: []string{"nvidia.com/gpu=[0-2]", "nvidia.com/gpu=GPU-*"}, Exclusive: tc.exclusive})
			a := policy.NewAllocations()
			// A device policy.devices does not allow is reported, and held.
			if err := a.Restore(p, []policy.Holding{tc.holding}); err != nil && !errors.Is(err, policy.ErrRestoreConflict) {
				t.Fatal(err)
			}
			c, devs := claimOf("c", byName, tc.gpu)
			_, err := a.AdmitClaim(p, c, claimAsked(devs), policy.Choice{Unhealthy: sick})
			wantDenied(t, err, tc.rule, tc.want)
			if strings.Contains(err.Error(), tc.not) {
				t.Errorf("%v says %q", err, tc.not)
			}
		})
	}
}

// TestRestoreClaimsJudged: restored claims are judged as the pool
// judges them: a claim's device is its own against a pod naming it with
// exclusive off and against another claim, and shared within replicas
// with the pods and claims of a shared GPU.
func TestRestoreClaimsJudged(t *testing.T) {
	_, byName := gpus()
	c, devs := claimOf("c", byName, "0")
	d, devsD := claimOf("d", byName, "GPU-0")
	for _, tc := range []struct {
		name   string
		policy config.Policy
		claims []policy.ClaimHolding
		want   string // "" for no conflict
	}{
		{"a pod names the claim's GPU, not exclusive", config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices}, []policy.ClaimHolding{{Claim: c, Devices: devs}},
			`claim ns/c of pod ns/p ("nvidia.com/gpu=0") and pod ns/a ("nvidia.com/gpu=GPU-0") both hold /dev/nvidia0`},
		{"a GPU shared two ways, a claim and a pod", shared(2, "nvidia.com/gpu=0"), []policy.ClaimHolding{{Claim: c, Devices: devs}}, ""},
		{"a GPU shared three ways, two claims and a pod", shared(3, "nvidia.com/gpu=0"), []policy.ClaimHolding{{Claim: c, Devices: devs}, {Claim: d, Devices: devsD}}, ""},
		{"two claims of one GPU, not shared", config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices}, []policy.ClaimHolding{{Claim: c, Devices: devs}, {Claim: d, Devices: devsD}},
			`claim ns/c of pod ns/p ("nvidia.com/gpu=0") and claim ns/d of pod ns/p ("nvidia.com/gpu=GPU-0") both hold /dev/nvidia0`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := gpuPolicy(tc.policy)
			a := policy.NewAllocations()
			if err := a.Restore(p, []policy.Holding{{Pod: pod("a"), Named: []specs.Device{byName["GPU-0"]}}}); err != nil {
				t.Fatal(err)
			}
			err := a.RestoreClaims(p, tc.claims)
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			testutil.ErrorSays(t, err, tc.want)
		})
	}
}

// TestReleaseUnused: a claim the API server no longer has is released
// unless a pod the pool tracks uses it (its containers used it, or it was
// reserved for the pod and the pod holds something): its devices then
// stay held, and the error names the pods.
func TestReleaseUnused(t *testing.T) {
	_, byName := gpus()
	p := policy.New(config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices})
	tests := []struct {
		name string
		// use admits the pods of the row, given the claim's UID.
		use     func(t *testing.T, a *policy.Allocations, uid string)
		wantErr []string // empty: released
	}{
		{name: "no pod uses it", use: func(*testing.T, *policy.Allocations, string) {}},
		{name: "its pod's container uses it", wantErr: []string{"claim ns/c of pod ns/p still used by the containers of pod ns/p"},
			use: func(t *testing.T, a *policy.Allocations, uid string) {
				if _, err := admit(a, p, pod("p"), []specs.Device{byName["0"]}, 0, policy.Choice{}, nil, uid); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "the pod it was reserved for holds a device of another door", wantErr: []string{"still used by the containers of pod ns/p"},
			use: func(t *testing.T, a *policy.Allocations, _ string) {
				if _, err := admit(a, p, pod("p"), []specs.Device{byName["2"]}, 0, policy.Choice{}, nil); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "pods it was shared with later", wantErr: []string{"still used by the containers of pod ns/q, ns/r"},
			use: func(t *testing.T, a *policy.Allocations, uid string) {
				for _, name := range []string{"r", "q"} {
					if _, err := admit(a, p, pod(name), []specs.Device{byName["0"]}, 0, policy.Choice{}, nil, uid); err != nil {
						t.Fatal(err)
					}
				}
			}},
		{name: "its pod has ended", use: func(t *testing.T, a *policy.Allocations, uid string) {
			if _, err := admit(a, p, pod("p"), []specs.Device{byName["0"]}, 0, policy.Choice{}, nil, uid); err != nil {
				t.Fatal(err)
			}
			a.Release("id-p")
		}},
		{name: "another pod holds other devices", use: func(t *testing.T, a *policy.Allocations, _ string) {
			if _, err := admit(a, p, pod("x"), []specs.Device{byName["2"]}, 0, policy.Choice{}, nil); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := policy.NewAllocations()
			c, devs := claimOf("c", byName, "0", "1")
			if _, err := a.AdmitClaim(p, c, claimAsked(devs), policy.Choice{}); err != nil {
				t.Fatal(err)
			}
			tt.use(t, a, c.UID)
			released, err := a.ReleaseUnused(c.UID)
			_, _, held := a.Claim(c.UID, nil)
			if len(tt.wantErr) > 0 {
				testutil.ErrorSays(t, err, tt.wantErr...)
				if !errors.Is(err, policy.ErrClaimInUse) || released != nil || held != nil {
					t.Errorf("kept claim: released %v, error %v, still held: %v; want ErrClaimInUse and held", released, err, held)
				}
				return
			}
			if err != nil || !slices.Equal(released, []string{"nvidia.com/gpu=0", "nvidia.com/gpu=1"}) || !errors.Is(held, policy.ErrNotPrepared) {
				t.Errorf("released %v, error %v, then %v; want both GPUs released", released, err, held)
			}
		})
	}
	if released, err := policy.NewAllocations().ReleaseUnused("uid-none"); released != nil || err != nil {
		t.Errorf("a claim not prepared: released %v, %v", released, err)
	}
}

// TestPodNameText: a pod's name reads and writes as namespace/name (a
// claim's pods in the record and across the DRA link); what is not that
// is refused, naming it.
func TestPodNameText(t *testing.T) {
	for _, tc := range []struct {
		text string
		want policy.PodName
		err  bool
	}{
		{text: "ns/p", want: policy.PodName{Namespace: "ns", Name: "p"}},
		{text: "p", err: true},
		{text: "/p", err: true},
		{text: "ns/", err: true},
		{text: "", err: true},
	} {
		var got policy.PodName
		err := got.UnmarshalText([]byte(tc.text))
		if tc.err {
			if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%q", tc.text)) {
				t.Errorf("%q: got %v, %v; want an error naming it", tc.text, got, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%q: got %v, %v; want %v", tc.text, got, err, tc.want)
		}
		if b, _ := got.MarshalText(); string(b) != tc.text {
			t.Errorf("%v written as %q, want %q", got, b, tc.text)
		}
	}
	var c policy.Claim
	if err := json.Unmarshal([]byte(`{"UID":"u","Pods":["ns/a","ns/b"]}`), &c); err != nil || len(c.Pods) != 2 || c.Pods[1] != (policy.PodName{Namespace: "ns", Name: "b"}) {
		t.Errorf("a claim's pods from JSON: %+v, %v", c, err)
	}
}

// TestClaimMemoryAsked: a claim that asks for an amount of a device's
// memory is refused where time-slicing shares the device, which cannot
// bound it, unless the entry makes memory a scheduling quota; where MPS
// shares it (which bounds each client's memory) it is admitted.
func TestClaimMemoryAsked(t *testing.T) {
	_, byName := gpus()
	cgroupV1 := errors.New("/sys/fs/cgroup is not cgroup v2")
	for _, tc := range []struct {
		name     string
		strategy config.Strategy
		quota    bool
		asked    bool
		cannot   error // why the driver cannot bound memory; nil: it can
		mode     config.MemoryLimits
		rule     string // "": admitted
		want     []string
	}{
		{name: "time-slicing, the driver bounds it", strategy: config.StrategyTimeSlicing, asked: true},
		{name: "time-slicing, no memory asked, the driver bounds it", strategy: config.StrategyTimeSlicing},
		{name: "time-slicing, the driver cannot", strategy: config.StrategyTimeSlicing, asked: true, cannot: cgroupV1,
			rule: policy.RuleMemoryLimits, want: []string{"policy.sharing[0] (replicas 4, timeSlicing) counts each holder's memory, which the driver cannot bound here: /sys/fs/cgroup is not cgroup v2", "policy.memoryLimits: agreement"}},
		{name: "time-slicing, no memory asked, the driver cannot", strategy: config.StrategyTimeSlicing, cannot: cgroupV1,
			rule: policy.RuleMemoryLimits, want: []string{"which the driver cannot bound here"}},
		{name: "time-slicing, the driver cannot, by agreement", strategy: config.StrategyTimeSlicing, asked: true, cannot: cgroupV1, mode: config.MemoryLimitsAgreement,
			rule: policy.RuleSharing, want: []string{"the claim asks for an amount of memory, which policy.sharing[0] (replicas 4, timeSlicing) cannot bound here (/sys/fs/cgroup is not cgroup v2)", "memoryQuota: true"}},
		{name: "time-slicing, no memory asked, the driver cannot, by agreement", strategy: config.StrategyTimeSlicing, cannot: cgroupV1, mode: config.MemoryLimitsAgreement},
		{name: "time-slicing, the driver cannot, memory a quota", strategy: config.StrategyTimeSlicing, quota: true, asked: true, cannot: cgroupV1},
		{name: "MPS, the driver cannot", strategy: config.StrategyMPS, asked: true, cannot: cgroupV1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := gpuPolicy(config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices, MemoryLimits: cmp.Or(tc.mode, config.MemoryLimitsEnforced),
				Sharing: []config.Sharing{{Devices: []string{"nvidia.com/gpu=0"}, Replicas: 4, Strategy: tc.strategy, Memory: "80Gi", MemoryQuota: tc.quota}}})
			p = p.WithBounding(func(specs.Device) error { return tc.cannot })
			c, devs := claimOf("c", byName, "0")
			devs[0].Use, devs[0].MemoryAsked = policy.Use{Shares: 1, Memory: 8 << 30}, tc.asked
			_, err := policy.NewAllocations().AdmitClaim(p, c, claimAsked(devs), policy.Choice{})
			if tc.rule == "" {
				if err != nil {
					t.Errorf("refused: %v", err)
				}
				return
			}
			wantDenied(t, err, tc.rule, append([]string{"claim ns/c"}, tc.want...)...)
		})
	}
}
