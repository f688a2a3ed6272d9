package plugin_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/dra"
	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
	"github.com/nri-gpu/nri-gpu/pkg/plugin"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
)

// finder is the API server's answer, as a test sets it: the claims each
// container ("pod/container") uses, or an error for the pod.
// claimsOf has the plugin use f as its DRA driver, for the claims its
// containers use.
func claimsOf(f link.Finder) plugin.Option { return plugin.WithDRA(notified{f}) }

// notified is a finder as a DRA driver that is told nothing.
type notified struct{ link.Finder }

func (notified) Notify() {}

type finder struct {
	mu   sync.Mutex
	uses map[string][]link.ClaimUse
	errs map[string]error
	// slow is how long the API server takes to answer for a pod, as a
	// client sees it: its answer comes then, or the caller's deadline.
	slow map[string]time.Duration
}

func (f *finder) Uses(ctx context.Context, pod link.PodRef, ctr string) ([]link.ClaimUse, error) {
	f.mu.Lock()
	wait := f.slow[pod.Name]
	f.mu.Unlock()
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(wait):
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.errs[pod.Name]; err != nil {
		return nil, err
	}
	return f.uses[pod.Name+"/"+ctr], nil
}

// offered is a device the DRA driver offers, as its ResourceSlice entry.
type offered struct {
	CDI    string
	Device resourceapi.Device
}

// offer returns the devices the view offers, as the DRA driver of the
// default configuration publishes them (PCIe roots from sysfs; nil: the
// host's).
func offer(t *testing.T, view *plugin.DRAView, sysfs fs.ReadLinkFS) []offered {
	t.Helper()
	devs, err := view.Devices(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var out []offered
	for _, d := range devs {
		dev := dra.DeviceOf(d.Info, sysfs)
		dev.Taints = dra.Taints(config.Default().Start.DRA, d.Info.Unhealthy)
		out = append(out, offered{CDI: d.CDI, Device: dev})
	}
	return out
}

var claimC = policy.Claim{UID: "uid-c", Namespace: "tenant", Name: "c", Pods: []policy.PodName{{Namespace: "tenant", Name: "a"}}}

// claimRuntime is a runtime of containerdVersion whose nri-gpu (policy
// exclusive, a state file) finds claims with f and has claim c prepared
// on GPU 1.
func claimRuntime(t *testing.T, containerdVersion string, f *finder) *testRuntime {
	t.Helper()
	r := runtimeSetUp(t, containerdVersion, "policy: {exclusive: true, namespaces: [tenant]}", func() []plugin.Option { return []plugin.Option{claimsOf(f)} })
	prepare(t, r, claimC, "nvidia.com/gpu=1")
	return r
}

func prepare(t *testing.T, r *testRuntime, c policy.Claim, devices ...string) {
	t.Helper()
	var allocated []link.Allocated
	for _, d := range devices {
		allocated = append(allocated, link.Allocated{CDI: d, Requests: []string{"gpus"}})
	}
	if err := r.plugin.DRAView(config.Default().Start.DRA).Prepare(context.Background(), c, allocated); err != nil {
		t.Fatal(err)
	}
}

func container(pod *api.PodSandbox, name string, cdi ...string) *api.Container {
	c := &api.Container{Id: pod.Id + "-" + name, PodSandboxId: pod.Id, Name: name, Linux: &api.LinuxContainer{}}
	for _, d := range cdi {
		c.CDIDevices = append(c.CDIDevices, &api.CDIDevice{Name: d})
	}
	return c
}

// TestClaimsOverNRI: on containerd 1.7 (CDI off), the containers that
// use a prepared claim get its devices, injected by nri-gpu, and no other
// container does; the devices are the claim's holding: a pod asking for
// them by name is refused naming the claim, a second pod of the claim
// gets them under exclusive; the claim survives a restart of nri-gpu,
// and once unprepared its GPU is free.
func TestClaimsOverNRI(t *testing.T) {
	f := &finder{uses: map[string][]link.ClaimUse{
		"a/gpu": {{UID: "uid-c", Namespace: "tenant", Name: "c"}},
		"b/gpu": {{UID: "uid-c", Namespace: "tenant", Name: "c"}},
	}}
	r := claimRuntime(t, "v1.7.35", f)
	a := &api.PodSandbox{Id: "id-a", Name: "a", Namespace: "tenant", Uid: "uid-a"}
	adj, err := r.create(a, container(a, "gpu"))
	if err != nil {
		t.Fatal(err)
	}
	if got := devicePaths(adj); !slices.Equal(got, []string{"/dev/nvidia1"}) || adj.GetAnnotations()[plugin.DevicesAnnotation] != "nvidia.com/gpu=1" {
		t.Errorf("the claim's container got %v (annotations %v), want GPU 1", got, adj.GetAnnotations())
	}
	if adj, err := r.create(a, container(a, "plain")); err != nil || len(devicePaths(adj)) > 0 {
		t.Errorf("a container of the pod that uses no claim got %v, %v", adj, err)
	}
	// The claim holds the GPU, not the pod: the state file records the
	// pod with no device, only the claim its container used.
	if data, err := os.ReadFile(r.stateFile); err != nil || !strings.Contains(string(data), `"pods":[{"id":"id-a","namespace":"tenant","name":"a","claims":["uid-c"]}]`) || !strings.Contains(string(data), `"uid":"uid-c"`) {
		t.Errorf("state file %s, %v: want the claim and the pod holding no device", data, err)
	}

	x := &api.PodSandbox{Id: "id-x", Name: "x", Namespace: "tenant", Annotations: map[string]string{"gpus.nri-gpu.io": "1"}}
	_, err = r.create(x, container(x, "main"))
	testutil.ErrorSays(t, err, `device "nvidia.com/gpu=1" is held by claim tenant/c of pod tenant/a`)

	b := &api.PodSandbox{Id: "id-b", Name: "b", Namespace: "tenant", Uid: "uid-b"}
	if adj, err := r.create(b, container(b, "gpu")); err != nil || !slices.Equal(devicePaths(adj), []string{"/dev/nvidia1"}) {
		t.Errorf("the claim's second pod got %v, %v; want GPU 1 (one claim, one holding)", adj, err)
	}
	r.removePod(t, b)

	r.restart(t, "policy: {exclusive: true, namespaces: [tenant]}")
	_, err = r.create(x, container(x, "main"))
	testutil.ErrorSays(t, err, "is held by claim tenant/c")

	if err := r.plugin.DRAView(config.Default().Start.DRA).Unprepare(context.Background(), "uid-c"); err != nil {
		t.Fatal(err)
	}
	if adj, err := r.create(x, container(x, "main")); err != nil || !slices.Equal(devicePaths(adj), []string{"/dev/nvidia1"}) {
		t.Errorf("after the claim was unprepared, a pod asking by name got %v, %v", adj, err)
	}
}

// TestClaimsInjectedByTheRuntime: on containerd 2.x with CDI on the
// runtime injects a claim's CDI devices itself: nri-gpu injects nothing
// twice, and holds them as the claim's, not the pod's (a second pod of
// the claim is not refused under exclusive).
func TestClaimsInjectedByTheRuntime(t *testing.T) {
	f := &finder{uses: map[string][]link.ClaimUse{
		"a/gpu": {{UID: "uid-c", Namespace: "tenant", Name: "c"}},
		"b/gpu": {{UID: "uid-c", Namespace: "tenant", Name: "c"}},
	}}
	r := claimRuntime(t, "v2.3.7", f)
	for _, name := range []string{"a", "b"} {
		pod := &api.PodSandbox{Id: "id-" + name, Name: name, Namespace: "tenant"}
		adj, err := r.create(pod, container(pod, "gpu", "nvidia.com/gpu=1"))
		if err != nil {
			t.Fatalf("pod %s: %v", name, err)
		}
		if len(devicePaths(adj)) > 0 || adj.GetAnnotations()[plugin.DevicesAnnotation] != "nvidia.com/gpu=1" {
			t.Errorf("pod %s: adjustment %v; want nothing injected, GPU 1 recorded", name, adj)
		}
	}
	x := &api.PodSandbox{Id: "id-x", Name: "x", Namespace: "tenant", Annotations: map[string]string{"gpus.nri-gpu.io": "1"}}
	_, err := r.create(x, container(x, "main"))
	testutil.ErrorSays(t, err, "is held by claim tenant/c")

	// A container with a claim's device and another (kubelet's device
	// plugin, CRI CDI devices): the other is the pod's.
	c := &api.PodSandbox{Id: "id-c", Name: "c", Namespace: "tenant"}
	f.mu.Lock()
	f.uses["c/gpu"] = []link.ClaimUse{{UID: "uid-c", Namespace: "tenant", Name: "c"}}
	f.mu.Unlock()
	if _, err := r.create(c, container(c, "gpu", "nvidia.com/gpu=1", "nvidia.com/gpu=0")); err != nil {
		t.Fatal(err)
	}
	y := &api.PodSandbox{Id: "id-y", Name: "y", Namespace: "tenant", Annotations: map[string]string{"gpus.nri-gpu.io": "0"}}
	_, err = r.create(y, container(y, "main"))
	testutil.ErrorSays(t, err, "is held by pod tenant/c")
}

// TestClaimsTheAPIServerCannotTell: when the API server cannot say which
// claims a container uses, a pod a prepared claim is reserved for, or
// may be since (a pod of the claim's namespace), is refused (it would
// run without its devices), a pod of another namespace is created
// without claims; a claim not reserved for the pod, or not prepared, is
// refused.
func TestClaimsTheAPIServerCannotTell(t *testing.T) {
	down := errors.New("connection refused")
	f := &finder{
		uses: map[string][]link.ClaimUse{"y/gpu": {{UID: "uid-gone", Namespace: "tenant", Name: "gone"}}},
		errs: map[string]error{"a": down, "later": down, "x": down, "z": link.ErrNotReserved},
	}
	r := claimRuntime(t, "v1.7.35", f)
	for _, tc := range []struct {
		namespace, pod string
		wantErr        []string
	}{
		{"tenant", "a", []string{"claim tenant/c of pod tenant/a was prepared, and this pod may use it: which DRA claims the container uses cannot be told: connection refused"}},
		// A pod of the claim's namespace may be one it was reserved for
		// since it was prepared (a shared claim).
		{"tenant", "later", []string{"claim tenant/c of pod tenant/a was prepared, and this pod may use it"}},
		{"other", "x", nil},
		{"tenant", "y", []string{"claim tenant/gone", "claim not prepared on this node"}},
		{"tenant", "z", []string{"not reserved for the pod"}},
	} {
		pod := &api.PodSandbox{Id: "id-" + tc.pod, Name: tc.pod, Namespace: tc.namespace}
		adj, err := r.create(pod, container(pod, "gpu"))
		if tc.wantErr == nil {
			if err != nil || len(devicePaths(adj)) > 0 {
				t.Errorf("pod %s: %v, %v; want it created without devices", tc.pod, adj, err)
			}
			continue
		}
		testutil.ErrorSays(t, err, tc.wantErr...)
	}
}

// TestClaimsWithinTheRuntimesPatience: when the API server answers only
// after 3 s, or never, the runtime (NRI's, which waits 2 s for a plugin,
// as containerd does, and then creates the container without its answer
// and drops the plugin) has nri-gpu's answer in time: a pod a prepared
// claim is reserved for is refused saying why, a pod of a namespace with
// no prepared claim is created without claims, and nri-gpu stays
// connected and serves the next pod.
func TestClaimsWithinTheRuntimesPatience(t *testing.T) {
	f := &finder{slow: map[string]time.Duration{}}
	r := claimRuntime(t, "v1.7.35", f)
	never := time.Hour
	for _, tc := range []struct {
		name    string
		pod     string
		slow    time.Duration
		wantErr []string
	}{
		{"claim prepared for the pod, an answer after 3 s", "a", 3 * time.Second, []string{"claim tenant/c of pod tenant/a was prepared, and this pod may use it", "which DRA claims the container uses cannot be told", "deadline exceeded"}},
		{"claim prepared for the pod, no answer", "a", never, []string{"claim tenant/c of pod tenant/a was prepared, and this pod may use it", "deadline exceeded"}},
		{"no claim of its namespace prepared, an answer after 3 s", "b", 3 * time.Second, nil},
		{"no claim of its namespace prepared, no answer", "b", never, nil},
	} {
		f.mu.Lock()
		f.slow[tc.pod] = tc.slow
		f.mu.Unlock()
		namespace := "tenant"
		if tc.wantErr == nil {
			namespace = "other"
		}
		pod := &api.PodSandbox{Id: "id-" + tc.pod, Name: tc.pod, Namespace: namespace}
		start := time.Now()
		adj, err := r.create(pod, container(pod, "gpu"))
		if took := time.Since(start); took >= adaptation.DefaultPluginRequestTimeout {
			t.Errorf("%s: answered in %s, past the runtime's %s", tc.name, took, adaptation.DefaultPluginRequestTimeout)
		}
		if tc.wantErr == nil {
			if err != nil || len(devicePaths(adj)) > 0 {
				t.Errorf("%s: %v, %v; want it created without devices", tc.name, adj, err)
			}
		} else {
			testutil.ErrorSays(t, err, tc.wantErr...)
		}
		// Still connected, and serving: a pod asking for GPU 0 gets it.
		next := &api.PodSandbox{Id: "id-next", Name: "next", Namespace: "tenant", Annotations: map[string]string{"gpus.nri-gpu.io": "0"}}
		adj, err = r.create(next, container(next, "gpu"))
		if err != nil || !slices.Equal(devicePaths(adj), []string{"/dev/nvidia0"}) {
			t.Fatalf("%s: the next pod: %v, %v; want GPU 0 (nri-gpu dropped by the runtime?)", tc.name, devicePaths(adj), err)
		}
		r.removePod(t, next)
	}
}

// TestClaimDevices: what the DRA driver offers: one device per GPU (not
// "all", not a GPU again by UUID), its attributes from the spec, a GPU
// held through another door left out, a claim's GPU kept.
func TestClaimDevices(t *testing.T) {
	dir := t.TempDir()
	node := filepath.Join(t.TempDir(), "nvidia2")
	if err := os.WriteFile(node, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "gpu.yaml"), []byte(fmt.Sprintf(resourceSpec, node)), 0o644); err != nil {
		t.Fatal(err)
	}
	p := inProcess(t, "policy: {exclusive: true}", dir)
	view := p.DRAView(config.Default().Start.DRA)
	names := func() []string {
		var out []string
		for _, d := range offer(t, view, nil) {
			out = append(out, d.Device.Name+"="+d.CDI)
		}
		return out
	}
	want := []string{"gpu-0=nvidia.com/gpu=0", "gpu-1=nvidia.com/gpu=1", "gpu-2=nvidia.com/gpu=2"}
	if got := names(); !slices.Equal(got, want) {
		t.Errorf("offered %v, want %v", got, want)
	}
	d := offer(t, view, nil)[0].Device
	if u := d.Attributes["uuid"].StringValue; u == nil || *u != "GPU-0" {
		t.Errorf("gpu-0's uuid %v, want the spec's other name GPU-0", u)
	}
	one := offer(t, view, nil)[1].Device
	if u, ok := one.Attributes["uuid"]; ok {
		t.Errorf("gpu-1, which the spec names by index only, has uuid %v (another GPU's)", *u.StringValue)
	}
	if i := one.Attributes["index"].IntValue; i == nil || *i != 1 {
		t.Errorf("gpu-1's index %v, want 1", i)
	}
	if ty := d.Attributes["type"].StringValue; ty == nil || *ty != "gpu" {
		t.Errorf("gpu-0's type %v", ty)
	}
	if err := view.Prepare(context.Background(), policy.Claim{UID: "u", Namespace: "ns", Name: "c"}, []link.Allocated{{CDI: "nvidia.com/gpu=2"}}); err != nil {
		t.Fatal(err)
	}
	holder := &api.PodSandbox{Id: "id-h", Name: "h", Namespace: "ns", Annotations: map[string]string{"gpus.nri-gpu.io": "GPU-0"}}
	if _, _, err := p.Create(context.Background(), holder, &api.Container{Id: "h", PodSandboxId: "id-h", Name: "main", Linux: &api.LinuxContainer{}}); err != nil {
		t.Fatal(err)
	}
	if got := names(); !slices.Equal(got, want[1:]) {
		t.Errorf("with GPU 0 held by a pod and GPU 2 by a claim, offered %v, want %v", got, want[1:])
	}
	err := view.Prepare(context.Background(), policy.Claim{UID: "v", Namespace: "ns", Name: "late"}, []link.Allocated{{CDI: "nvidia.com/gpu=0"}})
	testutil.ErrorSays(t, err, "claim ns/late", "is held by pod ns/h")
	err = view.Prepare(context.Background(), policy.Claim{UID: "w", Namespace: "ns", Name: "ghost"}, []link.Allocated{{CDI: "nvidia.com/gpu=7"}, {CDI: "nvidia.com/gpu=8"}})
	testutil.ErrorSays(t, err, "claim ns/ghost", "nvidia.com/gpu=7", "nvidia.com/gpu=8")

	// A GPU whose device node is gone stays, tainted (its claim's pods
	// see why; no new claim is placed on it), and the taint goes when the
	// node is back.
	taints := func() string {
		var out []string
		for _, d := range offer(t, view, nil) {
			for _, tn := range d.Device.Taints {
				out = append(out, fmt.Sprintf("%s %s=%s:%s", d.Device.Name, tn.Key, tn.Value, tn.Effect))
			}
		}
		return strings.Join(out, ",")
	}
	if err := os.Remove(node); err != nil {
		t.Fatal(err)
	}
	// A node found there is looked for again within a second.
	testutil.Within(t, 5*time.Second, "GPU 2 tainted, its node gone", func() bool {
		return taints() == "gpu-2 gpu.nri-gpu.io/device-gone=:NoSchedule"
	})
	if got := names(); !slices.Equal(got, want[1:]) {
		t.Errorf("with GPU 2's node gone, offered %v, want %v", got, want[1:])
	}
	if err := os.WriteFile(node, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if got := taints(); got != "" {
		t.Errorf("with GPU 2's node back, taints %q", got)
	}
}

// TestSharedClaimDevices: a GPU policy.sharing shares stays in the DRA
// driver's slice while a replica is left for a claim: held by one pod of
// two replicas, it is offered and a claim gets it, the claim counting as
// one user (a third pod is refused naming the pod and the claim); held by
// two pods it is not offered, and a claim is refused it.
func TestSharedClaimDevices(t *testing.T) {
	p := inProcess(t, `policy:
  exclusive: true
  sharing: [{devices: ["nvidia.com/gpu=*"], replicas: 2}]
`, gpuSpecDir(t, 2))
	view := p.DRAView(config.Default().Start.DRA)
	offered := func() []string {
		var out []string
		for _, d := range offer(t, view, nil) {
			out = append(out, d.CDI)
		}
		return out
	}
	ask := func(name, device string) error {
		pod := gpuPod(name, map[string]string{"gpus.nri-gpu.io": device})
		_, _, err := p.CreateContainer(context.Background(), pod, ctrOf(pod, nil))
		return err
	}
	if err := ask("a", "0"); err != nil {
		t.Fatal(err)
	}
	if got := offered(); !slices.Equal(got, []string{"nvidia.com/gpu=0", "nvidia.com/gpu=1"}) {
		t.Errorf("GPU 0 used once of 2: offered %v, want both GPUs", got)
	}
	if err := view.Prepare(context.Background(), policy.Claim{UID: "u", Namespace: "tenant", Name: "c", Pods: []policy.PodName{{Namespace: "tenant", Name: "p"}}}, []link.Allocated{{CDI: "nvidia.com/gpu=0"}}); err != nil {
		t.Fatalf("a claim on GPU 0's second replica: %v", err)
	}
	testutil.ErrorSays(t, ask("b", "0"), "used by 2 already: claim tenant/c of pod tenant/p, pod tenant/a")
	if err := ask("b", "1"); err != nil {
		t.Fatal(err)
	}
	if err := ask("d", "1"); err != nil {
		t.Fatal(err)
	}
	if got := offered(); !slices.Equal(got, []string{"nvidia.com/gpu=0"}) {
		t.Errorf("GPU 0 with a claim, GPU 1 used by two pods: offered %v, want GPU 0 only (the claim's)", got)
	}
	err := view.Prepare(context.Background(), policy.Claim{UID: "v", Namespace: "tenant", Name: "late"}, []link.Allocated{{CDI: "nvidia.com/gpu=1"}})
	testutil.ErrorSays(t, err, "claim tenant/late", "used by 2 already: pod tenant/b, pod tenant/d")
}

// TestClaimDevicesChosen: the DRA driver offers the devices of each
// configured kind that dra.devices and policy.devices both allow; a
// device of another vendor has no GPU's attributes, and is named from
// its CDI name; a MIG device has its GPU's index and is offered where its
// GPU is not; a GPU or MIG device named by its UUID has no index.
func TestClaimDevicesChosen(t *testing.T) {
	dir := t.TempDir()
	fpga := `
cdiVersion: "0.6.0"
kind: vendor.com/fpga
devices:
  - name: Card_A
    containerEdits:
      deviceNodes: [{path: /dev/fpga0, hostPath: /dev/null}]
`
	gpus := `
cdiVersion: "0.6.0"
kind: nvidia.com/gpu
devices:
  - name: "0"
    containerEdits:
      deviceNodes: [{path: /dev/nvidia0, hostPath: /dev/zero}]
  - name: "1"
    containerEdits:
      deviceNodes: [{path: /dev/nvidia1, hostPath: %s}]
  - name: "2"
    containerEdits:
      deviceNodes: [{path: /dev/nvidia2, hostPath: %s}]
  - name: "2:0"
    containerEdits:
      deviceNodes: [{path: /dev/nvidia2, hostPath: %s}, {path: /dev/nvidia-caps/nvidia-cap21, hostPath: %s}]
  - name: MIG-5c1f2a3b-0000-5000-8000-000000000022
    containerEdits:
      deviceNodes: [{path: /dev/nvidia2, hostPath: %s}, {path: /dev/nvidia-caps/nvidia-cap22, hostPath: %s}]
  - name: GPU-5c1f2a3b-0000-5000-8000-000000000003
    containerEdits:
      deviceNodes: [{path: /dev/nvidia3, hostPath: %s}]
`
	var nodes []any
	for _, n := range []string{"nvidia1", "nvidia2", "nvidia2", "cap21", "nvidia2", "cap22", "nvidia3"} {
		path := filepath.Join(dir, n)
		if err := os.WriteFile(path, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, path)
	}
	specDir := filepath.Join(dir, "cdi")
	if err := os.MkdirAll(specDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, spec := range map[string]string{"fpga.yaml": fpga, "gpu.yaml": fmt.Sprintf(gpus, nodes...)} {
		if err := os.WriteFile(filepath.Join(specDir, name), []byte(spec), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	p := inProcess(t, `policy: {devices: ["nvidia.com/gpu=[02]*", "nvidia.com/gpu=MIG-*", "nvidia.com/gpu=GPU-*", "vendor.com/fpga=*"]}`, specDir)
	cfg := config.Default().Start.DRA
	cfg.Kinds, cfg.Devices = []string{"vendor.com/fpga", "nvidia.com/gpu"}, []string{"Card_*", "1", "*:*", "MIG-*", "GPU-*"}
	var got []string
	attrs := map[string]int{}
	for _, d := range offer(t, p.DRAView(cfg), nil) {
		got = append(got, d.Device.Name+"="+d.CDI)
		attrs[d.Device.Name] = len(d.Device.Attributes)
		if d.Device.Name == "gpu-2-0" {
			if ty := d.Device.Attributes["type"].StringValue; ty == nil || *ty != "mig" {
				t.Errorf("MIG device 2:0 of type %v", ty)
			}
			if i := d.Device.Attributes["index"].IntValue; i == nil || *i != 2 {
				t.Errorf("MIG device 2:0 of index %v, want its GPU's 2", i)
			}
		}
		// A GPU and a MIG device named by their UUIDs (nvidia-ctk's
		// uuid naming): their names do not say their GPU's index, and
		// they are published with none rather than another GPU's.
		if kind, ok := strings.CutPrefix(d.CDI, "nvidia.com/gpu="); ok && (strings.HasPrefix(kind, "MIG-") || strings.HasPrefix(kind, "GPU-")) {
			want := map[bool]string{true: "mig", false: "gpu"}[strings.HasPrefix(kind, "MIG-")]
			if ty := d.Device.Attributes["type"].StringValue; ty == nil || *ty != want {
				t.Errorf("device %s of type %v, want %s", d.CDI, ty, want)
			}
			if i, ok := d.Device.Attributes["index"]; ok {
				t.Errorf("device %s published with index %v, want none", d.CDI, i)
			}
		}
	}
	// GPUs 0 and 2: not in dra.devices; GPU 1: not in policy.devices;
	// MIG device 2:0 (offered as GPU 2 is not: one device per piece of
	// hardware), another MIG device of GPU 2 and GPU 3, named by their
	// UUIDs (GPU 3 offered under its device node's number).
	want := []string{"fpga-card-a=vendor.com/fpga=Card_A", "gpu-2-0=nvidia.com/gpu=2:0", "gpu-3=nvidia.com/gpu=GPU-5c1f2a3b-0000-5000-8000-000000000003",
		"gpu-mig-5c1f2a3b-0000-5000-8000-000000000022=nvidia.com/gpu=MIG-5c1f2a3b-0000-5000-8000-000000000022"}
	if !slices.Equal(got, want) {
		t.Errorf("offered %v, want %v", got, want)
	}
	if attrs["fpga-card-a"] != 0 {
		t.Errorf("the FPGA has %d attributes, want none (no GPU's)", attrs["fpga-card-a"])
	}
}

// TestClaimDeviceNamesCollide: two devices whose CDI names make one
// ResourceSlice name (a DNS label: lower case, "-" for what it cannot
// hold) are offered once, under the first; a slice with one name twice
// is refused by the API server whole.
func TestClaimDeviceNamesCollide(t *testing.T) {
	dir := t.TempDir()
	var nodes []string
	for _, n := range []string{"fpga0", "fpga1", "fpga2"} {
		path := filepath.Join(dir, n)
		writeFile(t, path, nil)
		nodes = append(nodes, path)
	}
	specDir := specDirWith(t, dir, "fpga.yaml", fmt.Sprintf(`cdiVersion: "0.6.0"
kind: example.com/fpga
devices:
  - name: a.b
    containerEdits: {deviceNodes: [{path: /dev/fpga0, hostPath: %s, type: c, major: 240, minor: 0}]}
  - name: A_b
    containerEdits: {deviceNodes: [{path: /dev/fpga1, hostPath: %s, type: c, major: 240, minor: 1}]}
  - name: c
    containerEdits: {deviceNodes: [{path: /dev/fpga2, hostPath: %s, type: c, major: 240, minor: 2}]}
`, nodes[0], nodes[1], nodes[2]))
	p := inProcess(t, `policy: {exclusive: true, devices: ["example.com/fpga=*"]}`, specDir)
	var got []string
	for _, d := range offer(t, p.DRAView(config.DRA{Kinds: []string{"example.com/fpga"}, Devices: []string{"*"}}), nil) {
		got = append(got, d.Device.Name+"="+d.CDI)
		// Not a GPU: no index (the minor is its node's, not an NVIDIA
		// GPU's: none either).
		for _, a := range []resourceapi.QualifiedName{"index", "minor", "type"} {
			if v, ok := d.Device.Attributes[a]; ok {
				t.Errorf("%s has attribute %s %v", d.Device.Name, a, v)
			}
		}
	}
	if want := []string{"fpga-a-b=example.com/fpga=A_b", "fpga-c=example.com/fpga=c"}; !slices.Equal(got, want) {
		t.Errorf("offered %v, want %v", got, want)
	}
}

// specDirWith makes a spec directory under dir holding one spec file of
// content, and returns the directory.
func specDirWith(t *testing.T, dir, file, content string) string {
	t.Helper()
	specDir := filepath.Join(dir, "cdi")
	if err := os.Mkdir(specDir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(specDir, file), []byte(content))
	return specDir
}

// TestUUIDOfItsKind: a GPU's UUID is a name its hardware goes by in its
// own kind: another vendor's spec naming the same device node GPU-...
// gives it none.
func TestUUIDOfItsKind(t *testing.T) {
	dir := t.TempDir()
	node := filepath.Join(dir, "nvidia0")
	if err := os.WriteFile(node, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	edits := fmt.Sprintf(`containerEdits: {deviceNodes: [{path: /dev/nvidia0, hostPath: %s, type: c, major: 195, minor: 0}]}`, node)
	specDir := specDirWith(t, dir, "gpu.yaml", "cdiVersion: \"0.6.0\"\nkind: nvidia.com/gpu\ndevices:\n  - name: \"0\"\n    "+edits+"\n")
	writeFile(t, filepath.Join(specDir, "other.yaml"), []byte("cdiVersion: \"0.6.0\"\nkind: example.com/gpu\ndevices:\n  - name: GPU-foreign\n    "+edits+"\n"))
	p := inProcess(t, "policy: {exclusive: true}\n", specDir)
	got := offer(t, p.DRAView(config.Default().Start.DRA), nil)
	if len(got) != 1 || got[0].Device.Name != "gpu-0" {
		t.Fatalf("offered %v, want gpu-0", got)
	}
	if u := got[0].Device.Attributes["uuid"].StringValue; u != nil {
		t.Errorf("gpu-0's uuid is %q, another kind's name", *u)
	}
}

// TestClaimOnlyPodNotHeld: a pod whose containers use claims only holds
// nothing of its own: the record, saved again for another pod, lists the
// claim, that pod's device, and the claim's pod with no device, only the
// claim its container used (counted for policy.maxDevicesPerPod after a
// restart).
func TestClaimOnlyPodNotHeld(t *testing.T) {
	f := &finder{uses: map[string][]link.ClaimUse{"a/gpu": {{UID: "uid-c", Namespace: "tenant", Name: "c"}}}}
	r := claimRuntime(t, "v1.7.35", f)
	a := &api.PodSandbox{Id: "id-a", Name: "a", Namespace: "tenant", Uid: "uid-a"}
	if _, err := r.create(a, container(a, "gpu")); err != nil {
		t.Fatal(err)
	}
	x := &api.PodSandbox{Id: "id-x", Name: "x", Namespace: "tenant", Annotations: map[string]string{"gpus.nri-gpu.io": "0"}}
	if _, err := r.create(x, container(x, "main")); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(r.stateFile)
	if err != nil {
		t.Fatal(err)
	}
	var rec struct {
		Pods []struct {
			ID             string
			Named, Counted []any
			Claims         []string
		}
	}
	if err := json.Unmarshal(data, &rec); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, p := range rec.Pods {
		got[p.ID] = fmt.Sprintf("%d devices, claims %v", len(p.Named)+len(p.Counted), p.Claims)
	}
	want := map[string]string{"id-a": "0 devices, claims [uid-c]", "id-x": "1 devices, claims []"}
	if !maps.Equal(got, want) {
		t.Errorf("record %s: pods %v, want %v", data, got, want)
	}
}

// TestSweepKeepsClaimInUse: a claim the API server no longer has (its pod
// deleted while kubelet was away) is not released while its pod's
// container runs on the node, across a restart of nri-gpu too: its GPU
// is not given to another pod; once the pod has ended it is released, and
// the GPU is free.
func TestSweepKeepsClaimInUse(t *testing.T) {
	f := &finder{uses: map[string][]link.ClaimUse{"a/gpu": {{UID: "uid-c", Namespace: "tenant", Name: "c"}}}}
	r := claimRuntime(t, "v1.7.35", f)
	a := &api.PodSandbox{Id: "id-a", Name: "a", Namespace: "tenant", Uid: "uid-a"}
	if _, err := r.create(a, container(a, "gpu")); err != nil {
		t.Fatal(err)
	}
	x := &api.PodSandbox{Id: "id-x", Name: "x", Namespace: "tenant", Annotations: map[string]string{"gpus.nri-gpu.io": "1"}}
	ctx := context.Background()
	for _, restarted := range []bool{false, true} {
		if restarted {
			r.restart(t, "policy: {exclusive: true, namespaces: [tenant]}")
		}
		err := r.plugin.DRAView(config.Default().Start.DRA).Release(ctx, "uid-c")
		testutil.ErrorSays(t, err, "claim tenant/c of pod tenant/a still used by the containers of pod tenant/a")
		if !errors.Is(err, policy.ErrClaimInUse) {
			t.Errorf("restarted %v: %v, want ErrClaimInUse", restarted, err)
		}
		_, err = r.create(x, container(x, "main"))
		testutil.ErrorSays(t, err, "is held by claim tenant/c")
	}
	r.removePod(t, a)
	if err := r.plugin.DRAView(config.Default().Start.DRA).Release(ctx, "uid-c"); err != nil {
		t.Fatal(err)
	}
	if adj, err := r.create(x, container(x, "main")); err != nil || !slices.Equal(devicePaths(adj), []string{"/dev/nvidia1"}) {
		t.Errorf("after the claim was released, a pod asking by name got %v, %v", adj, err)
	}
}
