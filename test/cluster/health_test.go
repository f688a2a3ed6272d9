package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/test/harness"
)

// goneTaint is the taint of a device whose device nodes are gone.
const goneTaint = driverName + "/device-gone"

// taintOf returns the effect of device name's device-gone taint in node
// n's ResourceSlice ("" for none; "absent" when the device is not there).
func taintOf(t *testing.T, n *harness.Node, name string) string {
	t.Helper()
	d, ok := slice(t, n)[name]
	if !ok {
		return "absent"
	}
	for _, tn := range d.Taints {
		if tn.Key == goneTaint {
			return string(tn.Effect)
		}
	}
	return ""
}

// healthOf returns the health kubelet shows in pod namespace/name's
// status for what container ctr was allocated (resource: a device-plugin
// resource, or "claim:<name>"), one entry per device, or nil.
func healthOf(t *testing.T, namespace, name, ctr, resource string) []string {
	t.Helper()
	p, err := env.client.CoreV1().Pods(namespace).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	var out []string
	for _, s := range p.Status.ContainerStatuses {
		if s.Name != ctr {
			continue
		}
		for _, r := range s.AllocatedResourcesStatus {
			if string(r.Name) == resource {
				for _, h := range r.Resources {
					out = append(out, string(h.Health))
				}
			}
		}
	}
	return out
}

// TestDeviceHealth: a GPU whose device node goes from the host stays in
// the ResourceSlice, tainted <driver>/device-gone:NoSchedule; kubelet shows
// it Unhealthy in the status of the pod whose claim has it (the DRA health
// stream) and of a device-plugin pod given it (ListAndWatch), both of
// which keep running; a claim that asks for that GPU stays Pending while
// it is tainted. When the node is back, the taint goes, the pods read
// Healthy and the waiting claim's pod runs. With dra.unhealthyTaint:
// NoExecute, kube-controller-manager evicts the pod whose claim has a GPU
// that goes.
func TestDeviceHealth(t *testing.T) {
	needCluster(t)
	a, b := env.a, env.b
	createClass(t, "gpu-one", `device.attributes["`+driverName+`"].index == 1`)
	createTemplate(t, "default", "gpu-one", claimSpec("gpu-one", 1))
	createPod(t, claimPod("default", "sick-claim", a, "gpu-one", ""))
	waitAllRunning(t, "default", "sick-claim")
	createPod(t, gpuPod("default", "sick-plugged", 1, nil, b.Name))
	plugged := waitRunning(t, "default", "sick-plugged")
	seen := gpusSeen(t, plugged)
	var bGPU int
	if len(seen) != 1 {
		t.Fatalf("device-plugin pod sees %v, want one GPU", seen)
	}
	if _, err := fmt.Sscanf(seen[0], "nvidia%d", &bGPU); err != nil {
		t.Fatal(err)
	}
	const claimHealth = "claim:gpu"
	for _, w := range []struct{ pod, ctr, res string }{{"sick-claim", "gpu", claimHealth}, {"sick-plugged", "main", string(harness.GPUResource)}} {
		testutil.Within(t, podWait, "pod "+w.pod+" shows its GPU Healthy", func() bool {
			return strings.Join(healthOf(t, "default", w.pod, w.ctr, w.res), ",") == string(corev1.ResourceHealthStatusHealthy)
		})
	}

	gone := func(n *harness.Node, gpu int) {
		t.Helper()
		if err := os.Remove(n.Dev(fmt.Sprintf("nvidia%d", gpu))); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if _, err := os.Stat(n.Dev(fmt.Sprintf("nvidia%d", gpu))); err != nil {
				_ = n.RestoreGPU(gpu)
			}
		})
	}
	back := func(n *harness.Node, gpu int) {
		t.Helper()
		if err := n.RestoreGPU(gpu); err != nil {
			t.Fatal(err)
		}
	}
	gone(a, 1)
	gone(b, bGPU)
	testutil.Within(t, podWait, a.Name+"'s gpu-1 tainted NoSchedule", func() bool {
		return taintOf(t, a, "gpu-1") == string(resourceapi.DeviceTaintEffectNoSchedule)
	})
	for _, w := range []struct{ pod, ctr, res string }{{"sick-claim", "gpu", claimHealth}, {"sick-plugged", "main", string(harness.GPUResource)}} {
		testutil.Within(t, podWait, "pod "+w.pod+" shows its GPU Unhealthy", func() bool {
			return strings.Join(healthOf(t, "default", w.pod, w.ctr, w.res), ",") == string(corev1.ResourceHealthStatusUnhealthy)
		})
	}
	// A new claim for GPU 1 waits while the taint is there.
	deletePod(t, "default", "sick-claim")
	createPod(t, claimPod("default", "after-claim", a, "gpu-one", ""))
	testutil.Within(t, podWait, "pod after-claim unschedulable while gpu-1 is tainted", func() bool {
		p, err := env.client.CoreV1().Pods("default").Get(context.Background(), "after-claim", metav1.GetOptions{})
		return err == nil && unschedulable(*p, "")
	})
	if p, err := env.client.CoreV1().Pods("default").Get(context.Background(), "sick-plugged", metav1.GetOptions{}); err != nil || p.Status.Phase != corev1.PodRunning {
		t.Errorf("pod sick-plugged with an unhealthy GPU: %v; want it running", err)
	}

	back(a, 1)
	back(b, bGPU)
	testutil.Within(t, podWait, a.Name+"'s gpu-1 untainted", func() bool { return taintOf(t, a, "gpu-1") == "" })
	waitAllRunning(t, "default", "after-claim")
	testutil.Within(t, podWait, "pod sick-plugged shows its GPU Healthy again", func() bool {
		return strings.Join(healthOf(t, "default", "sick-plugged", "main", string(harness.GPUResource)), ",") == string(corev1.ResourceHealthStatusHealthy)
	})

	// NoExecute: the DRA driver's settings are read at start, so nri-gpu
	// on node-a is restarted with them.
	noExecute := filepath.Join(env.dir, "noexecute-values.yaml")
	if err := os.WriteFile(noExecute, []byte("config:\n  dra:\n    unhealthyTaint: NoExecute\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	restartWith(t, []*harness.Node{a}, driverName, env.values, noExecute)
	t.Cleanup(func() { restartWith(t, []*harness.Node{a}, driverName, env.values) })
	gone(a, 1)
	testutil.Within(t, podWait, a.Name+"'s gpu-1 tainted NoExecute", func() bool {
		return taintOf(t, a, "gpu-1") == string(resourceapi.DeviceTaintEffectNoExecute)
	})
	testutil.Within(t, podWait, "pod after-claim evicted", func() bool {
		p, err := env.client.CoreV1().Pods("default").Get(context.Background(), "after-claim", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true
		}
		if err != nil {
			return false
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue {
				t.Logf("pod after-claim: %s: %s", c.Reason, c.Message)
				return p.DeletionTimestamp != nil
			}
		}
		return false
	})
	back(a, 1)
	testutil.Within(t, podWait, a.Name+"'s gpu-1 untainted", func() bool { return taintOf(t, a, "gpu-1") == "" })
}

// restartWith runs `helm upgrade` with the values files and restarts
// nri-gpu on nodes, for a setting read at start; it waits until each new
// nri-gpu has published its ResourceSlice for driver.
func restartWith(t *testing.T, nodes []*harness.Node, driver string, values ...string) {
	t.Helper()
	args := []string{"upgrade", releaseName, chartDir, "--namespace", nriNamespace, "--wait", "--timeout", "2m"}
	for _, v := range values {
		args = append(args, "--values", v)
	}
	if _, err := env.cluster.Helm(env.helm, args...); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		old := nriPods(t)[n.Name]
		if err := env.client.CoreV1().Pods(nriNamespace).Delete(context.Background(), old.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		testutil.Within(t, podWait, n.Name+": a new nri-gpu pod, Ready", func() bool {
			p, ok := nriPods(t)[n.Name]
			return ok && p.UID != old.UID && podReady(p)
		})
		testutil.Within(t, podWait, n.Name+": nri-gpu's ResourceSlice of "+driver+" published", func() bool {
			return len(sliceOf(t, n, driver)) > 0
		})
	}
}
