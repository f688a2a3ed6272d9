package cluster

import (
	"context"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/test/harness"
)

// A fault on a node (nri-gpu's pod deleted, the kubelet or containerd
// restarted) leaves the node's running GPU pods with their devices (the
// same containers, the same GPUs), gives no GPU to two pods, and new
// pods are served again once nri-gpu is Ready. Each case ends with the
// node as it began.
func TestNodeFaults(t *testing.T) {
	needCluster(t)
	for _, tc := range nodeFaults() {
		t.Run(tc.name, func(t *testing.T) {
			n := tc.node()
			createPod(t, gpuPod("default", "running", 1, nil, n.Name))
			before := waitRunning(t, "default", "running")
			held := gpusSeen(t, before)

			tc.fault(t, n)
			if err := n.WaitReady(podWait); err != nil {
				t.Fatal(err)
			}
			if err := waitDaemonSetReady(2); err != nil {
				t.Fatal(err)
			}

			after := waitRunning(t, "default", "running")
			if id := after.Status.ContainerStatuses[0].ContainerID; id != before.Status.ContainerStatuses[0].ContainerID {
				t.Errorf("the GPU pod's container changed (%s, then %s)", before.Status.ContainerStatuses[0].ContainerID, id)
			}
			if seen := gpusSeen(t, after); !slices.Equal(seen, held) {
				t.Errorf("the GPU pod sees %v after the fault, %v before", seen, held)
			}
			// nri-gpu still holds it: asked for by name, it is refused.
			createPod(t, gpuPod("default", "by-name", 0, map[string]string{"gpus.nri-gpu.io": strings.TrimPrefix(held[0], "nvidia")}, n.Name))
			refusedWith(t, "default", "by-name", "is held by pod default/running", "policy.exclusive")
			deletePod(t, "default", "by-name")
			// A new pod is served, with another GPU.
			createPod(t, gpuPod("default", "new", 1, nil, n.Name))
			if seen := gpusSeen(t, waitRunning(t, "default", "new")); len(seen) != 1 || seen[0] == held[0] {
				t.Errorf("a new pod after the fault sees %v; want one GPU, not %v", seen, held)
			}
			noGPUTwice(t, n)
		})
	}
}

// nodeFault is a fault on a node, and the node it happens on.
type nodeFault struct {
	name  string
	node  func() *harness.Node
	fault func(t *testing.T, n *harness.Node)
}

// nodeFaults are nri-gpu's pod deleted (node-a), node-b's kubelet
// restarted and node-a's containerd restarted.
func nodeFaults() []nodeFault {
	return []nodeFault{
		{"nri-gpu pod deleted", func() *harness.Node { return env.a }, replaceNRIPod},
		{"kubelet restarted", func() *harness.Node { return env.b }, func(t *testing.T, n *harness.Node) {
			registered := strings.Count(devicePluginLog(t, n), "registered with kubelet")
			n.StopKubelet()
			if err := n.StartKubelet(); err != nil {
				t.Fatal(err)
			}
			// nri-gpu sees kubelet's new socket and registers again.
			testutil.Within(t, podWait, "nri-gpu's device plugin registered again", func() bool {
				return strings.Count(devicePluginLog(t, n), "registered with kubelet") > registered
			})
		}},
		{"containerd restarted", func() *harness.Node { return env.a }, func(t *testing.T, n *harness.Node) {
			connected := strings.Count(nriLog(t, n), "connected to runtime")
			if err := n.Ctd.Restart(); err != nil {
				t.Fatal(err)
			}
			// The DaemonSet's Ready lags by a probe period or more: until
			// nri-gpu is connected again, containerd 1.7 creates
			// containers without it (docs/reliability.md, "Failing
			// closed"), which is not what these tests look at.
			testutil.Within(t, podWait, "nri-gpu connected to "+n.Name+"'s containerd again", func() bool {
				return strings.Count(nriLog(t, n), "connected to runtime") > connected
			})
		}},
	}
}

// TestNodeDown: with node-a's kubelet stopped and its pods deleted from
// the API (nri-gpu's among them), node-b's GPU pods run on with their
// GPUs, its allocatable is the same, and it serves a new pod. When
// node-a's kubelet is back, with a new nri-gpu pod, node-a serves GPU
// pods again.
func TestNodeDown(t *testing.T) {
	needCluster(t)
	ctx := context.Background()
	createPod(t, gpuPod("default", "on-a", 1, nil, env.a.Name))
	waitRunning(t, "default", "on-a")
	createPod(t, gpuPod("default", "on-b", 2, nil, env.b.Name))
	onB := waitRunning(t, "default", "on-b")
	heldB := gpusSeen(t, onB)

	env.a.StopKubelet()
	restarted := false
	restart := func() {
		if restarted {
			return
		}
		restarted = true
		if err := env.a.StartKubelet(); err != nil {
			t.Fatal(err)
		}
		if err := env.a.WaitReady(podWait); err != nil {
			t.Fatal(err)
		}
		if err := waitDaemonSetReady(2); err != nil {
			t.Fatal(err)
		}
		// kubelet admits no GPU pod until nri-gpu's device plugin is
		// registered with it again (it fails them: UnexpectedAdmissionError).
		testutil.Within(t, podWait, "nri-gpu's device plugin registered with node-a's new kubelet", func() bool {
			return strings.Contains(devicePluginLog(t, env.a), "registered with kubelet")
		})
	}
	t.Cleanup(restart)
	// What an operator does with a dead node's pods: delete them at once.
	for _, ns := range []string{"default", nriNamespace} {
		pods, err := env.client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + env.a.Name})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pods.Items {
			if err := env.client.CoreV1().Pods(ns).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	after := waitRunning(t, "default", "on-b")
	if after.Status.ContainerStatuses[0].ContainerID != onB.Status.ContainerStatuses[0].ContainerID {
		t.Errorf("node-b's GPU pod was restarted while node-a was down")
	}
	if seen := gpusSeen(t, after); !slices.Equal(seen, heldB) {
		t.Errorf("node-b's GPU pod sees %v, %v before", seen, heldB)
	}
	if got := allocatable(t, env.b); got != int64(env.b.GPUs) {
		t.Errorf("node-b's allocatable is %d with node-a down, want %d", got, env.b.GPUs)
	}
	createPod(t, gpuPod("default", "new-on-b", 2, nil, env.b.Name))
	if seen := gpusSeen(t, waitRunning(t, "default", "new-on-b")); len(seen) != 2 || slices.ContainsFunc(seen, func(g string) bool { return slices.Contains(heldB, g) }) {
		t.Errorf("a new pod on node-b sees %v; want two GPUs other than %v", seen, heldB)
	}
	noGPUTwice(t, env.b)

	restart()
	createPod(t, gpuPod("default", "back-on-a", 1, nil, ""))
	createPod(t, gpuPod("default", "back-on-a-2", 1, nil, env.a.Name))
	for _, name := range []string{"back-on-a", "back-on-a-2"} {
		if seen := gpusSeen(t, waitRunning(t, "default", name)); len(seen) != 1 {
			t.Errorf("%s sees %v once node-a is back, want one GPU", name, seen)
		}
	}
	noGPUTwice(t, env.a)
}

// noGPUTwice checks that no two running pods of node n see one GPU.
func noGPUTwice(t *testing.T, n *harness.Node) {
	t.Helper()
	pods, err := env.client.CoreV1().Pods("").List(context.Background(), metav1.ListOptions{FieldSelector: "spec.nodeName=" + n.Name})
	if err != nil {
		t.Fatal(err)
	}
	who := map[string]string{}
	for i, p := range pods.Items {
		if p.Namespace == nriNamespace || p.Status.Phase != corev1.PodRunning {
			continue
		}
		for _, g := range gpusSeen(t, &pods.Items[i]) {
			if other, ok := who[g]; ok {
				t.Errorf("%s: %s is seen by pods %s and %s/%s", n.Name, g, other, p.Namespace, p.Name)
			}
			who[g] = p.Namespace + "/" + p.Name
		}
	}
}

// replaceNRIPod deletes nri-gpu's pod on node n and waits until the
// DaemonSet controller has made a new one.
func replaceNRIPod(t *testing.T, n *harness.Node) {
	t.Helper()
	old := nriPods(t)[n.Name]
	// Gone already is as good: a helm upgrade that changed the pod's
	// template has the DaemonSet replace it meanwhile.
	if err := env.client.CoreV1().Pods(nriNamespace).Delete(context.Background(), old.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	testutil.Within(t, podWait, n.Name+": a new nri-gpu pod", func() bool {
		p, ok := nriPods(t)[n.Name]
		return ok && p.UID != old.UID
	})
}

// TestUnservedRestarted: node-a's nri-gpu hangs (SIGSTOP), so containerd
// 1.7 drops it once a request times out and creates the containers of a
// pod asking for a GPU by count without it: the pod runs, GPU-less. When
// nri-gpu goes on (SIGCONT, or kubelet restarts it for its failed
// liveness probe) it finds that container, stops it with the reason in
// its log and the pod's events, and kubelet creates it again, through
// nri-gpu: the pod ends Running with one GPU, in a second container.
func TestUnservedRestarted(t *testing.T) {
	needCluster(t)
	n := env.a
	resume := hang(t, n)

	createPod(t, gpuPod("default", "unserved", 0, map[string]string{"gpu-count.nri-gpu.io": "1"}, n.Name))
	first := waitRunning(t, "default", "unserved")
	if seen := gpusSeen(t, first); len(seen) > 0 {
		t.Fatalf("created while nri-gpu hung, the pod sees %v: nri-gpu was not away", seen)
	}
	resumed := time.Now()
	resume()
	again := createdAgain(t, first, "main")
	t.Logf("the pod's container running again, through nri-gpu, %s after nri-gpu went on", time.Since(resumed).Round(time.Millisecond))
	if seen := gpusSeen(t, again); len(seen) != 1 {
		t.Errorf("created again, the pod sees %v, want one GPU", seen)
	}
	if log := nriLog(t, n); !strings.Contains(log, "stopped the container, to be created again through nri-gpu: it was created while nri-gpu was not serving, without 1 of the 1 devices it counts") {
		t.Errorf("nri-gpu's log does not say why it stopped the container:\n%s", log)
	}
	// The pod's events say it too, as kubectl describe lists them (by the
	// pod's UID).
	if told := stoppedEvents(t, n, again); len(told) != 1 || !strings.Contains(told[0], "nri-gpu stopped container main, to be created again through nri-gpu: it was created while nri-gpu was not serving, without 1 of the 1 devices it counts") {
		t.Errorf("the pod's events from nri-gpu: %q", told)
	}
	noGPUTwice(t, n)
}

// TestRequiredWhileAway: the chart's MutatingAdmissionPolicy annotates a
// pod asking for a GPU (and no other pod) as requiring nri-gpu. On
// node-b (containerd 2.3.7, NRI's default validator on) with nri-gpu
// hung (SIGSTOP, dropped by containerd at its request timeout), such a
// pod's container is not created, rather than started GPU-less; once
// nri-gpu goes on, kubelet's retry is served and the pod runs with its
// GPU, its first container.
func TestRequiredWhileAway(t *testing.T) {
	needCluster(t)
	n := env.b
	plain := createPod(t, gpuPod("default", "plain", 0, nil, n.Name))
	if _, ok := plain.Annotations["required-plugins.noderesource.dev"]; ok {
		t.Errorf("a pod asking for no device is annotated %v", plain.Annotations)
	}
	deletePod(t, "default", "plain")
	resume := hang(t, n)
	p := createPod(t, gpuPod("default", "required", 0, map[string]string{"gpu-count.nri-gpu.io": "1"}, n.Name))
	if got := p.Annotations["required-plugins.noderesource.dev"]; got != `["nri-gpu"]` {
		t.Fatalf("the GPU pod is annotated %v, want nri-gpu required", p.Annotations)
	}
	// Well past containerd's 2 s request timeout: kubelet has tried.
	testutil.Within(t, podWait, "kubelet told the container cannot be created", func() bool {
		return warning("default", "required", "", []string{`required plugin "nri-gpu" not present`}) != nil
	})
	if got, err := env.client.CoreV1().Pods("default").Get(context.Background(), "required", metav1.GetOptions{}); err != nil || got.Status.Phase == corev1.PodRunning {
		t.Fatalf("with nri-gpu away the pod is %v (%v), want it not running", got.Status.Phase, err)
	}
	resume()
	running := waitRunning(t, "default", "required")
	if seen := gpusSeen(t, running); len(seen) != 1 {
		t.Errorf("the pod sees %v, want one GPU", seen)
	}
	if r := running.Status.ContainerStatuses[0].RestartCount; r != 0 {
		t.Errorf("the pod's container restarted %d times, want it created once, with its GPU", r)
	}
}

// hang stops node n's nri-gpu (SIGSTOP) and returns what lets it go on;
// it goes on when the test ends, which waits for the DaemonSet's Ready.
func hang(t *testing.T, n *harness.Node) func() {
	t.Helper()
	pid := nriPid(t, n)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	continued := false
	resume := func() {
		if !continued {
			continued = true
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	t.Cleanup(func() {
		resume()
		if err := waitDaemonSetReady(2); err != nil {
			t.Error(err)
		}
	})
	return resume
}

// stoppedEvents waits for the events nri-gpu on node n posted about pod
// p for containers it stopped, as kubectl describe finds them (by the
// pod's UID), and returns their messages.
func stoppedEvents(t *testing.T, n *harness.Node, p *corev1.Pod) []string {
	t.Helper()
	var told []string
	testutil.Within(t, podWait, "nri-gpu's event of pod "+p.Name, func() bool {
		evs, err := env.client.CoreV1().Events(p.Namespace).List(context.Background(), metav1.ListOptions{
			FieldSelector: "involvedObject.uid=" + string(p.UID) + ",reason=StoppedByNRIGPU"})
		if err != nil {
			return false
		}
		told = nil
		for _, e := range evs.Items {
			if e.Type == corev1.EventTypeWarning && e.ReportingController == "nri-gpu.io/nri-gpu" && e.ReportingInstance == n.Name {
				told = append(told, e.Message)
			}
		}
		return len(told) > 0
	})
	return told
}

// createdAgain waits until container ctr of pod first runs again, a
// container other than first's (kubelet created it again), and returns
// the pod then.
func createdAgain(t *testing.T, first *corev1.Pod, ctr string) *corev1.Pod {
	t.Helper()
	was := containerID(t, first, ctr)
	var again *corev1.Pod
	testutil.Within(t, podWait, "container "+ctr+" of pod "+first.Name+" created again", func() bool {
		p, err := env.client.CoreV1().Pods(first.Namespace).Get(context.Background(), first.Name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		for _, s := range p.Status.ContainerStatuses {
			if s.Name == ctr && s.RestartCount > 0 && s.State.Running != nil && runtimeID(s.ContainerID) != was {
				again = p
				return true
			}
		}
		return false
	})
	return again
}
