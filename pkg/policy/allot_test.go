package policy_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// TestAllotKeepsKubeletsDevices: a device kubelet allocates through the
// device plugin (Allot, from its Allocate) is kubelet's before its
// pod-resources API lists it: no count request, claim or request by name
// under policy.exclusive takes it, a count plan made before is stale,
// kubelet's own request has it, and after AllotFor it is free again. A
// device another door took since kubelet was told it is refused, with the
// admission's reason, and nothing of that call is kept.
func TestAllotKeepsKubeletsDevices(t *testing.T) {
	candidates, byName := gpus()
	strict := policy.New(config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices, Exclusive: true})
	ch := policy.Choice{Candidates: candidates}
	now := time.Unix(1000, 0)
	fresh := func(t *testing.T) *policy.Allocations {
		t.Helper()
		a := policy.NewAllocations()
		policy.SetClock(a, func() time.Time { return now })
		if err := a.Allot(strict, []specs.Device{byName["0"]}, policy.Choice{}); err != nil {
			t.Fatal(err)
		}
		return a
	}
	kubelets := "allocated by kubelet to a pod it is admitting (through the device plugin), which holds it for as long as it lives"
	for _, tc := range []struct {
		name        string
		later       time.Duration
		named       []specs.Device
		fromKubelet []string
		count       int
		wantCounted []string
		wantErr     []string
	}{
		{name: "count passes over it", count: 1, wantCounted: []string{byName["1"].Name}},
		{name: "by UUID, exclusive", named: []specs.Device{byName["GPU-0"]}, wantErr: []string{`device "nvidia.com/gpu=GPU-0"`, "allocated by kubelet to a pod it is admitting"}},
		{name: "kubelet's own request", named: []specs.Device{byName["0"]}, fromKubelet: []string{byName["0"].Name}},
		{name: "count, once AllotFor passed", later: policy.AllotFor, count: 1, wantCounted: []string{byName["0"].Name}},
		{name: "by name, once AllotFor passed", later: policy.AllotFor, named: []specs.Device{byName["0"]}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := fresh(t)
			policy.SetClock(a, func() time.Time { return now.Add(tc.later) })
			g, err := admit(a, strict, pod("a"), tc.named, tc.count, ch, tc.fromKubelet)
			if len(tc.wantErr) > 0 {
				testutil.ErrorSays(t, err, tc.wantErr...)
				return
			}
			if err != nil || !slices.Equal(specs.Names(g.Counted), tc.wantCounted) {
				t.Fatalf("got %v, %v; want counted %v", specs.Names(g.Counted), err, tc.wantCounted)
			}
			passed := slices.Contains(g.Considered.Passed, policy.Passed{Device: byName["0"].Name, Reason: kubelets})
			if tc.count > 0 && passed != (tc.later == 0) {
				t.Errorf("passed over %v; GPU 0 as kubelet's: %v, want %v", g.Considered.Passed, passed, tc.later == 0)
			}
		})
	}
	t.Run("held by kubelet's pod, then released", func(t *testing.T) {
		a := fresh(t)
		kube := pod("kube")
		if _, err := admit(a, strict, kube, []specs.Device{byName["0"]}, 0, ch, []string{byName["0"].Name}); err != nil {
			t.Fatal(err)
		}
		a.Release(kube.ID)
		g, err := admit(a, strict, pod("a"), nil, 1, ch, nil)
		if err != nil || specs.Names(g.Counted)[0] != byName["0"].Name {
			t.Errorf("count once kubelet's pod is gone: %v, %v; want GPU 0 at once", specs.Names(g.Counted), err)
		}
	})
	t.Run("a claim", func(t *testing.T) {
		_, err := fresh(t).AdmitClaim(strict, policy.Claim{UID: "u", Namespace: "ns", Name: "c"}, asked(byName["0"]), policy.Choice{})
		testutil.ErrorSays(t, err, "claim ns/c", "allocated by kubelet to a pod it is admitting")
	})
	t.Run("offers", func(t *testing.T) {
		a := fresh(t)
		if dra, dp := a.Room(strict, byName["0"], policy.DRA, policy.Choice{}), a.Room(strict, byName["0"], policy.DevicePlugin, policy.Choice{}); dra != 0 || dp != 1 {
			t.Errorf("room for DRA %d, for the device plugin %d; want 0 and 1", dra, dp)
		}
	})
	t.Run("a count plan made before", func(t *testing.T) {
		a := policy.NewAllocations()
		pl, err := a.Plan(strict, policy.Want{Pod: pod("a"), Count: 1, Choice: ch})
		if err != nil || specs.Names(pl.Counted())[0] != byName["0"].Name {
			t.Fatalf("planned %v, %v; want GPU 0", specs.Names(pl.Counted()), err)
		}
		if err := a.Allot(strict, []specs.Device{byName["0"]}, policy.Choice{}); err != nil {
			t.Fatal(err)
		}
		if _, err := a.Commit(strict, pl); !errors.Is(err, policy.ErrStale) {
			t.Fatalf("commit after kubelet allotted its choice: %v, want ErrStale", err)
		}
		g, err := admit(a, strict, pod("a"), nil, 1, ch, nil)
		if err != nil || specs.Names(g.Counted)[0] != byName["1"].Name {
			t.Fatalf("planned again: %v, %v; want GPU 1", specs.Names(g.Counted), err)
		}
	})
	t.Run("a shared device: judged, not kept", func(t *testing.T) {
		sharing := gpuPolicy(shared(2, "nvidia.com/gpu=0"))
		a := policy.NewAllocations()
		if err := a.Allot(sharing, []specs.Device{byName["0"]}, policy.Choice{}); err != nil {
			t.Fatal(err)
		}
		if _, err := admit(a, sharing, pod("b"), []specs.Device{byName["0"]}, 0, ch, nil); err != nil {
			t.Errorf("a sharer by name after kubelet allotted a replica: %v", err)
		}
		if err := a.Allot(sharing, []specs.Device{byName["0"]}, policy.Choice{}); err != nil {
			t.Errorf("kubelet's replica beside one sharer: %v", err)
		}
		if _, err := admit(a, sharing, pod("c"), []specs.Device{byName["0"]}, 0, ch, nil); err != nil {
			t.Fatal(err)
		}
		testutil.ErrorSays(t, a.Allot(sharing, []specs.Device{byName["0"]}, policy.Choice{}), `device "nvidia.com/gpu=0"`, "used by 2 already")
	})
	t.Run("taken by another door since", func(t *testing.T) {
		a := policy.NewAllocations()
		if _, err := admit(a, strict, pod("counted"), nil, 1, ch, nil); err != nil {
			t.Fatal(err)
		}
		err := a.Allot(strict, []specs.Device{byName["2"], byName["GPU-0"]}, policy.Choice{})
		testutil.ErrorSays(t, err, `"nvidia.com/gpu=GPU-0"`, "ns/counted")
		if !errors.Is(err, policy.ErrDenied) {
			t.Errorf("%v: not ErrDenied", err)
		}
		// Nothing of the refused call is kept: GPU 2 is free for a count.
		g, err := admit(a, strict, pod("b"), nil, 2, ch, nil)
		if err != nil || !slices.Equal(specs.Names(g.Counted), []string{byName["1"].Name, byName["2"].Name}) {
			t.Fatalf("count of 2 after: %v, %v; want GPUs 1 and 2", specs.Names(g.Counted), err)
		}
	})
}
