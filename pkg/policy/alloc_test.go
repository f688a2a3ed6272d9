package policy_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
	"github.com/nri-gpu/nri-gpu/pkg/specs/nvidia"
)

// gpus returns four GPUs, each by index and by UUID, the way Candidates
// lists them, and an "all" device covering them.
func gpus() (candidates []specs.Device, byName map[string]specs.Device) {
	byName = map[string]specs.Device{}
	var allNodes []string
	for i := 0; i < 4; i++ {
		node := fmt.Sprintf("/dev/nvidia%d", i)
		allNodes = append(allNodes, node)
		for _, n := range []string{fmt.Sprint(i), fmt.Sprintf("GPU-%d", i)} {
			d := specs.Device{Name: "nvidia.com/gpu=" + n, Nodes: []string{node}}
			candidates = append(candidates, d)
			byName[n] = d
		}
	}
	byName["all"] = specs.Device{Name: "nvidia.com/gpu=all", Nodes: allNodes}
	return candidates, byName
}

func pod(name string) policy.Pod { return policy.Pod{ID: "id-" + name, Namespace: "ns", Name: name} }

// step is one admission or release in a scenario.
type step struct {
	pod     string
	named   []string
	count   int
	release bool
	want    []string // names granted
	rule    string   // the rule that denies
	wantErr []string
}

func TestAdmit(t *testing.T) {
	tests := []struct {
		name   string
		policy config.Policy
		steps  []step
	}{
		{
			name:   "exclusive: another pod is denied, naming the holder, until it is removed",
			policy: config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices, Exclusive: true},
			steps: []step{
				{pod: "a", named: []string{"0"}, want: []string{"0"}},
				{pod: "a", named: []string{"0"}, want: []string{"0"}},
				{pod: "b", named: []string{"GPU-0"}, rule: policy.RuleExclusive, wantErr: []string{`device "nvidia.com/gpu=GPU-0" is held by pod ns/a (as "nvidia.com/gpu=0")`, "policy.exclusive is true", "when pod ns/a is removed"}},
				{pod: "b", named: []string{"1"}, want: []string{"1"}},
				{pod: "a", release: true},
				{pod: "b", named: []string{"GPU-0"}, want: []string{"GPU-0"}},
			},
		},
		{
			name:   "exclusive: all overlaps every GPU",
			policy: config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices, Exclusive: true, AllowAll: true},
			steps: []step{
				{pod: "a", named: []string{"all"}, want: []string{"all"}},
				{pod: "b", named: []string{"3"}, rule: policy.RuleExclusive, wantErr: []string{"held by pod ns/a"}},
			},
		},
		{
			name:   "not exclusive: named devices are shared",
			policy: config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices},
			steps: []step{
				{pod: "a", named: []string{"0"}, want: []string{"0"}},
				{pod: "b", named: []string{"0"}, want: []string{"0"}},
			},
		},
		{
			name:   "count: distinct devices, the same ones for the pod, exhaustion, release",
			policy: config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices},
			steps: []step{
				{pod: "a", count: 2, want: []string{"0", "1"}},
				{pod: "b", count: 2, want: []string{"2", "3"}},
				{pod: "a", count: 2, want: []string{"0", "1"}},
				{pod: "c", count: 1, rule: policy.RuleCount, wantErr: []string{`pod annotation "gpu-count.nri-gpu.io"`, "asks for 1 nvidia.com/gpu devices, but 0 are free and 4 held by other pods"}},
				{pod: "a", release: true},
				{pod: "c", count: 3, rule: policy.RuleCount, wantErr: []string{"asks for 3", "2 are free and 2 held"}},
				{pod: "c", count: 1, want: []string{"0"}},
			},
		},
		{
			name:   "count skips devices held by name, and counted devices are never shared",
			policy: config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices},
			steps: []step{
				{pod: "a", named: []string{"GPU-0"}, want: []string{"GPU-0"}},
				{pod: "b", count: 1, want: []string{"1"}},
				{pod: "c", named: []string{"1"}, rule: policy.RuleExclusive, wantErr: []string{`device "nvidia.com/gpu=1" is held by pod ns/b`, "count request"}},
			},
		},
		{
			name:   "count only gives devices policy.devices allows",
			policy: config.Policy{Namespaces: []string{"*"}, Devices: []string{"nvidia.com/gpu=2", "nvidia.com/gpu=3"}},
			steps: []step{
				{pod: "a", count: 2, want: []string{"2", "3"}},
				{pod: "b", count: 1, rule: policy.RuleCount, wantErr: []string{"0 are free and 2 held by other pods (of 2 allowed by policy.devices)"}},
			},
		},
		{
			name:   "maxDevicesPerPod counts devices, not names",
			policy: config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices, MaxDevicesPerPod: 2, AllowAll: true},
			steps: []step{
				{pod: "a", named: []string{"0", "GPU-0", "1"}, want: []string{"0", "GPU-0", "1"}},
				{pod: "a", named: []string{"2"}, rule: policy.RuleMax, wantErr: []string{"pod ns/a would hold 3 devices, more than policy.maxDevicesPerPod (2)"}},
				{pod: "b", named: []string{"all"}, rule: policy.RuleMax, wantErr: []string{"would hold 4 devices"}},
				{pod: "a", release: true},
				{pod: "c", count: 3, rule: policy.RuleMax, wantErr: []string{"would hold 3 devices"}},
				{pod: "c", count: 2, want: []string{"0", "1"}},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { runSteps(t, policy.New(tc.policy), policy.NewAllocations(), tc.steps) })
	}
}

// runSteps admits and releases as steps say, on gpus(), and checks each
// grant and denial.
func runSteps(t *testing.T, p *policy.Policy, a *policy.Allocations, steps []step) {
	t.Helper()
	candidates, byName := gpus()
	for i, s := range steps {
		if s.release {
			a.Release(pod(s.pod).ID)
			continue
		}
		var named []specs.Device
		for _, n := range s.named {
			named = append(named, byName[n])
		}
		g, err := admit(a, p, pod(s.pod), named, s.count, policy.Choice{Candidates: candidates}, nil)
		if len(s.wantErr) > 0 {
			wantDenied(t, err, s.rule, s.wantErr...)
			continue
		}
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		var got []string
		for _, d := range g.Devices {
			got = append(got, d.Name)
		}
		var want []string
		for _, n := range s.want {
			want = append(want, byName[n].Name)
		}
		if !slices.Equal(got, want) {
			t.Errorf("step %d: pod %s got %v, want %v", i, s.pod, got, want)
		}
	}
}

func TestRevertAndRestore(t *testing.T) {
	candidates, byName := gpus()
	p := policy.New(config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices, Exclusive: true})
	a := policy.NewAllocations()

	g, err := admit(a, p, pod("a"), []specs.Device{byName["0"]}, 1, policy.Choice{Candidates: candidates}, nil)
	if err != nil {
		t.Fatal(err)
	}
	a.Revert(g)
	if held := a.Held(); len(held) != 0 {
		t.Fatalf("after Revert, held %v", held)
	}

	// A second container of a pod asks for the device its first one has:
	// held once, and reverting the second leaves the first's.
	if _, err := admit(a, p, pod("a"), []specs.Device{byName["2"]}, 0, policy.Choice{Candidates: candidates}, nil); err != nil {
		t.Fatal(err)
	}
	g, err = admit(a, p, pod("a"), []specs.Device{byName["2"]}, 0, policy.Choice{Candidates: candidates}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if n := a.Count(); n != 1 {
		t.Errorf("a device two containers of a pod asked for is counted %d times", n)
	}
	a.Revert(g)
	if _, err := admit(a, p, pod("b"), []specs.Device{byName["2"]}, 0, policy.Choice{Candidates: candidates}, nil); err == nil {
		t.Error("reverting a second container's grant released the first one's device")
	}
	a.Release(pod("a").ID)

	// A restarted plugin learns from the runtime that a holds GPU 0 by
	// name and GPU 1 by count; pod z, gone meanwhile, is not mentioned.
	admit(a, p, pod("z"), []specs.Device{byName["3"]}, 0, policy.Choice{Candidates: candidates}, nil)
	if err := a.Restore(p, []policy.Holding{
		{Pod: pod("a"), Named: []specs.Device{byName["0"]}},
		{Pod: pod("a"), Counted: []specs.Device{byName["1"]}},
	}); err != nil {
		t.Fatalf("restoring holdings that agree: %v", err)
	}
	if _, err := admit(a, p, pod("b"), []specs.Device{byName["GPU-0"]}, 0, policy.Choice{Candidates: candidates}, nil); err == nil {
		t.Error("a restored holding was handed out again")
	}
	g, err = admit(a, p, pod("a"), nil, 1, policy.Choice{Candidates: candidates}, nil)
	if err != nil || len(g.Counted) != 1 || g.Counted[0].Name != byName["1"].Name {
		t.Errorf("the restored pod's count request got %v, %v; want its GPU 1 again", g.Counted, err)
	}
	if _, err := admit(a, p, pod("b"), []specs.Device{byName["3"]}, 0, policy.Choice{Candidates: candidates}, nil); err != nil {
		t.Errorf("a device of a pod gone while the plugin was away is still held: %v", err)
	}
	// What the devices-held metric reports: a holds GPU 0 and GPU 1, b GPU 3.
	if n := a.Count(); n != 3 {
		t.Errorf("Count() = %d, want 3 (held: %v)", n, a.Held())
	}
	a.Release(pod("a").ID)
	if n := a.Count(); n != 1 {
		t.Errorf("after releasing pod a, Count() = %d, want 1", n)
	}
}

// TestRestoreChecks restores holdings that break the policy or each
// other: each problem is reported, and the devices stay held.
func TestRestoreChecks(t *testing.T) {
	candidates, byName := gpus()
	// MIG devices of GPU 0 as gpus() names its node.
	mig0 := func(m int) specs.Device {
		caps := fmt.Sprintf("c 511:%d", m)
		return specs.Device{Name: fmt.Sprintf("nvidia.com/gpu=0:%d", m), Nodes: []string{"/dev/nvidia0", caps}, Parts: []string{caps}}
	}
	for _, tc := range []struct {
		name      string
		policy    config.Policy
		holdings  []policy.Holding
		wantError []string // substrings; none means no error
		reports   int      // how many "both hold" lines, when not 0
	}{{
		name:   "shared by name, not exclusive",
		policy: config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices},
		holdings: []policy.Holding{
			{Pod: pod("a"), Named: []specs.Device{byName["0"]}},
			{Pod: pod("b"), Named: []specs.Device{byName["GPU-0"]}},
		},
	}, {
		name:   "shared by name, exclusive",
		policy: config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices, Exclusive: true},
		holdings: []policy.Holding{
			{Pod: pod("a"), Named: []specs.Device{byName["0"]}},
			{Pod: pod("b"), Named: []specs.Device{byName["GPU-0"]}},
		},
		wantError: []string{`pod ns/a ("nvidia.com/gpu=0") and pod ns/b ("nvidia.com/gpu=GPU-0") both hold /dev/nvidia0`},
	}, {
		name:   "counted by one, named by another",
		policy: config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices},
		holdings: []policy.Holding{
			{Pod: pod("a"), Counted: []specs.Device{byName["1"]}},
			{Pod: pod("b"), Named: []specs.Device{byName["all"]}},
		},
		wantError: []string{"pod ns/a", "ns/b", "both hold /dev/nvidia1"},
	}, {
		name:   "one pod, by name and by count",
		policy: config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices, Exclusive: true},
		holdings: []policy.Holding{
			{Pod: pod("a"), Named: []specs.Device{byName["1"]}, Counted: []specs.Device{byName["GPU-1"]}},
		},
	}, {
		name:   "two MIG devices of one GPU, counted by two pods",
		policy: config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices, Exclusive: true},
		holdings: []policy.Holding{
			{Pod: pod("a"), Counted: []specs.Device{mig0(1)}},
			{Pod: pod("b"), Counted: []specs.Device{mig0(2)}},
		},
	}, {
		name:   "accelerators listing one node in common (Gaudi's InfiniBand node), counted by two pods",
		policy: config.Policy{Namespaces: []string{"*"}, Devices: []string{"intel.com/gaudi=*"}, Exclusive: true},
		holdings: []policy.Holding{
			{Pod: pod("a"), Counted: []specs.Device{{Name: "intel.com/gaudi=device1", Nodes: []string{"path /dev/accel/accel1", "path /dev/accel/accel_controlD1", "path /dev/infiniband/uverbs0"}}}},
			{Pod: pod("b"), Counted: []specs.Device{{Name: "intel.com/gaudi=device2", Nodes: []string{"path /dev/accel/accel2", "path /dev/accel/accel_controlD2", "path /dev/infiniband/uverbs0"}}}},
		},
	}, {
		name:   "all without the MIG device's capability nodes, beside a counted MIG device of its GPU",
		policy: config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices},
		holdings: []policy.Holding{
			{Pod: pod("a"), Counted: []specs.Device{mig0(1)}},
			{Pod: pod("b"), Named: []specs.Device{byName["all"]}},
		},
		wantError: []string{`pod ns/a ("nvidia.com/gpu=0:1") and pod ns/b ("nvidia.com/gpu=all") both hold /dev/nvidia0`},
	}, {
		name:   "all beside a shared GPU's user, not exclusive",
		policy: config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices, Sharing: []config.Sharing{{Devices: []string{"nvidia.com/gpu=GPU-0"}, Replicas: 2, Strategy: config.StrategyTimeSlicing}}},
		holdings: []policy.Holding{
			{Pod: pod("a"), Named: []specs.Device{byName["0"]}},
			{Pod: pod("b"), Named: []specs.Device{byName["all"]}},
		},
		wantError: []string{`pod ns/a ("nvidia.com/gpu=0") and pod ns/b ("nvidia.com/gpu=all") both hold /dev/nvidia0`},
	}, {
		name:   "a GPU shared by its UUID, its users by index and by UUID, exclusive",
		policy: config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices, Exclusive: true, Sharing: []config.Sharing{{Devices: []string{"nvidia.com/gpu=GPU-0"}, Replicas: 2, Strategy: config.StrategyTimeSlicing}}},
		holdings: []policy.Holding{
			{Pod: pod("a"), Named: []specs.Device{byName["0"]}},
			{Pod: pod("b"), Counted: []specs.Device{byName["GPU-0"]}},
		},
	}, {
		name:   "all held by two pods: one report, not one per node",
		policy: config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices},
		holdings: []policy.Holding{
			{Pod: pod("a"), Named: []specs.Device{byName["all"]}},
			{Pod: pod("b"), Counted: []specs.Device{byName["all"]}},
		},
		wantError: []string{`pod ns/a ("nvidia.com/gpu=all") and pod ns/b ("nvidia.com/gpu=all") both hold /dev/nvidia0`},
		reports:   1,
	}, {
		// Restore judges each holding against those before it as the
		// pool judges a new holder: the report does not depend on which
		// pod comes first (it once did: a sole holder visited first was
		// not reported beside a sharer).
		name:   "a shared GPU found held alone, visited before a user sharing it",
		policy: config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices, Sharing: []config.Sharing{{Devices: []string{"nvidia.com/gpu=0"}, Replicas: 2, Strategy: config.StrategyTimeSlicing}}},
		holdings: []policy.Holding{
			{Pod: pod("a"), Named: []specs.Device{byName["0"]}, Sole: []string{"nvidia.com/gpu=0"}},
			{Pod: pod("b"), Named: []specs.Device{byName["GPU-0"]}},
		},
		wantError: []string{`pod ns/a ("nvidia.com/gpu=0") and pod ns/b ("nvidia.com/gpu=GPU-0") both hold /dev/nvidia0`},
		reports:   1,
	}, {
		name:   "a shared GPU found held alone, visited after a user sharing it",
		policy: config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices, Sharing: []config.Sharing{{Devices: []string{"nvidia.com/gpu=0"}, Replicas: 2, Strategy: config.StrategyTimeSlicing}}},
		holdings: []policy.Holding{
			{Pod: pod("a"), Named: []specs.Device{byName["GPU-0"]}},
			{Pod: pod("b"), Named: []specs.Device{byName["0"]}, Sole: []string{"nvidia.com/gpu=0"}},
		},
		wantError: []string{`pod ns/a ("nvidia.com/gpu=GPU-0") and pod ns/b ("nvidia.com/gpu=0") both hold /dev/nvidia0`},
		reports:   1,
	}, {
		name:   "three users of a GPU, one counted: each pair it breaks reported",
		policy: config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices},
		holdings: []policy.Holding{
			{Pod: pod("a"), Named: []specs.Device{byName["0"]}},
			{Pod: pod("b"), Named: []specs.Device{byName["GPU-0"]}},
			{Pod: pod("c"), Counted: []specs.Device{byName["0"]}},
		},
		wantError: []string{`pod ns/a ("nvidia.com/gpu=0") and pod ns/c ("nvidia.com/gpu=0")`, `pod ns/b ("nvidia.com/gpu=GPU-0") and pod ns/c ("nvidia.com/gpu=0")`},
		reports:   2,
	}, {
		name:   "no longer allowed",
		policy: config.Policy{Namespaces: []string{"*"}, Devices: []string{"nvidia.com/gpu=0"}},
		holdings: []policy.Holding{
			{Pod: pod("a"), Named: []specs.Device{byName["0"], byName["2"]}},
		},
		wantError: []string{`pod ns/a holds "nvidia.com/gpu=2", which policy.devices does not allow`},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			p := gpuPolicy(tc.policy)
			a := policy.NewAllocations()
			err := a.Restore(p, tc.holdings)
			if len(tc.wantError) == 0 {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if !errors.Is(err, policy.ErrRestoreConflict) {
				t.Fatalf("error %v, want ErrRestoreConflict", err)
			}
			for _, w := range tc.wantError {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if n := strings.Count(err.Error(), "both hold"); tc.reports > 0 && n != tc.reports {
				t.Errorf("%d conflicts reported, want %d: %v", n, tc.reports, err)
			}
			// Whatever the problem, the restored devices stay held: a
			// pod asking for all four GPUs finds some taken.
			if g, err := admit(a, policy.New(config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices}), pod("new"), nil, 4, policy.Choice{Candidates: candidates}, nil); err == nil {
				t.Errorf("after a conflicting restore, all GPUs were free: %v", g.Counted)
			}
		})
	}
}

// TestCountSkipsUnusable: a count request passes over the devices the
// container cannot have, and says so when too few are left.
func TestCountSkipsUnusable(t *testing.T) {
	candidates, byName := gpus()
	p := policy.New(config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices})
	errHook := errors.New("its spec injects the hook /bin/evil")
	var asked []string
	usable := func(d specs.Device) error {
		asked = append(asked, d.Name)
		if d.Nodes[0] == "/dev/nvidia0" || d.Nodes[0] == "/dev/nvidia1" {
			return errHook
		}
		return nil
	}
	a := policy.NewAllocations()
	g, err := admit(a, p, pod("a"), nil, 1, policy.Choice{Candidates: candidates, Usable: usable}, nil)
	if err != nil || len(g.Counted) != 1 || g.Counted[0].Nodes[0] != "/dev/nvidia2" {
		t.Fatalf("got %v, %v; want GPU 2, the first usable one", g.Counted, err)
	}
	// One name per device is asked about, and none past the one chosen.
	if want := []string{byName["0"].Name, byName["1"].Name, byName["2"].Name}; !slices.Equal(asked, want) {
		t.Errorf("usable asked about %v, want %v", asked, want)
	}
	_, err = admit(a, p, pod("b"), nil, 2, policy.Choice{Candidates: candidates, Usable: usable}, nil)
	testutil.ErrorSays(t, err, "asks for 2", "1 are free and 1 held", "2 more cannot be given to this container, such as: its spec injects the hook /bin/evil")
	if !errors.Is(err, policy.ErrDenied) {
		t.Errorf("error %v does not wrap ErrDenied", err)
	}
}

// TestConcurrentAdmissions has many pods ask at once: no device is ever
// given to two of them.
func TestConcurrentAdmissions(t *testing.T) {
	candidates, byName := gpus()
	p := policy.New(config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices, Exclusive: true})
	a := policy.NewAllocations()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		owner = map[string]string{} // node -> pod
	)
	for i := 0; i < 64; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			pd := pod(fmt.Sprint(i))
			var named []specs.Device
			count := 0
			if i%2 == 0 {
				named = []specs.Device{byName[[]string{"0", "GPU-1", "2", "GPU-3"}[i%4]]}
			} else {
				count = 1
			}
			g, err := admit(a, p, pd, named, count, policy.Choice{Candidates: candidates}, nil)
			if err != nil {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			for _, d := range g.Devices {
				for _, n := range d.Nodes {
					if o, taken := owner[n]; taken && o != pd.Name {
						t.Errorf("%s given to pods %s and %s", n, o, pd.Name)
					}
					owner[n] = pd.Name
				}
			}
		}(i)
	}
	wg.Wait()
	if len(owner) != 4 {
		t.Errorf("%d of 4 GPUs given out, want all", len(owner))
	}
}

// TestWithheld: a device plugin offers kubelet no device a pod holds
// other than through kubelet (the pool's room for it through the device
// plugin's door is 0); what kubelet allocated (under any of its names,
// as a restart finds them) stays kubelet's to account for.
func TestWithheld(t *testing.T) {
	candidates, byName := gpus()
	p := policy.New(config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices, Exclusive: true, AllowAll: true})
	withheld := func(a *policy.Allocations) []string {
		var out []string
		for _, c := range candidates {
			if _, n, _ := strings.Cut(c.Name, "="); !strings.HasPrefix(n, "GPU-") && a.Room(p, c, policy.DevicePlugin, policy.Choice{}) == 0 {
				out = append(out, n)
			}
		}
		return out
	}
	tests := []struct {
		name   string
		admit  func(a *policy.Allocations) error
		revert bool
		want   []string
	}{
		{name: "nothing held", admit: func(*policy.Allocations) error { return nil }},
		{name: "an annotation request", want: []string{"0"}, admit: func(a *policy.Allocations) error {
			_, err := admit(a, p, pod("a"), []specs.Device{byName["0"]}, 0, policy.Choice{Candidates: candidates}, nil)
			return err
		}},
		{name: "a count request", want: []string{"0", "1"}, admit: func(a *policy.Allocations) error {
			_, err := admit(a, p, pod("a"), nil, 2, policy.Choice{Candidates: candidates}, nil)
			return err
		}},
		{name: "kubelet's allocation", admit: func(a *policy.Allocations) error {
			_, err := admit(a, p, pod("a"), []specs.Device{byName["1"]}, 0, policy.Choice{Candidates: candidates}, []string{byName["1"].Name})
			return err
		}},
		{name: "kubelet's and an annotation request in one pod", want: []string{"2"}, admit: func(a *policy.Allocations) error {
			_, err := admit(a, p, pod("a"), []specs.Device{byName["1"], byName["2"]}, 0, policy.Choice{Candidates: candidates}, []string{byName["1"].Name})
			return err
		}},
		{name: "kubelet's, reverted then asked for by annotation", want: []string{"1"}, admit: func(a *policy.Allocations) error {
			g, err := admit(a, p, pod("a"), []specs.Device{byName["1"]}, 0, policy.Choice{Candidates: candidates}, []string{byName["1"].Name})
			if err != nil {
				return err
			}
			a.Revert(g)
			_, err = admit(a, p, pod("a"), []specs.Device{byName["1"]}, 0, policy.Choice{Candidates: candidates}, nil)
			return err
		}},
		{name: "restored: kubelet's by index, found again by UUID", admit: func(a *policy.Allocations) error {
			return a.Restore(p, []policy.Holding{
				{Pod: pod("a"), Named: []specs.Device{byName["3"]}, Kubelet: []string{byName["3"].Name}},
				{Pod: pod("a"), Named: []specs.Device{byName["GPU-3"]}},
			})
		}},
		{name: "restored: all by annotation beside kubelet's", want: []string{"0", "1", "2", "3"}, admit: func(a *policy.Allocations) error {
			return a.Restore(p, []policy.Holding{
				{Pod: pod("a"), Named: []specs.Device{byName["3"], byName["all"]}, Kubelet: []string{byName["3"].Name}},
			})
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := policy.NewAllocations()
			if err := tc.admit(a); err != nil {
				t.Fatal(err)
			}
			if got := withheld(a); !slices.Equal(got, tc.want) {
				t.Errorf("withheld %v, want %v", got, tc.want)
			}
			// What kubelet allocated is kept across a restart.
			b := policy.NewAllocations()
			if err := b.Restore(p, a.Holdings()); err != nil {
				t.Fatal(err)
			}
			if got := withheld(b); !slices.Equal(got, tc.want) {
				t.Errorf("after a restart withheld %v, want %v", got, tc.want)
			}
		})
	}
}

// TestCountChoosesClosest: a count request for more than one device takes
// the free set whose members are the most closely connected; ties, and a
// node whose topology is unknown, keep spec order.
func TestCountChoosesClosest(t *testing.T) {
	gpusN := func(n int) []specs.Device {
		var out []specs.Device
		for i := 0; i < n; i++ {
			out = append(out, specs.Device{Name: fmt.Sprintf("nvidia.com/gpu=%d", i), Nodes: []string{fmt.Sprintf("c 195:%d", i)}})
		}
		return out
	}
	index := func(d specs.Device) int {
		var i int
		fmt.Sscanf(d.Name, "nvidia.com/gpu=%d", &i)
		return i
	}
	// islands: devices in one group are joined by NVLink (100), others
	// meet across the system (10).
	islands := func(size int) func(a, b specs.Device) int {
		return func(a, b specs.Device) int {
			if index(a)/size == index(b)/size {
				return 100
			}
			return 10
		}
	}
	// sockets: even GPUs on one socket (NUMA node: 20), odd on the other.
	sockets := func(a, b specs.Device) int {
		if index(a)%2 == index(b)%2 {
			return 20
		}
		return 10
	}
	tests := []struct {
		name      string
		gpus      int
		held      []int
		count     int
		links     func(a, b specs.Device) int
		want      []int
		wantScore int
	}{
		{name: "two NVLink islands: 4 get one island", gpus: 8, count: 4, links: islands(4), want: []int{0, 1, 2, 3}, wantScore: 600},
		{name: "an island with a GPU held: the other island", gpus: 8, held: []int{1}, count: 4, links: islands(4), want: []int{4, 5, 6, 7}, wantScore: 600},
		{name: "PCIe across two sockets: 2 get a same-socket pair", gpus: 4, held: []int{0}, count: 2, links: sockets, want: []int{1, 3}, wantScore: 20},
		{name: "ties keep spec order", gpus: 4, count: 2, links: sockets, want: []int{0, 2}, wantScore: 20},
		{name: "no topology: spec order", gpus: 4, held: []int{0}, count: 2, want: []int{1, 2}},
		{name: "one device: the first free", gpus: 4, held: []int{0}, count: 1, links: sockets, want: []int{1}},
		{name: "too many sets to score each: grown greedily", gpus: 32, held: []int{0}, count: 8, links: islands(8), want: []int{8, 9, 10, 11, 12, 13, 14, 15}, wantScore: 2800},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			candidates := gpusN(tc.gpus)
			p := policy.New(config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices, Exclusive: true})
			a := policy.NewAllocations()
			for _, h := range tc.held {
				if _, err := admit(a, p, pod(fmt.Sprint("holder", h)), []specs.Device{candidates[h]}, 0, policy.Choice{Candidates: candidates}, nil); err != nil {
					t.Fatal(err)
				}
			}
			g, err := admit(a, p, pod("counted"), nil, tc.count, policy.Choice{Candidates: candidates, Links: tc.links}, nil)
			if err != nil {
				t.Fatal(err)
			}
			var got []int
			for _, d := range g.Counted {
				got = append(got, index(d))
			}
			if !slices.Equal(got, tc.want) || g.Score != tc.wantScore {
				t.Errorf("chose %v (score %d), want %v (score %d)", got, g.Score, tc.want, tc.wantScore)
			}
		})
	}
}

// TestUnhealthyDevices: a count request passes over unhealthy devices and
// says how many it passed over; a request by name for one is denied
// naming the reason and the setting, unless policy.allowUnhealthy.
func TestUnhealthyDevices(t *testing.T) {
	candidates, byName := gpus()
	sick := errors.New("critical Xid error 79")
	unhealthy := func(d specs.Device) error {
		if slices.Equal(d.Nodes, byName["1"].Nodes) {
			return sick
		}
		return nil
	}
	ch := policy.Choice{Candidates: candidates, Unhealthy: unhealthy}
	strict := policy.New(config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices, Exclusive: true})

	a := policy.NewAllocations()
	g, err := admit(a, strict, pod("a"), nil, 2, ch, nil)
	if err != nil || len(g.Counted) != 2 || g.Counted[0].Name != byName["0"].Name || g.Counted[1].Name != byName["2"].Name {
		t.Errorf("count 2 got %v, %v; want GPUs 0 and 2, passing over the unhealthy 1", g.Counted, err)
	}
	if want := []policy.Passed{{Device: byName["1"].Name, Reason: sick.Error()}}; !slices.Equal(g.Considered.Passed, want) {
		t.Errorf("passed over %v, want %v", g.Considered.Passed, want)
	}
	if want := []string{byName["0"].Name, byName["2"].Name, byName["3"].Name}; !slices.Equal(g.Considered.Free, want) {
		t.Errorf("free %v, want %v", g.Considered.Free, want)
	}
	_, err = admit(a, strict, pod("b"), nil, 2, ch, nil)
	testutil.ErrorSays(t, err, "1 are free", "1 more are unhealthy")

	for _, name := range []string{"1", "GPU-1"} {
		_, err = admit(a, strict, pod("c"), []specs.Device{byName[name]}, 0, ch, nil)
		testutil.ErrorSays(t, err, `device "nvidia.com/gpu=`+name+`"`, "critical Xid error 79", "policy.allowUnhealthy")
		var d *policy.Denial
		if !errors.As(err, &d) || d.Rule != policy.RuleUnhealthy {
			t.Errorf("denial %v, want rule %s", err, policy.RuleUnhealthy)
		}
	}
	lenient := policy.New(config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices, Exclusive: true, AllowUnhealthy: true})
	if _, err := admit(a, lenient, pod("c"), []specs.Device{byName["1"]}, 0, ch, nil); err != nil {
		t.Errorf("with policy.allowUnhealthy, a named request for the unhealthy GPU: %v", err)
	}
}

// TestCountPacksMIGDevices: with the topology known, a count request for
// MIG devices takes two of one GPU rather than one of each of two.
// mig is MIG device m of GPU g: its GPU's node and a capability's.
func mig(g, m int) specs.Device {
	caps := fmt.Sprintf("c 511:%d", 10*g+m)
	return specs.Device{Name: fmt.Sprintf("nvidia.com/gpu=%d:%d", g, m), Nodes: []string{nvidia.GPUNode(g), caps}, Parts: []string{caps}}
}

// byIndex is GPUs 0 to n-1, by index only.
func byIndex(n int) []specs.Device {
	var out []specs.Device
	for i := range n {
		out = append(out, specs.Device{Name: fmt.Sprintf("nvidia.com/gpu=%d", i), Nodes: []string{nvidia.GPUNode(i)}})
	}
	return out
}

func TestCountPacksMIGDevices(t *testing.T) {
	gpu := nvidia.GPUNode
	candidates := []specs.Device{mig(0, 1), mig(0, 2), mig(1, 1), mig(1, 2)}
	p := policy.New(config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices, Exclusive: true})
	a := policy.NewAllocations()
	if _, err := admit(a, p, pod("holder"), []specs.Device{candidates[0]}, 0, policy.Choice{Candidates: candidates}, nil); err != nil {
		t.Fatal(err)
	}
	topo := nvidia.Topology{{gpu(0), gpu(1)}: nvidia.ScoreNVLink}
	g, err := admit(a, p, pod("counted"), nil, 2, policy.Choice{Candidates: candidates, Links: topo.Links}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := specs.Names(g.Counted); !slices.Equal(got, []string{"nvidia.com/gpu=1:1", "nvidia.com/gpu=1:2"}) {
		t.Errorf("chose %v, want both MIG devices of GPU 1 (spec order would take 0:2 and 1:1)", got)
	}
}

// TestConcurrentCountRequests: pods asking at once, with the topology
// known, never share a device.
func TestConcurrentCountRequests(t *testing.T) {
	candidates := byIndex(8)
	topo := nvidia.Topology{}
	for i := 0; i < 8; i++ {
		for j := i + 1; j < 8; j++ {
			score := nvidia.ScoreSystem
			if i/4 == j/4 {
				score = nvidia.ScoreNVLink
			}
			topo[[2]string{candidates[i].Nodes[0], candidates[j].Nodes[0]}] = score
		}
	}
	p := policy.New(config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices, Exclusive: true})
	a := policy.NewAllocations()
	var wg sync.WaitGroup
	grants := make([]policy.Grant, 4)
	errs := make([]error, 4)
	for i := range grants {
		wg.Add(1)
		go func() {
			defer wg.Done()
			grants[i], errs[i] = admit(a, p, pod(fmt.Sprint("p", i)), nil, 2, policy.Choice{Candidates: candidates, Links: topo.Links}, nil)
		}()
	}
	wg.Wait()
	seen := map[string]bool{}
	for i, g := range grants {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		for _, d := range g.Counted {
			if seen[d.Name] {
				t.Errorf("%s handed out twice", d.Name)
			}
			seen[d.Name] = true
		}
		if g.Score != nvidia.ScoreNVLink {
			t.Errorf("pod %d got %v (score %d): want a pair within an NVLink island", i, specs.Names(g.Counted), g.Score)
		}
	}
}

// TestOwnHoldings: what a pod holds never keeps its own next container
// from it, by whichever name; a holding restored with a name twice is
// one device.
func TestOwnHoldings(t *testing.T) {
	candidates, byName := gpus()
	p := policy.New(config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices, Exclusive: true})
	a := policy.NewAllocations()
	g, err := admit(a, p, pod("a"), nil, 1, policy.Choice{Candidates: candidates}, nil)
	if err != nil || len(g.Counted) != 1 || g.Counted[0].Name != "nvidia.com/gpu=0" {
		t.Fatalf("count of 1: %v, %v", g.Counted, err)
	}
	if _, err := admit(a, p, pod("a"), []specs.Device{byName["GPU-0"]}, 0, policy.Choice{Candidates: candidates}, nil); err != nil {
		t.Errorf("the pod's next container asking by UUID for the GPU it counted: %v", err)
	}

	restored := policy.NewAllocations()
	if err := restored.Restore(p, []policy.Holding{{Pod: pod("b"), Named: []specs.Device{byName["1"], byName["1"]}}}); err != nil {
		t.Fatal(err)
	}
	if n := restored.Count(); n != 1 {
		t.Errorf("a holding restored with GPU 1 twice counts %d devices, want 1", n)
	}
}

// TestMaxWithAll: "all" that no candidate of the request falls within
// counts as one device beside the others; two MIG devices of one GPU
// count as two.
func TestMaxWithAll(t *testing.T) {
	_, byName := gpus()
	p := policy.New(config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices, AllowAll: true, MaxDevicesPerPod: 1})
	_, err := admit(policy.NewAllocations(), p, pod("a"), []specs.Device{byName["all"], byName["1"]}, 0, policy.Choice{}, nil)
	wantDenied(t, err, policy.RuleMax)
	// Two MIG devices of one GPU are two devices.
	_, err = admit(policy.NewAllocations(), p, pod("a"), []specs.Device{mig(0, 1), mig(0, 2)}, 0, policy.Choice{}, nil)
	wantDenied(t, err, policy.RuleMax, "would hold 2 devices")
}

// TestKubeletAllocated: devices kubelet allocated other pods (at their
// admission, before their containers hold them) are not free: a count
// request passes over them, saying why, and a request by name is denied
// one under policy.exclusive; the pod kubelet allocated them to may have
// them.
func TestKubeletAllocated(t *testing.T) {
	candidates, byName := gpus()
	// kubelet gave pod k GPU 0 (by index); its container is not created.
	kubelet := []policy.KubeletAllocation{{Device: byName["0"], Pod: policy.PodName{Namespace: "default", Name: "k"}}}
	ch := policy.Choice{Candidates: candidates, Kubelet: kubelet}
	strict := policy.New(config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices, Exclusive: true})
	lax := policy.New(config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices})
	for _, tc := range []struct {
		name        string
		pol         *policy.Policy
		named       []specs.Device
		fromKubelet []string
		count       int
		wantCounted []string
		wantErr     []string
	}{
		{name: "count passes over it", pol: strict, count: 1, wantCounted: []string{byName["1"].Name}},
		{name: "count of all but it", pol: strict, count: 3, wantCounted: []string{byName["1"].Name, byName["2"].Name, byName["3"].Name}},
		{name: "count of all", pol: strict, count: 4, wantErr: []string{"3 are free and 1 held by other pods"}},
		{name: "by index, exclusive", pol: strict, named: []specs.Device{byName["0"]}, wantErr: []string{`device "nvidia.com/gpu=0"`, "allocated by kubelet to pod default/k", "free again when that pod is removed"}},
		{name: "by UUID, exclusive", pol: strict, named: []specs.Device{byName["GPU-0"]}, wantErr: []string{`device "nvidia.com/gpu=GPU-0"`, "allocated by kubelet to pod default/k"}},
		{name: "by name, not exclusive", pol: lax, named: []specs.Device{byName["0"]}},
		{name: "from kubelet", pol: strict, named: []specs.Device{byName["0"]}, fromKubelet: []string{byName["0"].Name}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, err := admit(policy.NewAllocations(), tc.pol, pod("a"), tc.named, tc.count, ch, tc.fromKubelet)
			if len(tc.wantErr) > 0 {
				testutil.ErrorSays(t, err, tc.wantErr...)
				return
			}
			if err != nil || !slices.Equal(specs.Names(g.Counted), tc.wantCounted) {
				t.Fatalf("got %v, %v; want counted %v", specs.Names(g.Counted), err, tc.wantCounted)
			}
			if tc.count > 0 && !slices.Contains(g.Considered.Passed, policy.Passed{Device: byName["0"].Name, Reason: "allocated by kubelet to pod default/k (through the device plugin), which holds it for as long as it lives"}) {
				t.Errorf("passed over %v, want GPU 0 as kubelet's", g.Considered.Passed)
			}
		})
	} // Once pod k's container holds it, the pool's words say so: the
	// device is held, not only allocated.
	a := policy.NewAllocations()
	k := policy.Pod{ID: "id-k", Namespace: "default", Name: "k"}
	if _, err := admit(a, strict, k, []specs.Device{byName["0"]}, 0, ch, []string{byName["0"].Name}); err != nil {
		t.Fatal(err)
	}
	_, err := admit(a, strict, pod("a"), []specs.Device{byName["0"]}, 0, ch, nil)
	wantDenied(t, err, policy.RuleExclusive, "is held by pod default/k")
	if err != nil && strings.Contains(err.Error(), "allocated by kubelet") {
		t.Errorf("a device pod k holds is refused as only allocated to it: %v", err)
	}
}
