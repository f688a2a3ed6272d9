package cluster

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apiresource "k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
	"github.com/nri-gpu/nri-gpu/test/harness"
)

// driverName is the chart's DRA driver, and its DeviceClass.
const driverName = "gpu.nri-gpu.io"

// slice returns the devices of node n's ResourceSlice of nri-gpu's
// driver, by name.
func slice(t *testing.T, n *harness.Node) map[string]resourceapi.Device {
	t.Helper()
	return sliceOf(t, n, driverName)
}

// sliceOf returns the devices of node n's ResourceSlice of driver, by
// name.
func sliceOf(t *testing.T, n *harness.Node, driver string) map[string]resourceapi.Device {
	t.Helper()
	devs, err := env.cluster.SliceDevices(n.Name, driver)
	if err != nil {
		t.Fatal(err)
	}
	return devs
}

// waitSlice waits until node n's ResourceSlice offers exactly want.
func waitSlice(t *testing.T, n *harness.Node, want ...string) {
	t.Helper()
	var got []string
	testutil.Within(t, podWait, fmt.Sprintf("%s's ResourceSlice offers %v", n.Name, want), func() bool {
		got = got[:0]
		for name := range slice(t, n) {
			got = append(got, name)
		}
		slices.Sort(got)
		return slices.Equal(got, want)
	})
}

// gpuNames are the ResourceSlice names of node n's GPUs, but skip.
func gpuNames(n *harness.Node, skip ...int) []string {
	var out []string
	for i := range n.GPUs {
		if !slices.Contains(skip, i) {
			out = append(out, fmt.Sprintf("gpu-%d", i))
		}
	}
	return out
}

// claimPod is a pod on node n whose container "gpu" uses the claim
// "gpu" (from template, or the ResourceClaim claim) and whose container
// "plain" uses nothing.
func claimPod(namespace, name string, n *harness.Node, template, claim string) *corev1.Pod {
	p := harness.SleepPod(namespace, name, 0)
	p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": n.Name}
	gpu := p.Spec.Containers[0]
	gpu.Name = "gpu"
	gpu.Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
	plain := p.Spec.Containers[0]
	plain.Name = "plain"
	p.Spec.Containers = []corev1.Container{gpu, plain}
	pc := corev1.PodResourceClaim{Name: "gpu"}
	if template != "" {
		pc.ResourceClaimTemplateName = &template
	} else {
		pc.ResourceClaimName = &claim
	}
	p.Spec.ResourceClaims = []corev1.PodResourceClaim{pc}
	return p
}

// memoryClaimSpec asks for one device of the DeviceClass class and that
// much of its memory capacity.
func memoryClaimSpec(class, memory string) resourceapi.ResourceClaimSpec {
	spec := harness.ClaimSpec(class, 1)
	spec.Devices.Requests[0].Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]apiresource.Quantity{
		"memory": apiresource.MustParse(memory)}}
	return spec
}

// createTemplate creates a ResourceClaimTemplate, deleted when the test
// ends.
func createTemplate(t *testing.T, namespace, name string, spec resourceapi.ResourceClaimSpec) {
	t.Helper()
	ctx := context.Background()
	tpl := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}, Spec: resourceapi.ResourceClaimTemplateSpec{Spec: spec}}
	if _, err := env.client.ResourceV1().ResourceClaimTemplates(namespace).Create(ctx, tpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = env.client.ResourceV1().ResourceClaimTemplates(namespace).Delete(ctx, name, metav1.DeleteOptions{})
	})
}

// seenBy returns the GPU device nodes container ctr of pod p sees.
func seenBy(t *testing.T, p *corev1.Pod, ctr string) []string {
	t.Helper()
	return gpusIn(t, nodeOf(t, p), containerID(t, p, ctr), p.Name)
}

// waitAllRunning waits until every container of pod namespace/name runs.
func waitAllRunning(t *testing.T, namespace, name string) *corev1.Pod {
	t.Helper()
	var last *corev1.Pod
	deadline := time.Now().Add(podWait)
	for {
		p, err := env.client.CoreV1().Pods(namespace).Get(context.Background(), name, metav1.GetOptions{})
		if err == nil {
			last = p
			if p.Status.Phase == corev1.PodRunning && len(p.Status.ContainerStatuses) == len(p.Spec.Containers) &&
				!slices.ContainsFunc(p.Status.ContainerStatuses, func(s corev1.ContainerStatus) bool { return s.State.Running == nil }) {
				return p
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s/%s Running: not within %s; %s; its events:\n%s", namespace, name, podWait, podState(last), podEvents(namespace, name))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// podState says where pod p is (its phase, reason and its containers'
// states), for a test that waited for it in vain.
func podState(p *corev1.Pod) string {
	if p == nil {
		return "never seen"
	}
	s := fmt.Sprintf("phase %s %s %q", p.Status.Phase, p.Status.Reason, p.Status.Message)
	for _, c := range p.Status.ContainerStatuses {
		s += fmt.Sprintf("; container %s: %+v", c.Name, c.State)
	}
	return s
}

// TestDRASlices: nri-gpu publishes each node's GPUs as one ResourceSlice
// of its driver, pool the node, one device per GPU named as NVIDIA's DRA
// driver names it, with the attributes the specs tell (type, index,
// minor) and none they do not (no NVML on these nodes: no productName,
// no memory).
func TestDRASlices(t *testing.T) {
	needCluster(t)
	for _, n := range env.nodes {
		waitSlice(t, n, gpuNames(n)...)
		for i := range n.GPUs {
			d := slice(t, n)[fmt.Sprintf("gpu-%d", i)]
			if got := d.Attributes["type"].StringValue; got == nil || *got != "gpu" {
				t.Errorf("%s gpu-%d: type %v, want gpu", n.Name, i, got)
			}
			for _, a := range []resourceapi.QualifiedName{"index", "minor"} {
				if got := d.Attributes[a].IntValue; got == nil || *got != int64(i) {
					t.Errorf("%s gpu-%d: %s %v, want %d", n.Name, i, a, got, i)
				}
			}
			if got := d.Attributes["uuid"].StringValue; got == nil || *got != n.UUID(i) {
				t.Errorf("%s gpu-%d: uuid %v, want the spec's %s", n.Name, i, got, n.UUID(i))
			}
			if _, ok := d.Attributes["productName"]; ok || len(d.Capacity) > 0 {
				t.Errorf("%s gpu-%d: attributes %v, capacity %v: made up without NVML", n.Name, i, d.Attributes, d.Capacity)
			}
		}
	}
	if _, err := env.client.ResourceV1().DeviceClasses().Get(context.Background(), driverName, metav1.GetOptions{}); err != nil {
		t.Errorf("the chart's DeviceClass: %v", err)
	}
}

// TestDRAClaim: on each node (containerd 1.7 with CDI off, where only
// nri-gpu can inject; 2.3.7 with CDI on, where containerd injects) a pod
// whose container "gpu" uses a claim made from a template gets exactly
// the GPU the scheduler allocated, and its container "plain" gets none;
// the GPU is held by the claim in the one pool: the device plugin no
// longer offers it, and an annotation pod asking for it by name is
// refused naming the claim and its pod. Deleting the pod unprepares the
// claim and frees the GPU.
func TestDRAClaim(t *testing.T) {
	needCluster(t)
	createTemplate(t, "default", "one-gpu", harness.ClaimSpec(driverName, 1))
	for _, n := range env.nodes {
		t.Run(n.Name, func(t *testing.T) {
			name := "claimer-" + n.Name
			createPod(t, claimPod("default", name, n, "one-gpu", ""))
			p := waitAllRunning(t, "default", name)
			seen := seenBy(t, p, "gpu")
			if len(seen) != 1 {
				t.Fatalf("container gpu sees %v, want one GPU", seen)
			}
			if plain := seenBy(t, p, "plain"); len(plain) != 0 {
				t.Errorf("container plain, which uses no claim, sees %v", plain)
			}
			claim := allocatedClaim(t, p)
			gpu := strings.TrimPrefix(seen[0], "nvidia")
			if got := claim.Status.Allocation.Devices.Results[0].Device; got != "gpu-"+gpu {
				t.Errorf("the claim was allocated %s, the container sees %s", got, seen[0])
			}
			waitAllocatable(t, n, n.GPUs-1)

			waiter := "by-name-" + n.Name
			createPod(t, gpuPod("default", waiter, 0, map[string]string{"gpus.nri-gpu.io": gpu}, n.Name))
			refusedWith(t, "default", waiter, "is held by claim default/"+claim.Name+" of pod default/"+name)
			deletePod(t, "default", waiter)

			deletePod(t, "default", name)
			waitAllocatable(t, n, n.GPUs)
			if log := nriLog(t, n); !strings.Contains(log, "unprepared claim") || !strings.Contains(log, "released devices of DRA claim") {
				t.Errorf("nri-gpu's log on %s does not say it unprepared and released the claim", n.Name)
			}
		})
	}
}

// allocatedClaim returns the claim made for pod p's claim "gpu".
func allocatedClaim(t *testing.T, p *corev1.Pod) *resourceapi.ResourceClaim {
	t.Helper()
	name := ""
	for _, s := range p.Status.ResourceClaimStatuses {
		if s.Name == "gpu" && s.ResourceClaimName != nil {
			name = *s.ResourceClaimName
		}
	}
	if name == "" {
		for _, c := range p.Spec.ResourceClaims {
			if c.Name == "gpu" && c.ResourceClaimName != nil {
				name = *c.ResourceClaimName
			}
		}
	}
	c, err := env.client.ResourceV1().ResourceClaims(p.Namespace).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Status.Allocation == nil || len(c.Status.Allocation.Devices.Results) == 0 {
		t.Fatalf("claim %s is not allocated", name)
	}
	return c
}

// createClass creates a DeviceClass of nri-gpu's driver whose devices
// also match the CEL expression, deleted when the test ends.
func createClass(t *testing.T, name, expr string) {
	t.Helper()
	ctx := context.Background()
	dc := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: resourceapi.DeviceClassSpec{
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: `device.driver == "` + driverName + `" && ` + expr,
		}}},
	}}
	if _, err := env.client.ResourceV1().DeviceClasses().Create(ctx, dc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.client.ResourceV1().DeviceClasses().Delete(ctx, name, metav1.DeleteOptions{}) })
}

// cdiEdits is what a container's OCI spec has of the fake GPUs' CDI
// edits: their device nodes, their env, their cgroup device rules.
type cdiEdits struct {
	Devices []string
	Env     []string
	Rules   []string
}

func editsOf(t *testing.T, p *corev1.Pod, ctr string) cdiEdits {
	t.Helper()
	spec, err := nodeOf(t, p).Ctd.ContainerSpec(containerID(t, p, ctr))
	if err != nil {
		t.Fatal(err)
	}
	var e cdiEdits
	for _, d := range spec.Linux.Devices {
		if strings.HasPrefix(d.Path, "/dev/nvidia") {
			e.Devices = append(e.Devices, fmt.Sprintf("%s %s %d:%d mode %v uid %v gid %v", d.Path, d.Type, d.Major, d.Minor, fmode(d.FileMode), ptrVal(d.UID), ptrVal(d.GID)))
		}
	}
	for _, kv := range spec.Process.Env {
		if strings.HasPrefix(kv, "FAKE_GPU_") {
			e.Env = append(e.Env, kv)
		}
	}
	for _, r := range spec.Linux.Resources.Devices {
		if r.Major != nil && *r.Major == harness.NvidiaMajor {
			e.Rules = append(e.Rules, fmt.Sprintf("%v %s %d:%d %s", r.Allow, r.Type, *r.Major, ptrVal(r.Minor), r.Access))
		}
	}
	return e
}

func ptrVal[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

func fmode[T ~uint32](p *T) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprintf("%#o", uint32(*p))
}

// TestDRASelectorAndParity: a DeviceClass with a CEL selector on an
// attribute (index 1) gets only the matching GPU on each node, and the
// container nri-gpu injects on containerd 1.7 (CDI off) is the one
// containerd 2.3.7's own CDI makes from the same claim, field by field
// (device nodes, env, cgroup device rules but for 1.7's documented "rw"
// for "rwm").
func TestDRASelectorAndParity(t *testing.T) {
	needCluster(t)
	createClass(t, "index-1", `device.attributes["`+driverName+`"].index == 1`)
	createTemplate(t, "default", "gpu-index-1", harness.ClaimSpec("index-1", 1))
	edits := map[string]cdiEdits{}
	for _, n := range env.nodes {
		name := "index-1-" + n.Name
		createPod(t, claimPod("default", name, n, "gpu-index-1", ""))
		p := waitAllRunning(t, "default", name)
		if seen := seenBy(t, p, "gpu"); !slices.Equal(seen, []string{"nvidia1"}) {
			t.Errorf("%s: a claim of class index-1 sees %v, want nvidia1", n.Name, seen)
		}
		edits[n.Name] = editsOf(t, p, "gpu")
		if plain := editsOf(t, p, "plain"); len(plain.Devices)+len(plain.Env) > 0 {
			t.Errorf("%s: container plain got %+v", n.Name, plain)
		}
	}
	t.Logf("nri-gpu on 1.7.35: %+v", edits[env.a.Name])
	t.Logf("containerd 2.3.7's CDI: %+v", edits[env.b.Name])
	if len(edits[env.a.Name].Devices) == 0 {
		t.Errorf("no GPU device node in the claim's container on %s", env.a.Name)
	}
	// containerd 1.7's NRI applies no cgroup rules of an adjustment: it
	// derives "rw" from each device, where CDI's default is "rwm"
	// (docs/container.md): the one, documented, narrowing.
	want := edits[env.b.Name]
	want.Rules = slices.Clone(want.Rules)
	for i, r := range want.Rules {
		want.Rules[i] = strings.TrimSuffix(r, "rwm") + "rw"
	}
	// Each node's GPU 1 has its own UUID, which its spec's env names.
	want.Env = slices.Clone(want.Env)
	for i, kv := range want.Env {
		want.Env[i] = strings.ReplaceAll(kv, env.b.UUID(1), env.a.UUID(1))
	}
	if diff := cmp.Diff(want, edits[env.a.Name]); diff != "" {
		t.Errorf("nri-gpu's injection (node-a) differs from containerd's CDI (node-b) (-cdi +nri-gpu):\n%s", diff)
	}
}

// TestDRASharedClaim: one ResourceClaim used by two pods gives both the
// same GPU (the claim is one holding: policy.exclusive does not refuse
// the second), and the GPU is free once both are gone.
func TestDRASharedClaim(t *testing.T) {
	needCluster(t)
	ctx := context.Background()
	claims := env.client.ResourceV1().ResourceClaims("default")
	rc := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "shared"}, Spec: harness.ClaimSpec(driverName, 1)}
	if _, err := claims.Create(ctx, rc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = claims.Delete(ctx, "shared", metav1.DeleteOptions{}) })
	var seen [][]string
	for _, name := range []string{"sharer-1", "sharer-2"} {
		createPod(t, claimPod("default", name, env.a, "", "shared"))
		seen = append(seen, seenBy(t, waitAllRunning(t, "default", name), "gpu"))
	}
	if len(seen[0]) != 1 || !slices.Equal(seen[0], seen[1]) {
		t.Errorf("the pods of one claim see %v and %v, want the same one GPU", seen[0], seen[1])
	}
	waitAllocatable(t, env.a, env.a.GPUs-1)
	deletePod(t, "default", "sharer-1")
	deletePod(t, "default", "sharer-2")
	waitAllocatable(t, env.a, env.a.GPUs)
}

// TestDRAPrepareRefused: a claim nri-gpu will not prepare (its namespace
// is not among policy.namespaces; its opaque GpuConfig has a field NVIDIA's
// driver does not read) leaves its pod without containers, and nri-gpu's
// reason reaches the pod's events.
func TestDRAPrepareRefused(t *testing.T) {
	needCluster(t)
	ctx := context.Background()
	ns := namespace("dra-outsider")
	if _, err := env.client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.client.CoreV1().Namespaces().Delete(ctx, ns.Name, metav1.DeleteOptions{}) })
	waitServiceAccount(t, ns.Name)
	createTemplate(t, ns.Name, "one-gpu", harness.ClaimSpec(driverName, 1))
	createPod(t, claimPod(ns.Name, "refused", env.a, "one-gpu", ""))
	prepareRefused(t, ns.Name, "refused", "nri-gpu", "policy.namespaces")

	spec := harness.ClaimSpec(driverName, 1)
	spec.Devices.Config = []resourceapi.DeviceClaimConfiguration{{Requests: []string{"gpus"}, DeviceConfiguration: resourceapi.DeviceConfiguration{
		Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: driverName, Parameters: runtime.RawExtension{
			Raw: []byte(`{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "privileged": true}`)}},
	}}}
	createTemplate(t, "default", "odd-config", spec)
	createPod(t, claimPod("default", "odd-config", env.b, "odd-config", ""))
	prepareRefused(t, "default", "odd-config", "opaque device configuration not honoured", `unknown field "privileged"`)
	deletePod(t, "default", "odd-config")
}

// prepareRefused waits until a Warning event of pod namespace/name says
// each of want (kubelet's for a claim it could not prepare), and checks
// that none of its containers runs.
func prepareRefused(t *testing.T, namespace, name string, want ...string) {
	t.Helper()
	ctx := context.Background()
	var event string
	testutil.Within(t, podWait, "the refusal in pod "+name+"'s events", func() bool {
		if e := warning(namespace, name, "", want); e != nil {
			event = e.Reason + ": " + e.Message
		}
		return event != ""
	})
	t.Logf("event %q", event)
	p, err := env.client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range p.Status.ContainerStatuses {
		if s.State.Running != nil {
			t.Errorf("container %s runs, though its claim was not prepared", s.Name)
		}
	}
}

// TestDRAFaults: a prepared claim survives each node fault (nri-gpu's
// pod deleted, the kubelet restarted, containerd restarted): its pod
// keeps its container and GPU, the GPU is still held by the claim (asked
// for by name, refused naming it), and once the pod is deleted kubelet
// unprepares the claim through the nri-gpu now running and the GPU is
// free again.
func TestDRAFaults(t *testing.T) {
	needCluster(t)
	createTemplate(t, "default", "fault-gpu", harness.ClaimSpec(driverName, 1))
	faults := append(nodeFaults(), nodeFault{"DRA driver killed", func() *harness.Node { return env.b }, killDRADriver})
	for _, tc := range faults {
		t.Run(tc.name, func(t *testing.T) {
			n := tc.node()
			createPod(t, claimPod("default", "claim-running", n, "fault-gpu", ""))
			before := waitAllRunning(t, "default", "claim-running")
			held := seenBy(t, before, "gpu")
			claim := allocatedClaim(t, before)

			tc.fault(t, n)
			if err := n.WaitReady(podWait); err != nil {
				t.Fatal(err)
			}
			if err := waitDaemonSetReady(2); err != nil {
				t.Fatal(err)
			}
			after := waitAllRunning(t, "default", "claim-running")
			if seen := seenBy(t, after, "gpu"); !slices.Equal(seen, held) {
				t.Errorf("the claim's container sees %v after the fault, %v before", seen, held)
			}
			createPod(t, gpuPod("default", "by-name", 0, map[string]string{"gpus.nri-gpu.io": strings.TrimPrefix(held[0], "nvidia")}, n.Name))
			refusedWith(t, "default", "by-name", "is held by claim default/"+claim.Name)
			deletePod(t, "default", "by-name")
			deletePod(t, "default", "claim-running")
			waitAllocatable(t, n, n.GPUs)
			waitSlice(t, n, gpuNames(n)...)
		})
	}
}

// killDRADriver kills node n's DRA driver, nri-gpu-dra (the process
// nri-gpu starts beside itself), and waits until nri-gpu has started it
// again and it has registered with kubelet anew: nri-gpu's pool, and so
// every claim, GPU and pod, is untouched (TestDRAFaults checks them).
func killDRADriver(t *testing.T, n *harness.Node) {
	t.Helper()
	pid := draDriver(t, n)
	if pid == 0 {
		t.Fatalf("%s: no nri-gpu-dra process", n.Name)
	}
	registered := strings.Count(nriLog(t, n), "DRA driver registering with kubelet")
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testutil.Within(t, podWait, n.Name+": nri-gpu-dra started again and registered", func() bool {
		again := draDriver(t, n)
		return again != 0 && again != pid && strings.Count(nriLog(t, n), "DRA driver registering with kubelet") > registered
	})
	if log := nriLog(t, n); !strings.Contains(log, "starting it again") {
		t.Errorf("%s: nri-gpu did not say it starts its DRA driver again:\n%s", n.Name, log)
	}
}

// draDriver returns the pid of node n's nri-gpu-dra (0 when none runs):
// the process of that program whose options (link.Options, handed whole)
// name n.
func draDriver(t *testing.T, n *harness.Node) int {
	t.Helper()
	procs, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if filepath.Base(args[0]) != "nri-gpu-dra" || len(args) < 2 {
			continue
		}
		opts, err := link.ParseOptions(args[1:], io.Discard)
		if err == nil && opts.Node == n.Name {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			return pid
		}
	}
	return 0
}

// TestDRASliceFollowsThePool: a GPU held through another door (an
// annotation, the device plugin) leaves its node's ResourceSlice, so the
// scheduler allocates it to no claim, and comes back when it is free; one
// whose device node is gone stays, tainted, until it is there again.
func TestDRASliceFollowsThePool(t *testing.T) {
	needCluster(t)
	createPod(t, gpuPod("default", "annotated", 0, map[string]string{"gpus.nri-gpu.io": "1"}, env.a.Name))
	waitRunning(t, "default", "annotated")
	waitSlice(t, env.a, gpuNames(env.a, 1)...)
	deletePod(t, "default", "annotated")
	waitSlice(t, env.a, gpuNames(env.a)...)

	createPod(t, gpuPod("default", "plugged", 2, nil, env.b.Name))
	p := waitRunning(t, "default", "plugged")
	var held []int
	for _, d := range gpusSeen(t, p) {
		var i int
		if _, err := fmt.Sscanf(d, "nvidia%d", &i); err != nil {
			t.Fatal(err)
		}
		held = append(held, i)
	}
	waitSlice(t, env.b, gpuNames(env.b, held...)...)
	deletePod(t, "default", "plugged")
	waitSlice(t, env.b, gpuNames(env.b)...)

	// A GPU whose device node is gone stays, tainted (TestDeviceHealth).
	removeGPU(t, env.b, 3)
	testutil.Within(t, podWait, env.b.Name+"'s gpu-3 tainted", func() bool { return taintOf(t, env.b, "gpu-3") == "NoSchedule" })
	waitSlice(t, env.b, gpuNames(env.b)...)
	restoreGPU(t, env.b, 3)
	testutil.Within(t, podWait, env.b.Name+"'s gpu-3 untainted", func() bool { return taintOf(t, env.b, "gpu-3") == "" })
}

// TestDRAGapWithoutNRI shows the gap nri-gpu closes. With node-a's
// containerd 1.7.35 (CDI off) running without NRI, so that nri-gpu cannot
// adjust its containers, kubelet still has the claim allocated and
// prepared by nri-gpu's DRA driver and hands the CDI device IDs to
// containerd in the CRI request, which drops them: the pod runs without
// its GPU, as with any DRA driver on such a node. With NRI back, nri-gpu
// finds that container (the claim's CDI devices are in its CRI request,
// start.dra.cdiDevices being cri, and it lacks them) and stops it,
// saying why in the pod's events; kubelet creates it again, through
// nri-gpu, with the GPU; the pod's container that uses no claim runs on.
func TestDRAGapWithoutNRI(t *testing.T) {
	needCluster(t)
	n := env.a
	createTemplate(t, "default", "gap-gpu", harness.ClaimSpec(driverName, 1))
	cfg := n.Ctd.ConfigPath()
	orig, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	const on = "[plugins.\"io.containerd.nri.v1.nri\"]\n  disable = false"
	off := strings.Replace(string(orig), on, "[plugins.\"io.containerd.nri.v1.nri\"]\n  disable = true", 1)
	if off == string(orig) {
		t.Fatalf("%s has no NRI section to turn off", cfg)
	}
	restart := func(config string) {
		t.Helper()
		if err := os.WriteFile(cfg, []byte(config), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := n.Ctd.Restart(); err != nil {
			t.Fatal(err)
		}
	}
	connected := strings.Count(nriLog(t, n), "connected to runtime")
	restart(off)
	restored := false
	restore := func() {
		if !restored {
			restored = true
			restart(string(orig))
		}
	}
	t.Cleanup(restore)

	createPod(t, claimPod("default", "gap", n, "gap-gpu", ""))
	p := waitAllRunning(t, "default", "gap")
	claim := allocatedClaim(t, p)
	testutil.Within(t, podWait, "nri-gpu's DRA driver prepared the claim", func() bool {
		return strings.Contains(nriLog(t, n), "prepared claim")
	})
	if seen := seenBy(t, p, "gpu"); len(seen) != 0 {
		t.Errorf("without NRI, container gpu sees %v: containerd 1.7 with CDI off injected the claim's CDI devices", seen)
	}
	t.Logf("without NRI: claim %s allocated %s and prepared, container gpu sees no GPU", claim.Name, claim.Status.Allocation.Devices.Results[0].Device)

	restore()
	back := time.Now()
	testutil.Within(t, podWait, "nri-gpu connected to node-a's containerd again", func() bool {
		return strings.Count(nriLog(t, n), "connected to runtime") > connected
	})
	// Back, nri-gpu finds the claim's container it did not serve and
	// stops it; kubelet creates it again, through nri-gpu.
	again := createdAgain(t, p, "gpu")
	t.Logf("container gpu running again, through nri-gpu, %s after NRI was back", time.Since(back).Round(time.Millisecond))
	if want, seen := "nvidia"+strings.TrimPrefix(claim.Status.Allocation.Devices.Results[0].Device, "gpu-"), seenBy(t, again, "gpu"); !slices.Equal(seen, []string{want}) {
		t.Errorf("created again, container gpu sees %v, want [%s]", seen, want)
	}
	for _, s := range again.Status.ContainerStatuses {
		if s.Name == "plain" && s.RestartCount > 0 {
			t.Errorf("container plain, which uses no claim, was stopped too (%d restarts)", s.RestartCount)
		}
	}
	if told := stoppedEvents(t, n, again); len(told) != 1 || !strings.Contains(told[0], "nri-gpu stopped container gpu, to be created again through nri-gpu: it was created while nri-gpu was not serving, without ") {
		t.Errorf("the pod's events from nri-gpu: %q", told)
	}
	deletePod(t, "default", "gap")
}

// TestDRASlowAPIServer: when the API server answers nri-gpu's DRA driver
// only after 3 s, or never (the harness holds what it sends), nri-gpu
// still answers each container's creation within containerd's patience
// (plugin_request_timeout, 2 s) on containerd 1.7.35 and 2.3.7: a pod
// of a namespace with no prepared claim is created (without claims), the
// next pods are served by nri-gpu's policy (one asking for "all" is
// refused), a container of a pod its prepared claim is reserved for is
// refused saying why rather than created without its GPU, and nri-gpu
// stays connected: containerd never closes it, and it never reconnects.
func TestDRASlowAPIServer(t *testing.T) {
	needCluster(t)
	createTemplate(t, "default", "slow-gpu", harness.ClaimSpec(driverName, 1))
	const other = "tenant-slow" // no claim of it is prepared
	if _, err := env.client.CoreV1().Namespaces().Create(context.Background(), namespace(other), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = env.client.CoreV1().Namespaces().Delete(context.Background(), other, metav1.DeleteOptions{})
	})
	waitServiceAccount(t, other)
	for i, n := range env.nodes {
		forward := env.forwards[i]
		for _, slow := range []time.Duration{3 * time.Second, harness.Forever} {
			name := fmt.Sprintf("%s, answers after %s", n.Name, slow)
			if slow == harness.Forever {
				name = n.Name + ", no answer"
			}
			t.Run(name, func(t *testing.T) {
				// A pod whose container "gpu" uses a claim, and quits
				// after a while: kubelet creates it again.
				claimer := claimPod("default", "claimer", n, "slow-gpu", "")
				claimer.Spec.Containers[0].Command = []string{"/bin/sh", "-c", "sleep 5; exit 1"}
				createPod(t, claimer)
				testutil.Within(t, podWait, "the claim's container started", func() bool {
					p, err := env.client.CoreV1().Pods("default").Get(context.Background(), "claimer", metav1.GetOptions{})
					return err == nil && len(p.Status.ContainerStatuses) > 0 && p.Status.ContainerStatuses[0].State.Running != nil
				})
				nriBefore, ctdBefore := len(nriLog(t, n)), len(readFile(t, n.Ctd.LogPath))

				forward.Slow(slow)
				defer forward.Slow(0)
				createPod(t, gpuPod(other, "plain", 0, nil, n.Name))
				waitRunning(t, other, "plain")
				createPod(t, gpuPod(other, "all", 0, map[string]string{"gpus.nri-gpu.io": "all"}, n.Name))
				refusedWith(t, other, "all", "set policy.allowAll: true")
				refusedWith(t, "default", "claimer", "was prepared, and this pod may use it", "which DRA claims the container uses cannot be told")

				if log := nriLog(t, n)[nriBefore:]; strings.Contains(log, "NRI connection failed or lost") {
					t.Errorf("nri-gpu lost its connection to containerd:\n%s", log)
				}
				if log := readFile(t, n.Ctd.LogPath)[ctdBefore:]; strings.Contains(log, "closing plugin") {
					t.Errorf("containerd closed nri-gpu:\n%s", log)
				}
				forward.Slow(0)
				// Answered again: the claim's container is created and
				// runs.
				testutil.Within(t, podWait, "the claim's container running again", func() bool {
					p, err := env.client.CoreV1().Pods("default").Get(context.Background(), "claimer", metav1.GetOptions{})
					return err == nil && p.Status.ContainerStatuses[0].State.Running != nil
				})
				deletePod(t, other, "plain")
				deletePod(t, other, "all")
				deletePod(t, "default", "claimer")
				waitAllocatable(t, n, n.GPUs)
			})
		}
	}
}

// readFile returns a file's content.
func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestDRAExtendedResource: a DeviceClass with an extendedResourceName has
// kube-scheduler serve a pod that asks for that resource in its limits
// through DRA (a claim of the pod's own, in its status); on node-a's
// containerd 1.7.35, CDI off, nri-gpu injects the GPU it was allocated.
// The cluster's device plugin serves nvidia.com/gpu, so the class maps a
// name of its own; then, the device plugin turned off and the chart's
// DeviceClass given extendedResourceName: nvidia.com/gpu, a pod asking
// nvidia.com/gpu: 1 is served the same way.
func TestDRAExtendedResource(t *testing.T) {
	needCluster(t)
	ctx := context.Background()
	const resource = "example.com/dra-gpu"
	dc := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "gpu-extended"}, Spec: resourceapi.DeviceClassSpec{
		Selectors:            []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "` + driverName + `"`}}},
		ExtendedResourceName: new(string(resource)),
	}}
	if _, err := env.client.ResourceV1().DeviceClasses().Create(ctx, dc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.client.ResourceV1().DeviceClasses().Delete(ctx, dc.Name, metav1.DeleteOptions{}) })

	p := harness.SleepPod("default", "extended", 0)
	p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": env.a.Name}
	p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{resource: apiresource.MustParse("1")}
	createPod(t, p)
	got := waitRunning(t, "default", "extended")
	ext := got.Status.ExtendedResourceClaimStatus
	if ext == nil || ext.ResourceClaimName == "" {
		t.Fatalf("pod extended has no extended-resource claim in its status: %+v", got.Status)
	}
	claim, err := env.client.ResourceV1().ResourceClaims("default").Get(ctx, ext.ResourceClaimName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if claim.Status.Allocation == nil || len(claim.Status.Allocation.Devices.Results) != 1 {
		t.Fatalf("claim %s: allocation %+v", claim.Name, claim.Status.Allocation)
	}
	dev := claim.Status.Allocation.Devices.Results[0].Device
	seen := gpusSeen(t, got)
	if want := "nvidia" + strings.TrimPrefix(dev, "gpu-"); len(seen) != 1 || seen[0] != want {
		t.Errorf("pod extended (allocated %s through DRA) sees %v, want [%s]", dev, seen, want)
	}
	t.Logf("pod extended: limits %s: 1, claim %s allocated %s, container sees %v", resource, claim.Name, dev, seen)
	deletePod(t, "default", "extended")

	// The migration path: the device plugin off, the chart's DeviceClass
	// maps nvidia.com/gpu, and a pod asking nvidia.com/gpu: 1 as it
	// always did gets its GPU through DRA.
	both := env.nodes
	off := valuesFile(t, "extended-values.yaml", `config:
  devicePlugin:
    resources: []
dra:
  deviceClass:
    extendedResourceName: nvidia.com/gpu
`)
	restartWith(t, both, driverName, env.values, off)
	t.Cleanup(func() {
		restartWith(t, both, driverName, env.values)
		for _, n := range both {
			waitAllocatable(t, n, n.GPUs)
		}
	})
	waitAllocatable(t, env.a, 0)
	p = gpuPod("default", "migrated", 1, nil, "")
	p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": env.a.Name}
	createPod(t, p)
	got = waitRunning(t, "default", "migrated")
	if ext := got.Status.ExtendedResourceClaimStatus; ext == nil || ext.ResourceClaimName == "" {
		t.Fatalf("pod migrated (nvidia.com/gpu: 1, device plugin off) has no extended-resource claim in its status: %+v", got.Status)
	}
	claim, err = env.client.ResourceV1().ResourceClaims("default").Get(ctx, got.Status.ExtendedResourceClaimStatus.ResourceClaimName, metav1.GetOptions{})
	if err != nil || claim.Status.Allocation == nil || len(claim.Status.Allocation.Devices.Results) != 1 {
		t.Fatalf("pod migrated's claim: %v, %+v", err, claim)
	}
	dev = claim.Status.Allocation.Devices.Results[0].Device
	if seen, want := gpusSeen(t, got), "nvidia"+strings.TrimPrefix(dev, "gpu-"); len(seen) != 1 || seen[0] != want {
		t.Errorf("pod migrated (allocated %s through DRA) sees %v, want [%s]", dev, seen, want)
	}
	t.Logf("pod migrated: limits nvidia.com/gpu: 1 with the device plugin off, claim %s allocated %s through the chart's DeviceClass", claim.Name, dev)
	deletePod(t, "default", "migrated")
}
