package cluster

import (
	"context"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/test/harness"
)

// addNode adds a node of opts to the cluster, nri-gpu's DaemonSet Ready
// on it too, and removes it when the test ends (after the test's pods,
// deleted before).
func addNode(t *testing.T, opts harness.NodeOptions) *harness.Node {
	t.Helper()
	n, err := env.cluster.AddNode(opts)
	if err != nil {
		t.Fatal(err)
	}
	port, _ := strconv.Atoi(apiForwardPort)
	fwd := n.ForwardToPods("app.kubernetes.io/name=nri-gpu", port, strings.TrimPrefix(env.cluster.Server, "https://"))
	t.Cleanup(func() {
		fwd.Stop()
		if err := env.cluster.RemoveNode(n); err != nil {
			t.Errorf("removing %s: %v", n.Name, err)
		}
		// Its nri-gpu pod, bound to a node that is gone.
		if p, ok := nriPods(t)[n.Name]; ok {
			_ = env.client.CoreV1().Pods(nriNamespace).Delete(context.Background(), p.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
		}
		if err := waitDaemonSetReady(2); err != nil {
			t.Error(err)
		}
	})
	if err := waitDaemonSetReady(int32(len(env.cluster.Nodes))); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestContainerdUpgradeInPlace: a node on containerd 1.7.35 runs pods of
// every door (a count annotation, the device plugin, a DRA claim) and is
// moved to containerd 2.3.7 in place, as containerd documents the move
// from 1.7 (stopped, its binaries and runc replaced, its configuration
// migrated by the new release's `containerd config migrate`, started
// again on the same state) while nri-gpu runs, its own CDI turned on
// with nri-gpu's spec directory as docs/deploying.md says. Afterwards each pod's
// container from before still runs, managed by the new containerd, and
// sees the GPU it had; nri-gpu has reconnected and says what the new
// runtime can apply; new pods of every door are served, each its own
// GPU; no GPU is seen by two pods.
func TestContainerdUpgradeInPlace(t *testing.T) {
	needCluster(t)
	to, err := env.tools.WithContainerd(os.Getenv(containerd2))
	if err != nil {
		t.Fatal(err)
	}
	if env.tools.Containerd2() || !to.Containerd2() {
		t.Fatalf("moving containerd %s to %s: want 1.7 to 2.x", env.tools.ContainerdVersion, to.ContainerdVersion)
	}
	n := addNode(t, harness.NodeOptions{Name: "node-c", Tools: env.tools, GPUs: 6, Images: env.images, CNIBin: os.Getenv(cniEnv), KubeletRoot: harness.LongKubeletRoot})
	logsOnFailure(t, n)
	createTemplate(t, "default", "inplace-gpu", harness.ClaimSpec(driverName, 1))
	before := inplacePods(n, "before")
	ids, seen := runOneByOne(t, before)
	connected := strings.Count(nriLog(t, n), "what the runtime can apply")

	if err := n.Ctd.Upgrade(to, harness.NodeSpecDir); err != nil {
		t.Fatalf("%s: containerd %s to %s: %v\n%s", n.Name, env.tools.ContainerdVersion, to.ContainerdVersion, err, n.Ctd.LogTail(20))
	}
	if err := n.WaitReady(podWait); err != nil {
		t.Fatal(err)
	}
	testutil.Within(t, podWait, "nri-gpu connected to containerd "+to.ContainerdVersion, func() bool {
		lines := strings.Split(nriLog(t, n), "\n")
		said := slices.DeleteFunc(lines, func(l string) bool { return !strings.Contains(l, "what the runtime can apply") })
		return len(said) > connected && strings.Contains(said[len(said)-1], to.ContainerdVersion)
	})
	for i, p := range before {
		got := waitAllRunning(t, "default", p.Name)
		if id := containerID(t, got, gpuContainer(p)); id != ids[i] {
			t.Errorf("%s: container %s after the upgrade, want %s from before, still running", p.Name, id, ids[i])
		}
		if now := gpusIn(t, n, ids[i], p.Name); !slices.Equal(now, seen[i]) {
			t.Errorf("%s sees %v after the upgrade, want %v", p.Name, now, seen[i])
		}
	}
	runOneByOne(t, inplacePods(n, "after"))
	noGPUTwice(t, n)
}

// inplacePods are a pod of each door on node n, named for the stage.
func inplacePods(n *harness.Node, stage string) []*corev1.Pod {
	return []*corev1.Pod{
		gpuPod("default", "inplace-count-"+stage, 0, map[string]string{"gpu-count.nri-gpu.io": "1"}, n.Name),
		gpuPod("default", "inplace-plugin-"+stage, 1, nil, n.Name),
		claimPod("default", "inplace-claim-"+stage, n, "inplace-gpu", ""),
	}
}

// gpuContainer names a pod's container that has its GPU.
func gpuContainer(p *corev1.Pod) string {
	if p.Spec.ResourceClaims != nil {
		return "gpu"
	}
	return p.Spec.Containers[0].Name
}

// runOneByOne creates the pods, one after another (the device plugin and
// DRA offer the same GPUs here: asked at once, both may choose one GPU, a
// known gap of docs/threat-model.md), and returns each one's GPU
// container's ID and what it sees, which must be one GPU.
func runOneByOne(t *testing.T, ps []*corev1.Pod) (ids []string, seen [][]string) {
	t.Helper()
	for _, p := range ps {
		createPod(t, p)
		got := waitAllRunning(t, "default", p.Name)
		ids = append(ids, containerID(t, got, gpuContainer(p)))
		seen = append(seen, seenBy(t, got, gpuContainer(p)))
		if len(seen[len(seen)-1]) != 1 {
			t.Errorf("%s sees %v, want one GPU", p.Name, seen[len(seen)-1])
		}
	}
	return ids, seen
}
