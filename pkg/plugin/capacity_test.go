package plugin_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/deviceplugin"
	"github.com/nri-gpu/nri-gpu/pkg/dra"
	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
	"github.com/nri-gpu/nri-gpu/pkg/metrics"
	"github.com/nri-gpu/nri-gpu/pkg/mps"
	"github.com/nri-gpu/nri-gpu/pkg/plugin"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
)

// capacityOf returns a device's capacity as published: its value and
// request policy (default, min, max, step), "" where unset.
func capacityOf(d resourceapi.Device, name resourceapi.QualifiedName) []string {
	c, ok := d.Capacity[name]
	if !ok {
		return nil
	}
	s := func(q *resource.Quantity) string {
		if q == nil {
			return ""
		}
		return q.String()
	}
	out := []string{c.Value.String()}
	if p := c.RequestPolicy; p != nil && p.ValidRange != nil {
		out = append(out, s(p.Default), s(p.ValidRange.Min), s(p.ValidRange.Max), s(p.ValidRange.Step))
	}
	return out
}

// TestClaimsByCapacity: a GPU policy.sharing shares is published for
// several claims at once, with what it offers them beside what pods
// hold through the other doors; a claim holds what kube-scheduler
// allocated it, and pods and claims are counted against the same shares
// and memory. Time-slicing refuses a claim that asks for memory unless
// the entry makes memory a quota.
func TestClaimsByCapacity(t *testing.T) {
	for _, tc := range []struct {
		name  string
		quota bool
	}{{"memory bounded nowhere: refused", false}, {"memory a quota", true}} {
		t.Run(tc.name, func(t *testing.T) {
			quota := ""
			if tc.quota {
				quota = ", memoryQuota: true"
			}
			// No NVML here: the driver bounds no holder's memory.
			p := inProcess(t, `policy:
  exclusive: true
  memoryLimits: agreement
  sharing: [{devices: ["nvidia.com/gpu=*"], replicas: 4, memory: 80Gi, memoryRequest: {step: 1Gi}`+quota+`}]
`, gpuSpecDir(t, 1))
			view := p.DRAView(config.Default().Start.DRA)
			published := func() resourceapi.Device {
				t.Helper()
				got := offer(t, view, nil)
				if len(got) != 1 {
					t.Fatalf("offered %v, want GPU 0", got)
				}
				return got[0].Device
			}
			wantOffer := func(shares, memory []string) {
				t.Helper()
				d := published()
				if d.AllowMultipleAllocations == nil || !*d.AllowMultipleAllocations {
					t.Errorf("GPU 0 published for one claim only")
				}
				if got := capacityOf(d, dra.CapacityShares); !slices.Equal(got, shares) {
					t.Errorf("shares published %q, want %q", got, shares)
				}
				if got := capacityOf(d, dra.CapacityMemory); !slices.Equal(got, memory) {
					t.Errorf("memory published %q, want %q", got, memory)
				}
			}
			ask := func(name string) error {
				pod := gpuPod(name, map[string]string{"gpus.nri-gpu.io": "0"})
				_, _, err := p.CreateContainer(context.Background(), pod, ctrOf(pod, nil))
				return err
			}
			claim := func(name string, use policy.Use, memoryAsked bool) error {
				return view.Prepare(context.Background(), policy.Claim{UID: "uid-" + name, Namespace: "tenant", Name: name},
					[]link.Allocated{{CDI: "nvidia.com/gpu=0", Requests: []string{"gpu"}, Use: use, MemoryAsked: memoryAsked}})
			}

			wantOffer([]string{"4", "1", "1", "4", "1"}, []string{"80Gi", "20Gi", "1Gi", "80Gi", "1Gi"})
			if err := ask("a"); err != nil {
				t.Fatal(err)
			}
			wantOffer([]string{"3", "1", "1", "3", "1"}, []string{"60Gi", "20Gi", "1Gi", "60Gi", "1Gi"})

			err := claim("asks", policy.Use{Shares: 1, Memory: 40 << 30}, true)
			if !tc.quota {
				testutil.ErrorSays(t, err, `claim tenant/asks: denied by policy: device "nvidia.com/gpu=0": the claim asks for an amount of memory, which policy.sharing[0] (replicas 4, timeSlicing) cannot bound`,
					"set its memoryQuota: true")
				// Two shares and the default memory, as kube-scheduler
				// allocates a claim that asks for no memory.
				err = claim("asks", policy.Use{Shares: 2, Memory: 20 << 30}, false)
			}
			if err != nil {
				t.Fatal(err)
			}
			// Kube-scheduler counts the claim; what pods hold is offered
			// no more.
			wantOffer([]string{"3", "1", "1", "3", "1"}, []string{"60Gi", "20Gi", "1Gi", "60Gi", "1Gi"})
			if tc.quota {
				// 20Gi (a) + 40Gi (the claim): one more pod fits, the next
				// finds no memory though shares are left.
				if err := ask("b"); err != nil {
					t.Fatal(err)
				}
				testutil.ErrorSays(t, ask("c"), "used by 3 already: claim tenant/asks, pod tenant/a, pod tenant/b",
					"it has 1 share left, and 1 share and 20Gi of memory is needed")
				return
			}
			// 1 (a) + 2 (the claim): one more pod, and the shares are gone.
			if err := ask("b"); err != nil {
				t.Fatal(err)
			}
			testutil.ErrorSays(t, ask("c"), "it has 0 shares and 20Gi of memory left, and 1 share and 20Gi of memory is needed")
			// What the pods leave; kube-scheduler finds the claim has it.
			wantOffer([]string{"2", "1", "1", "2", "1"}, []string{"40Gi", "20Gi", "1Gi", "40Gi", "1Gi"})
		})
	}
}

// TestMPSClaimLimits: a claim's clients of an MPS-shared GPU are bound
// to what kube-scheduler allocated the claim (its memory; the entry's
// compute share for each of its shares), or to less where its GpuConfig
// asks for less; a pod's to the daemon's defaults, on one daemon.
func TestMPSClaimLimits(t *testing.T) {
	ctl, root := standin(t), testutil.ShortDir(t)
	f := &finder{uses: map[string][]link.ClaimUse{"a/gpu": {{UID: "uid-c", Namespace: "tenant", Name: "c"}}}}
	m := metrics.New()
	r := runtimeSetUp(t, "v1.7.35", strings.Replace(mpsConfig(ctl, root, "external", "2Gi"), "  exclusive: true\n", "  exclusive: true\n  namespaces: [tenant]\n", 1), func() []plugin.Option {
		return []plugin.Option{claimsOf(f), plugin.WithMetrics(m)}
	})
	gpu0 := root + "/0"
	d := mps.Daemon{Control: ctl, Dir: gpu0}
	t.Cleanup(func() { quitAll(root) })
	if err := d.Start(context.Background(), mps.Limits{ActiveThreadPercentage: 33, PinnedMemoryMiB: 2048}, startedInDir); err != nil {
		t.Fatal(err)
	}
	if err := r.plugin.DRAView(config.Default().Start.DRA).Prepare(context.Background(),
		policy.Claim{UID: "uid-c", Namespace: "tenant", Name: "c", Pods: []policy.PodName{{Namespace: "tenant", Name: "a"}}},
		[]link.Allocated{{CDI: "nvidia.com/gpu=0", Requests: []string{"gpu"}, Use: policy.Use{Shares: 2, Memory: 10 << 30}, MemoryAsked: true}}); err != nil {
		t.Fatal(err)
	}
	a := &api.PodSandbox{Id: "id-a", Name: "a", Namespace: "tenant", Uid: "uid-a"}
	adj, err := r.create(a, container(a, "gpu"))
	if err != nil {
		t.Fatal(err)
	}
	wantClient(t, adj, gpu0, 66, 10240)
	b := gpuPod("b", map[string]string{"gpus.nri-gpu.io": "0"})
	adj, err = r.create(b, ctrOf(b, nil))
	if err != nil {
		t.Fatal(err)
	}
	wantClient(t, adj, gpu0, 33, 2048)
	// 2 shares (the claim) + 1 (b) of 3.
	c := gpuPod("c", map[string]string{"gpus.nri-gpu.io": "0"})
	_, err = r.create(c, ctrOf(c, nil))
	testutil.ErrorSays(t, err, "used by 2 already: claim tenant/c of pod tenant/a, pod tenant/b")
	// The metrics tell the daemon, its two clients and the bounds of each.
	labels := func(claim, door, pod string) string {
		return fmt.Sprintf(`{GPU_I_ID="",UUID="",cdi_device="nvidia.com/gpu=0",claim=%q,door=%q,gpu="0",namespace="tenant",pod=%q}`, claim, door, pod)
	}
	body := scrape(t, m)
	for _, want := range []string{
		`nri_gpu_mps_daemon_ready{GPU_I_ID="",UUID="",cdi_device="nvidia.com/gpu=0",gpu="0"} 1`,
		`nri_gpu_mps_clients{GPU_I_ID="",UUID="",cdi_device="nvidia.com/gpu=0",gpu="0"} 2`,
		"nri_gpu_mps_client_compute_percent" + labels("c", "dra", "a") + " 66",
		"nri_gpu_mps_client_pinned_memory_bytes" + labels("c", "dra", "a") + " 1.073741824e+10",
		"nri_gpu_mps_client_compute_percent" + labels("", "annotation", "b") + " 33",
		"nri_gpu_mps_client_pinned_memory_bytes" + labels("", "annotation", "b") + " 2.147483648e+09",
		`nri_gpu_device_shares_used{GPU_I_ID="",UUID="",cdi_device="nvidia.com/gpu=0",gpu="0"} 3`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("no %s in the metrics:\n%s", want, body)
		}
	}

	// A claim whose GpuConfig asks for less than its allocation allows
	// gets what it asked for.
	gpu1 := root + "/1"
	if err := (mps.Daemon{Control: ctl, Dir: gpu1}).Start(context.Background(), mps.Limits{ActiveThreadPercentage: 33, PinnedMemoryMiB: 2048}, startedInDir); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	f.uses["e/gpu"] = []link.ClaimUse{{UID: "uid-e", Namespace: "tenant", Name: "e"}}
	f.mu.Unlock()
	if err := r.plugin.DRAView(config.Default().Start.DRA).Prepare(context.Background(),
		policy.Claim{UID: "uid-e", Namespace: "tenant", Name: "e", Pods: []policy.PodName{{Namespace: "tenant", Name: "e"}}},
		[]link.Allocated{{CDI: "nvidia.com/gpu=1", Requests: []string{"gpu"}, Use: policy.Use{Shares: 1, Memory: 8 << 30},
			GpuConfig: policy.GpuConfig{Strategy: config.StrategyMPS, ActiveThreadPercentage: 20, PinnedMemory: 1 << 30}}}); err != nil {
		t.Fatal(err)
	}
	e := &api.PodSandbox{Id: "id-e", Name: "e", Namespace: "tenant", Uid: "uid-e"}
	adj, err = r.create(e, container(e, "gpu"))
	if err != nil {
		t.Fatal(err)
	}
	wantClient(t, adj, gpu1, 20, 1024)
}

// TestCapacityAllocated: kube-scheduler's own allocator (consumable
// capacity on), over the slice nri-gpu publishes for a GPU shared 4
// ways with 80Gi: claims that fit its memory and shares are allocated
// together on it, one past either is not; what it allocated prepares in
// the pool, and a pod then finds what the claims left.
func TestCapacityAllocated(t *testing.T) {
	p := inProcess(t, `policy:
  exclusive: true
  namespaces: [ns, tenant]
  sharing: [{devices: ["nvidia.com/gpu=*"], replicas: 4, strategy: timeSlicing, memory: 80Gi, memoryQuota: true, memoryRequest: {step: 1Gi}}]
`, gpuSpecDir(t, 1))
	view := p.DRAView(config.Default().Start.DRA)
	slice := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "node-1-gpu"}, Spec: resourceapi.ResourceSliceSpec{
		Driver: "gpu.nri-gpu.io", NodeName: new("node-1"), Pool: resourceapi.ResourcePool{Name: "node-1", ResourceSliceCount: 1},
	}}
	for _, d := range offer(t, view, nil) {
		slice.Spec.Devices = append(slice.Spec.Devices, d.Device)
	}
	class := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "gpu"}, Spec: resourceapi.DeviceClassSpec{
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "gpu.nri-gpu.io"`}}},
	}}
	claimOf := func(name string, capacity map[resourceapi.QualifiedName]string) *resourceapi.ResourceClaim {
		req := &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}
		if capacity != nil {
			req.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{}}
			for k, v := range capacity {
				req.Capacity.Requests[k] = resource.MustParse(v)
			}
		}
		return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("uid-" + name)},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: req}}}}}
	}
	allocate := func(claims ...*resourceapi.ResourceClaim) []resourceapi.AllocationResult {
		t.Helper()
		alloc, err := structured.NewAllocator(context.Background(), structured.Features{ConsumableCapacity: true}, structured.AllocatedState{},
			classes{class}, []*resourceapi.ResourceSlice{slice}, cel.NewCache(10, cel.Features{}))
		if err != nil {
			t.Fatal(err)
		}
		results, err := alloc.Allocate(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}}, claims)
		if err != nil {
			t.Fatal(err)
		}
		return results
	}
	big := claimOf("big", map[resourceapi.QualifiedName]string{"memory": "50Gi"})
	plain := claimOf("plain", nil)
	two := claimOf("two", map[resourceapi.QualifiedName]string{"shares": "2"})
	for _, tc := range []struct {
		name   string
		claims []*resourceapi.ResourceClaim
		fits   bool
	}{
		{"50Gi and the default (20Gi)", []*resourceapi.ResourceClaim{big, plain}, true},
		{"50Gi, the default and two shares (with the default again): past the memory", []*resourceapi.ResourceClaim{big, plain, two}, false},
		{"50Gi and 40Gi: past the memory", []*resourceapi.ResourceClaim{big, claimOf("more", map[resourceapi.QualifiedName]string{"memory": "40Gi"})}, false},
		{"two shares twice and one more: past the shares", []*resourceapi.ResourceClaim{two, claimOf("two-b", map[resourceapi.QualifiedName]string{"shares": "2"}), plain}, false},
	} {
		got := allocate(tc.claims...)
		if (len(got) == len(tc.claims)) != tc.fits {
			t.Errorf("%s: allocated %d of %d claims, want fits=%v", tc.name, len(got), len(tc.claims), tc.fits)
		}
	}

	// Prepared as kube-scheduler allocated them, 70Gi of 80Gi: a pod
	// (20Gi by default) finds too little memory left, though shares are.
	results := allocate(big, plain)
	for i, c := range []*resourceapi.ResourceClaim{big, plain} {
		r := results[i].Devices.Results[0]
		shares, memory := r.ConsumedCapacity["shares"], r.ConsumedCapacity["memory"]
		use := policy.Use{Shares: int(shares.Value()), Memory: memory.Value()}
		if err := view.Prepare(context.Background(), policy.Claim{UID: string(c.UID), Namespace: "ns", Name: c.Name},
			[]link.Allocated{{CDI: "nvidia.com/gpu=0", Requests: []string{"gpu"}, Use: use, MemoryAsked: c == big}}); err != nil {
			t.Fatalf("claim %s (%v): %v", c.Name, use, err)
		}
	}
	pod := gpuPod("a", map[string]string{"gpus.nri-gpu.io": "0"})
	_, _, err := p.CreateContainer(context.Background(), pod, ctrOf(pod, nil))
	testutil.ErrorSays(t, err, "it has 2 shares and 10Gi of memory left, and 1 share and 20Gi of memory is needed")
}

// TestCapacityAcrossDoors: the device plugin's replicas of a GPU shared
// by capacity are as many as its memory and shares leave room for: a
// claim that consumes 50Gi of 80Gi leaves one 20Gi replica healthy of the
// three shares left, and a pod through an annotation then none.
func TestCapacityAcrossDoors(t *testing.T) {
	p := inProcess(t, `policy:
  exclusive: true
  sharing: [{devices: ["nvidia.com/gpu=0"], replicas: 4, memory: 80Gi, memoryQuota: true}]
`, gpuSpecDir(t, 1))
	res := p.Resource(config.Resource{Name: "nvidia.com/gpu", Kind: "nvidia.com/gpu", Devices: []string{"*"}})
	want := func(what, list string) {
		t.Helper()
		if got := deviceplugin.Describe(res.Devices()); got != list {
			t.Errorf("%s: devices %q, want %q", what, got, list)
		}
	}
	want("at start", "0::0 healthy, 0::1 healthy, 0::2 healthy, 0::3 healthy")
	if err := p.DRAView(config.Default().Start.DRA).Prepare(context.Background(), policy.Claim{UID: "u", Namespace: "tenant", Name: "big"},
		[]link.Allocated{{CDI: "nvidia.com/gpu=0", Requests: []string{"gpu"}, Use: policy.Use{Shares: 1, Memory: 50 << 30}, MemoryAsked: true}}); err != nil {
		t.Fatal(err)
	}
	want("a claim of 50Gi", "0::0 healthy, 0::1 unhealthy, 0::2 unhealthy, 0::3 unhealthy")
	pod := gpuPod("a", map[string]string{"gpus.nri-gpu.io": "0"})
	if _, _, err := p.CreateContainer(context.Background(), pod, ctrOf(pod, nil)); err != nil {
		t.Fatal(err)
	}
	want("and a pod of 20Gi", "0::0 unhealthy, 0::1 unhealthy, 0::2 unhealthy, 0::3 unhealthy")
}
