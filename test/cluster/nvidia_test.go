package cluster

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/nri-gpu/nri-gpu/internal/mpsstandin"
	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/test/harness"
)

// ubuntuStandIn is the image NVIDIA's demo manifests run, imported on
// each node as a stand-in (never pulled): busybox, a bash that runs its
// sh, and an nvidia-smi -L that lists the GPU device nodes the container
// has.
const ubuntuStandIn = "docker.io/library/ubuntu:22.04"

// ubuntuFiles are the stand-in's files beside busybox.
var ubuntuFiles = []harness.File{
	{Name: "bin/bash", Mode: 0o755, Data: []byte("#!/bin/sh\nexec /bin/sh \"$@\"\n")},
	{Name: "usr/bin/nvidia-smi", Mode: 0o755, Data: []byte(`#!/bin/sh
# A stand-in for nvidia-smi -L: one line per GPU device node.
i=0
for d in /dev/nvidia[0-9]*; do
  [ -e "$d" ] || continue
  echo "GPU $i: stand-in ($d)"
  i=$((i+1))
done
`)},
}

// nbodyStandIn is the CUDA sample image of NVIDIA's MPS demo, a stand-in
// whose /tmp/sample sleeps (the pod's containers must keep running).
const nbodyStandIn = "nvcr.io/nvidia/k8s/cuda-sample:nbody-cuda11.6.0-ubuntu18.04"

// nbodyFiles are its files beside busybox.
var nbodyFiles = []harness.File{
	ubuntuFiles[0],
	{Name: "tmp/sample", Mode: 0o755, Data: []byte("#!/bin/sh\nexec sleep 3600\n")},
}

// nvidiaValues run nri-gpu's DRA driver under NVIDIA's driver name (the
// chart's DeviceClass is then gpu.nvidia.com), in the namespaces NVIDIA's
// demo manifests make.
const nvidiaValues = `config:
  policy:
    namespaces: [default, "tenant-*", "gpu-test*", "gpu-share-*"]
  dra:
    driverName: gpu.nvidia.com
`

// TestNVIDIAManifests: NVIDIA's DRA driver's published demo manifests
// (testdata/nvidia, unchanged), with nri-gpu's DRA driver named
// gpu.nvidia.com, each with the outcome their comments and README say:
// the quickstart's two pods with a distinct GPU each, one pod's two
// containers sharing one, two pods sharing a global claim; the
// consumable-shares deployments (4 replicas of one share each, 2 of 4Gi
// of memory each, 2 asking nothing) all running on shared GPUs, each
// claim allocated a share; the MPS demo's two containers MPS clients
// with its GpuConfig's limits, and a claim of 30Gi without one bound to
// what it was allocated.
func TestNVIDIAManifests(t *testing.T) {
	needCluster(t)
	nv := valuesFile(t, "nvidia-values.yaml", nvidiaValues)
	both := env.nodes
	restartWith(t, both, "gpu.nvidia.com", env.values, nv)
	t.Cleanup(func() { restartWith(t, both, driverName, env.values) })

	apply(t, "gpu-test1.yaml", "gpu-test2.yaml", "gpu-test3.yaml")
	// gpu-test1: two pods, one container each, each a distinct GPU.
	p1, p2 := waitAllRunning(t, "gpu-test1", "pod1"), waitAllRunning(t, "gpu-test1", "pod2")
	g1, g2 := gpuOf(t, p1, "ctr"), gpuOf(t, p2, "ctr")
	if g1 == g2 {
		t.Errorf("gpu-test1: both pods have %s, want distinct GPUs", g1)
	}
	// gpu-test2: one pod, two containers sharing one GPU.
	p := waitAllRunning(t, "gpu-test2", "pod")
	if a, b := gpuOf(t, p, "ctr0"), gpuOf(t, p, "ctr1"); a != b {
		t.Errorf("gpu-test2: containers have %s and %s, want one GPU shared", a, b)
	}
	// gpu-test3: one global claim, two pods sharing its GPU.
	q1, q2 := waitAllRunning(t, "gpu-test3", "pod1"), waitAllRunning(t, "gpu-test3", "pod2")
	if a, b := gpuOf(t, q1, "ctr"), gpuOf(t, q2, "ctr"); a != b {
		t.Errorf("gpu-test3: pods have %s and %s, want the claim's one GPU", a, b)
	}
	out, err := nodeOf(t, p1).Ctd.Exec(containerID(t, p1, "ctr"), "nvidia-smi", "-L")
	if err != nil || strings.Count(out, "GPU ") != 1 {
		t.Errorf("gpu-test1 pod1: nvidia-smi -L: %v: %q, want one GPU", err, out)
	}
	t.Logf("quickstart: gpu-test1 %s and %s; gpu-test2 %s; gpu-test3 %s; pod1's nvidia-smi -L: %s", g1, g2, gpuOf(t, p, "ctr0"), gpuOf(t, q1, "ctr"), strings.TrimSpace(out))
	deleteNamespaces(t, "gpu-test1", "gpu-test2", "gpu-test3")

	// gpu-test5: one claim, a request time-sliced and one MPS, on GPUs
	// policy.sharing leaves unshared: both containers of each request
	// share its GPU, the MPS ones as clients of a daemon nri-gpu started
	// for the claim, bound by its GpuConfig; the daemon stops with it.
	mpsStandIn(t, both)
	apply(t, "gpu-test5.yaml")
	p5 := waitAllRunning(t, "gpu-test5", "pod0")
	ts, mpsGPU := gpuOf(t, p5, "ts-ctr0"), gpuOf(t, p5, "mps-ctr0")
	if ts == mpsGPU || gpuOf(t, p5, "ts-ctr1") != ts || gpuOf(t, p5, "mps-ctr1") != mpsGPU {
		t.Errorf("gpu-test5: ts containers %s and %s, mps containers %s and %s; want one GPU for each request",
			ts, gpuOf(t, p5, "ts-ctr1"), mpsGPU, gpuOf(t, p5, "mps-ctr1"))
	}
	n5 := nodeOf(t, p5)
	uuid := n5.UUID(int(mpsGPU[len(mpsGPU)-1] - '0'))
	for _, ctr := range []string{"ts-ctr0", "ts-ctr1", "mps-ctr0", "mps-ctr1"} {
		pipe, env := mpsClient(t, p5, ctr)
		switch {
		case strings.HasPrefix(ctr, "ts") && (pipe != "" || len(env) > 0):
			t.Errorf("gpu-test5 %s: an MPS client (%s, %v), want its GPU time-sliced", ctr, pipe, env)
		case strings.HasPrefix(ctr, "mps") && (pipe != "/run/nri-gpu/mps/"+uuid+"/pipe" ||
			!slices.Equal(env, []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M"})):
			t.Errorf("gpu-test5 %s: MPS pipe %q, limits %v; want the claim's daemon of %s, 50%% and 10240M", ctr, pipe, env, uuid)
		}
	}
	daemonLog := filepath.Join(n5.Dir, "run", "nri-gpu", "mps", uuid, "log", mpsstandin.Log)
	log5, _ := os.ReadFile(daemonLog)
	if !strings.Contains(string(log5), `run args=["-d"] CUDA_VISIBLE_DEVICES="`+uuid+`"`) {
		t.Errorf("gpu-test5: no daemon started for %s:\n%s", mpsGPU, log5)
	}
	t.Logf("gpu-test5: ts-ctr0/1 on %s; mps-ctr0/1 on %s, clients of its daemon with 50%% and 10240M", ts, mpsGPU)
	deleteNamespaces(t, "gpu-test5")
	testutil.Within(t, podWait, "gpu-test5's MPS daemon stopped", func() bool {
		log, _ := os.ReadFile(daemonLog)
		return strings.HasSuffix(string(log), "command quit\n")
	})

	// Consumable shares: every GPU shared 4 ways, 80Gi of memory, counted
	// as a quota (time-slicing cannot bound memory).
	shared := valuesFile(t, "nvidia-shares-values.yaml", `config:
  policy:
    sharing: [{devices: ["nvidia.com/gpu=*"], replicas: 4, memory: 80Gi, memoryQuota: true, memoryRequest: {step: 1Mi}}]
`)
	upgrade(t, env.values, nv, shared)
	waitShared(t, both)
	apply(t, "integer-sharing.yaml", "memory-sharing.yaml", "unlimited-sharing.yaml")
	for _, c := range []struct {
		ns     string
		pods   int
		memory string // what each claim consumed
	}{{"gpu-share-integer", 4, "20Gi"}, {"gpu-share-memory", 2, "4Gi"}, {"gpu-share-unlimited", 2, "20Gi"}} {
		pods := waitNamespaceRunning(t, c.ns, c.pods)
		var where []string
		for _, p := range pods {
			r := allocatedClaim(t, &p).Status.Allocation.Devices.Results[0]
			mem := r.ConsumedCapacity["memory"]
			if r.ShareID == nil || mem.String() != c.memory {
				t.Errorf("%s pod %s: allocated %s, share %v, memory %s; want a share with %s", c.ns, p.Name, r.Device, r.ShareID, mem.String(), c.memory)
			}
			where = append(where, p.Spec.NodeName+"/"+r.Device+"="+gpuOf(t, &p, "ctr"))
		}
		slices.Sort(where)
		t.Logf("%s: %d pods Running: %v", c.ns, len(pods), where)
	}
	deleteNamespaces(t, "gpu-share-integer", "gpu-share-memory", "gpu-share-unlimited")

	// MPS: every GPU shared 2 ways by nri-gpu's MPS daemons (the stand-in
	// control program), 80Gi: a share is allowed 50% of the compute and
	// 40Gi, so the demo claim's GpuConfig (50%, 10Gi) is within it, and
	// both containers using the claim are its clients with those limits.
	mps := valuesFile(t, "nvidia-mps-values.yaml", `config:
  policy:
    sharing: [{devices: ["nvidia.com/gpu=*"], replicas: 2, strategy: mps, memory: 80Gi}]
`)
	upgrade(t, env.values, nv, mps)
	waitShared(t, both)
	apply(t, "gpu-test-mps.yaml")
	p = waitAllRunning(t, "gpu-test-mps", "test-pod")
	var gpus []string
	for _, ctr := range []string{"mps-ctr0", "mps-ctr1"} {
		gpus = append(gpus, gpuOf(t, p, ctr))
		envHas(t, p, ctr, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M")
	}
	if gpus[0] != gpus[1] {
		t.Errorf("gpu-test-mps: containers have %v, want the claim's one GPU", gpus)
	}
	t.Logf("gpu-test-mps: both containers on %s, MPS clients with 50%% and 10240M", gpus[0])
	deleteNamespaces(t, "gpu-test-mps")

	// A claim without a GpuConfig: its clients get what it was allocated,
	// 30Gi of memory and its one share's 50%.
	createTemplate(t, "default", "mps-30gi", memoryClaimSpec("gpu.nvidia.com", "30Gi"))
	createPod(t, claimPod("default", "mps-30gi", env.b, "mps-30gi", ""))
	p = waitAllRunning(t, "default", "mps-30gi")
	envHas(t, p, "gpu", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=30720M")
	deletePod(t, "default", "mps-30gi")
}

// mpsClient returns what container ctr of pod p has of an MPS client:
// the host directory mounted as its pipe directory, and its CUDA_MPS_
// limits.
func mpsClient(t *testing.T, p *corev1.Pod, ctr string) (pipe string, limits []string) {
	t.Helper()
	spec, err := nodeOf(t, p).Ctd.ContainerSpec(containerID(t, p, ctr))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range spec.Mounts {
		if m.Destination == "/tmp/nvidia-mps" {
			pipe = m.Source
		}
	}
	for _, e := range spec.Process.Env {
		if strings.HasPrefix(e, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=") || strings.HasPrefix(e, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=") {
			limits = append(limits, e)
		}
	}
	slices.Sort(limits)
	return pipe, limits
}

// envHas checks that the environment of container ctr of pod p, in its
// OCI spec, has each of want.
func envHas(t *testing.T, p *corev1.Pod, ctr string, want ...string) {
	t.Helper()
	spec, err := nodeOf(t, p).Ctd.ContainerSpec(containerID(t, p, ctr))
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range want {
		if !slices.Contains(spec.Process.Env, w) {
			t.Errorf("pod %s/%s container %s: no %s in %v", p.Namespace, p.Name, ctr, w, spec.Process.Env)
		}
	}
}

// waitShared waits until every GPU of nodes is offered to several claims
// in the slice of NVIDIA's driver name (the reloaded policy published):
// until then kube-scheduler would allocate whole GPUs.
func waitShared(t *testing.T, nodes []*harness.Node) {
	t.Helper()
	for _, n := range nodes {
		testutil.Within(t, podWait, n.Name+"'s GPUs offered for several claims", func() bool {
			devs := sliceOf(t, n, "gpu.nvidia.com")
			for _, d := range devs {
				if d.AllowMultipleAllocations == nil || !*d.AllowMultipleAllocations {
					return false
				}
			}
			return len(devs) == n.GPUs
		})
	}
}

// apply creates the objects of the manifests in testdata/nvidia, as they
// are (kubectl apply, for the kinds they hold).
func apply(t *testing.T, files ...string) {
	t.Helper()
	ctx := context.Background()
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join("testdata", "nvidia", f))
		if err != nil {
			t.Fatal(err)
		}
		r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
		for {
			doc, err := r.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if onlyComments(doc) {
				continue
			}
			obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if err := create(ctx, obj); err != nil {
				t.Fatalf("%s: creating %T: %v", f, obj, err)
			}
		}
	}
}

// onlyComments reports whether a YAML document holds no object.
func onlyComments(doc []byte) bool {
	for _, line := range bytes.Split(doc, []byte("\n")) {
		if l := bytes.TrimSpace(line); len(l) > 0 && l[0] != '#' && string(l) != "---" {
			return false
		}
	}
	return true
}

// create creates one object of the kinds NVIDIA's manifests hold.
func create(ctx context.Context, obj runtime.Object) error {
	c := env.client
	var err error
	switch o := obj.(type) {
	case *corev1.Namespace:
		_, err = c.CoreV1().Namespaces().Create(ctx, o, metav1.CreateOptions{})
	case *corev1.Pod:
		_, err = c.CoreV1().Pods(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
	case *appsv1.Deployment:
		_, err = c.AppsV1().Deployments(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
	case *resourceapi.ResourceClaim:
		_, err = c.ResourceV1().ResourceClaims(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
	case *resourceapi.ResourceClaimTemplate:
		_, err = c.ResourceV1().ResourceClaimTemplates(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
	default:
		err = fmt.Errorf("kind %T not applied here", obj)
	}
	return err
}

// deleteNamespaces deletes namespaces and waits until they are gone, so
// that what their pods held is released.
func deleteNamespaces(t *testing.T, names ...string) {
	t.Helper()
	ctx := context.Background()
	for _, ns := range names {
		_ = env.client.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	}
	for _, ns := range names {
		testutil.Within(t, 2*podWait, "namespace "+ns+" gone", func() bool {
			_, err := env.client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
			return err != nil
		})
	}
}

// waitNamespaceRunning waits until namespace ns has want pods, each with
// every container running, and returns them.
func waitNamespaceRunning(t *testing.T, ns string, want int) []corev1.Pod {
	t.Helper()
	var pods []corev1.Pod
	testutil.Within(t, 2*podWait, fmt.Sprintf("%d pods Running in %s", want, ns), func() bool {
		list, err := env.client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{})
		if err != nil || len(list.Items) != want {
			return false
		}
		for _, p := range list.Items {
			if p.Status.Phase != corev1.PodRunning || len(p.Status.ContainerStatuses) != len(p.Spec.Containers) {
				return false
			}
			for _, s := range p.Status.ContainerStatuses {
				if !s.Ready {
					return false
				}
			}
		}
		pods = list.Items
		return true
	})
	return pods
}

// gpuOf names the one GPU container ctr of pod p has: its node and
// device node; it fails the test unless there is exactly one.
func gpuOf(t *testing.T, p *corev1.Pod, ctr string) string {
	t.Helper()
	seen := seenBy(t, p, ctr)
	if len(seen) != 1 {
		t.Fatalf("pod %s/%s container %s has GPUs %v, want one", p.Namespace, p.Name, ctr, seen)
	}
	return p.Spec.NodeName + ":" + seen[0]
}
