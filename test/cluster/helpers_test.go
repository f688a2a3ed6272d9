package cluster

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/test/harness"
)

// podWait is how long a pod may take to be scheduled, created and run
// (kubelet retries a failed creation with a back-off).
const podWait = 90 * time.Second

// nriLog returns what nri-gpu's container on node n has logged (the
// kubelets serve no logs: their server is off).
func nriLog(t *testing.T, n *harness.Node) string {
	t.Helper()
	p, ok := nriPods(t)[n.Name]
	if !ok {
		t.Fatalf("no nri-gpu pod on %s", n.Name)
	}
	return n.PodLog(nriNamespace, p.Name, "nri-gpu")
}

// devicePluginLog returns what the container that registers nri-gpu's
// device plugin with kubelet on node n has logged: the relay's (the
// chart's, on 1.36 and later), else nri-gpu's.
func devicePluginLog(t *testing.T, n *harness.Node) string {
	t.Helper()
	p, ok := nriPods(t)[n.Name]
	if !ok {
		t.Fatalf("no nri-gpu pod on %s", n.Name)
	}
	for _, c := range p.Spec.Containers {
		if c.Name == "relay" {
			return n.PodLog(nriNamespace, p.Name, "relay")
		}
	}
	return nriLog(t, n)
}

// allocatable returns node n's allocatable GPUs.
func allocatable(t *testing.T, n *harness.Node) int64 {
	t.Helper()
	got, err := n.Allocatable()
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// waitAllocatable waits until node n's status shows want allocatable
// GPUs.
func waitAllocatable(t *testing.T, n *harness.Node, want int) {
	t.Helper()
	if err := n.WaitAllocatable(int64(want), 60*time.Second); err != nil {
		t.Fatal(err)
	}
}

// gpuPod is a pod of the test image, sleeping; limit asks for that many
// device-plugin GPUs; node, when set, pins it to a node.
func gpuPod(namespace, name string, limit int, annotations map[string]string, node string) *corev1.Pod {
	p := harness.SleepPod(namespace, name, int64(limit))
	p.Annotations, p.Spec.NodeName = annotations, node
	return p
}

// createPod creates p, deleted (at once) when the test ends.
func createPod(t *testing.T, p *corev1.Pod) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	created, err := env.client.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deletePod(t, p.Namespace, p.Name) })
	return created
}

// deletePod deletes a pod at once and waits until it is gone: from the
// API and, where it ran, from its node's running sandboxes (the API
// object of a pod deleted with no grace period goes at once, while its
// node still stops it; what it held is released only then, and a node
// status read meanwhile can be one kubelet wrote before).
func deletePod(t *testing.T, namespace, name string) {
	t.Helper()
	ctx := context.Background()
	pods := env.client.CoreV1().Pods(namespace)
	p, err := pods.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return
	}
	if err := pods.Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		return
	}
	testutil.Within(t, 60*time.Second, "pod "+namespace+"/"+name+" gone", func() bool {
		_, err := pods.Get(ctx, name, metav1.GetOptions{})
		return err != nil
	})
	for _, n := range env.nodes {
		if n.Name != p.Spec.NodeName {
			continue
		}
		testutil.Within(t, 60*time.Second, "pod "+namespace+"/"+name+" stopped on "+n.Name, func() bool {
			out, err := n.Ctd.Crictl("pods", "-q", "--state", "ready", "--namespace", namespace, "--name", "^"+name+"$")
			return err == nil && strings.TrimSpace(out) == ""
		})
	}
}

// waitRunning waits until pod namespace/name runs with its container
// started, and returns it.
func waitRunning(t *testing.T, namespace, name string) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	defer func() {
		if !t.Failed() {
			return
		}
		if pod != nil {
			t.Logf("pod %s/%s last seen: phase %s (%s: %s), containers %+v", namespace, name, pod.Status.Phase, pod.Status.Reason, pod.Status.Message, pod.Status.ContainerStatuses)
		}
		if e := warning(namespace, name, "", nil); e != nil {
			t.Logf("its last warning: %s: %s", e.Reason, e.Message)
		}
	}()
	testutil.Within(t, podWait, "pod "+namespace+"/"+name+" Running", func() bool {
		p, err := env.client.CoreV1().Pods(namespace).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		pod = p
		return p.Status.Phase == corev1.PodRunning && len(p.Status.ContainerStatuses) > 0 && p.Status.ContainerStatuses[0].State.Running != nil
	})
	return pod
}

// nodeOf returns the node a pod runs on.
func nodeOf(t *testing.T, p *corev1.Pod) *harness.Node {
	t.Helper()
	for _, n := range env.cluster.Nodes {
		if n.Name == p.Spec.NodeName {
			return n
		}
	}
	t.Fatalf("pod %s is on node %q, not the cluster's", p.Name, p.Spec.NodeName)
	return nil
}

// gpusSeen returns the GPU device nodes (/dev/nvidiaN, not nvidiactl)
// pod p's container sees, listed inside it on its node.
func gpusSeen(t *testing.T, p *corev1.Pod) []string {
	t.Helper()
	return gpusIn(t, nodeOf(t, p), runtimeID(p.Status.ContainerStatuses[0].ContainerID), p.Name)
}

// gpusIn returns the GPU device nodes container id (of pod name) on node
// n sees.
func gpusIn(t *testing.T, n *harness.Node, id, name string) []string {
	t.Helper()
	out, err := n.Ctd.Exec(id, "ls", "/dev")
	if err != nil {
		t.Fatalf("ls /dev in %s: %v: %s", name, err, out)
	}
	return gpuNodes(out)
}

// gpuNodes returns the GPU device nodes (nvidiaN, not nvidiactl) of a
// listing of /dev.
func gpuNodes(ls string) []string {
	return slices.DeleteFunc(strings.Fields(ls), func(d string) bool {
		return !strings.HasPrefix(d, "nvidia") || d == "nvidiactl"
	})
}

// namespace is a Namespace object named name.
func namespace(name string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
}

// runtimeID is the runtime's ID of a container kubelet reports as
// "<runtime>://<id>" (containerd's, CRI-O's).
func runtimeID(containerID string) string {
	_, id, _ := strings.Cut(containerID, "://")
	return id
}

// containerID returns the runtime's ID of container ctr of pod p.
func containerID(t *testing.T, p *corev1.Pod, ctr string) string {
	t.Helper()
	for _, s := range p.Status.ContainerStatuses {
		if s.Name == ctr {
			return runtimeID(s.ContainerID)
		}
	}
	t.Fatalf("pod %s has no container %q", p.Name, ctr)
	return ""
}

// removeGPU removes fake GPU i's device node from node n, as a driver
// unloaded or a GPU fallen off the bus would; it is made again when the
// test ends, if the test has not made it again itself.
func removeGPU(t *testing.T, n *harness.Node, i int) {
	t.Helper()
	dev := n.Dev(fmt.Sprintf("nvidia%d", i))
	if err := os.Remove(dev); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := os.Stat(dev); err != nil {
			_ = n.RestoreGPU(i)
		}
	})
}

// restoreGPU makes fake GPU i's device node on node n again.
func restoreGPU(t *testing.T, n *harness.Node, i int) {
	t.Helper()
	if err := n.RestoreGPU(i); err != nil {
		t.Fatal(err)
	}
}

// logsOnFailure has node n's kubelet, runtime and nri-gpu (with its DRA
// driver) logged when t fails: what a pod that never ran leaves behind.
func logsOnFailure(t *testing.T, n *harness.Node) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		t.Logf("%s's kubelet:\n%s", n.Name, n.KubeletLogTail(40))
		t.Logf("%s's runtime:\n%s", n.Name, n.Ctd.LogTail(40))
		if p, ok := nriPods(t)[n.Name]; ok {
			t.Logf("%s's nri-gpu:\n%s", n.Name, tail(n.PodLog(nriNamespace, p.Name, "nri-gpu"), 60))
		}
	})
}
