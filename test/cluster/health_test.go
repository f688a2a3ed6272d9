package cluster

import (
	"context"
	"fmt"
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

// waitHealth waits until kubelet shows health, and only that, for what
// container ctr of pod default/name was allocated (resource: a
// device-plugin resource, or "claim:<name>").
func waitHealth(t *testing.T, name, ctr, resource string, health corev1.ResourceHealthStatus) {
	t.Helper()
	testutil.Within(t, podWait, fmt.Sprintf("pod %s shows its GPU %s", name, health), func() bool {
		return strings.Join(healthOf(t, "default", name, ctr, resource), ",") == string(health)
	})
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
	createTemplate(t, "default", "gpu-one", harness.ClaimSpec("gpu-one", 1))
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
	// What kubelet shows of the pods' GPUs: the claim's (the DRA health
	// stream) and the device plugin's (ListAndWatch).
	both := func(health corev1.ResourceHealthStatus) {
		t.Helper()
		waitHealth(t, "sick-claim", "gpu", "claim:gpu", health)
		waitHealth(t, "sick-plugged", "main", string(harness.GPUResource), health)
	}
	both(corev1.ResourceHealthStatusHealthy)

	removeGPU(t, a, 1)
	removeGPU(t, b, bGPU)
	testutil.Within(t, podWait, a.Name+"'s gpu-1 tainted NoSchedule", func() bool {
		return taintOf(t, a, "gpu-1") == string(resourceapi.DeviceTaintEffectNoSchedule)
	})
	both(corev1.ResourceHealthStatusUnhealthy)
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

	restoreGPU(t, a, 1)
	restoreGPU(t, b, bGPU)
	testutil.Within(t, podWait, a.Name+"'s gpu-1 untainted", func() bool { return taintOf(t, a, "gpu-1") == "" })
	waitAllRunning(t, "default", "after-claim")
	waitHealth(t, "sick-plugged", "main", string(harness.GPUResource), corev1.ResourceHealthStatusHealthy)

	// NoExecute: the DRA driver's settings are read at start, so nri-gpu
	// on node-a is restarted with them.
	noExecute := valuesFile(t, "noexecute-values.yaml", "config:\n  dra:\n    unhealthyTaint: NoExecute\n")
	restartWith(t, []*harness.Node{a}, driverName, env.values, noExecute)
	t.Cleanup(func() { restartWith(t, []*harness.Node{a}, driverName, env.values) })
	removeGPU(t, a, 1)
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
	restoreGPU(t, a, 1)
	testutil.Within(t, podWait, a.Name+"'s gpu-1 untainted", func() bool { return taintOf(t, a, "gpu-1") == "" })
}

// restartWith runs `helm upgrade` with the values files and restarts
// nri-gpu on nodes, for a setting read at start; it waits until each new
// nri-gpu has published its ResourceSlice for driver.
func restartWith(t *testing.T, nodes []*harness.Node, driver string, values ...string) {
	t.Helper()
	helmUpgrade(t, values...)
	for _, n := range nodes {
		replaceNRIPod(t, n)
		testutil.Within(t, podWait, n.Name+": the new nri-gpu pod Ready", func() bool {
			p, ok := nriPods(t)[n.Name]
			return ok && podReady(p)
		})
		testutil.Within(t, podWait, n.Name+": nri-gpu's ResourceSlice of "+driver+" published", func() bool {
			return len(sliceOf(t, n, driver)) > 0
		})
	}
}
