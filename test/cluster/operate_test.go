package cluster

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/test/harness"
)

// TestMetricsThroughService: the chart's metrics Service selects nri-gpu
// on both nodes (its EndpointSlices, kept by the controller manager, list
// one ready endpoint on each node's pod network), and each endpoint
// answers /readyz and /metrics.
func TestMetricsThroughService(t *testing.T) {
	needCluster(t)
	ctx := context.Background()
	svc, err := env.client.CoreV1().Services(nriNamespace).Get(ctx, releaseName+"-metrics", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var endpoints []discoveryv1.Endpoint
	testutil.Within(t, 60*time.Second, "2 ready endpoints of "+svc.Name, func() bool {
		slices, err := env.client.DiscoveryV1().EndpointSlices(nriNamespace).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + svc.Name})
		if err != nil {
			return false
		}
		endpoints = nil
		for _, s := range slices.Items {
			for _, e := range s.Endpoints {
				if e.Conditions.Ready != nil && *e.Conditions.Ready {
					endpoints = append(endpoints, e)
				}
			}
		}
		return len(endpoints) == 2
	})
	port := svc.Spec.Ports[0].Port
	seen := map[string]bool{}
	for _, e := range endpoints {
		node := nodeNamed(t, *e.NodeName)
		_, subnet, _ := net.ParseCIDR(node.Subnet)
		if ip := net.ParseIP(e.Addresses[0]); !subnet.Contains(ip) {
			t.Errorf("endpoint %s on %s is not on the node's pod network %s", ip, node.Name, node.Subnet)
		}
		seen[node.Name] = true
		base := fmt.Sprintf("http://%s", net.JoinHostPort(e.Addresses[0], fmt.Sprint(port)))
		// The endpoint is ready as kubelet's last probe found it; nri-gpu
		// answers for now (a DRA driver an earlier test restarted may be
		// registering again), so it is asked until it says ready.
		code, body := get(t, base+"/readyz")
		for deadline := time.Now().Add(time.Minute); code != http.StatusOK && time.Now().Before(deadline); code, body = get(t, base+"/readyz") {
			time.Sleep(200 * time.Millisecond)
		}
		if code != http.StatusOK {
			t.Errorf("%s: /readyz %d: %s", node.Name, code, body)
		}
		code, body = get(t, base+"/metrics")
		for _, m := range []string{"nri_gpu_devices_held", "nri_gpu_config_info{digest="} {
			if code != http.StatusOK || !strings.Contains(body, m) {
				t.Errorf("%s: /metrics (%d) has no %s", node.Name, code, m)
			}
		}
	}
	if !seen[env.a.Name] || !seen[env.b.Name] {
		t.Errorf("the Service's endpoints are on %v, want both nodes", seen)
	}
}

// get fetches url and returns the status and body.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		t.Errorf("GET %s: %v", url, err)
		return 0, ""
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// nodeNamed returns the cluster's node name.
func nodeNamed(t *testing.T, name string) *harness.Node {
	t.Helper()
	for _, n := range env.nodes {
		if n.Name == name {
			return n
		}
	}
	t.Fatalf("no node %q in the cluster", name)
	return nil
}

// TestHelmUpgradeChangesPolicy: `helm upgrade` with a policy that admits
// one namespace more reaches the running nri-gpu on both nodes through
// its configuration reload (kubelet updates the mounted ConfigMap; the
// DaemonSet's pods are not replaced, so no container is ever created
// without nri-gpu), and the next pod of that namespace gets its GPU.
func TestHelmUpgradeChangesPolicy(t *testing.T) {
	needCluster(t)
	ctx := context.Background()
	ns := "team-x"
	if _, err := env.client.CoreV1().Namespaces().Create(ctx, namespace(ns), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.client.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}) })
	waitServiceAccount(t, ns)
	createPod(t, gpuPod(ns, "before", 0, map[string]string{"gpus.nri-gpu.io": "0"}, env.b.Name))
	refusedWith(t, ns, "before", "pods of namespace \"team-x\" may not request devices")
	deletePod(t, ns, "before")

	before := nriPods(t)
	wider := valuesFile(t, "team-x-values.yaml", "config:\n  policy:\n    namespaces: [default, \"tenant-*\", \"team-*\"]\n")
	upgrade(t, env.values, wider)
	t.Cleanup(func() { upgrade(t, env.values) })

	after := nriPods(t)
	for node, p := range before {
		if after[node].UID != p.UID {
			t.Errorf("%s: the upgrade replaced nri-gpu's pod; want it reloaded in place", node)
		}
	}
	createPod(t, gpuPod(ns, "after", 0, map[string]string{"gpus.nri-gpu.io": "0"}, env.b.Name))
	if seen := gpusSeen(t, waitRunning(t, ns, "after")); len(seen) != 1 || seen[0] != "nvidia0" {
		t.Errorf("after the upgrade, the team-x pod sees %v, want nvidia0", seen)
	}
}

// valuesFile writes chart values text to the file name in the run's
// directory, and returns its path.
func valuesFile(t *testing.T, name, text string) string {
	t.Helper()
	path := filepath.Join(env.dir, name)
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// helmUpgrade runs `helm upgrade` with the values files.
func helmUpgrade(t *testing.T, values ...string) {
	t.Helper()
	args := []string{"upgrade", releaseName, chartDir, "--namespace", nriNamespace, "--wait", "--timeout", "2m"}
	for _, v := range values {
		args = append(args, "--values", v)
	}
	if _, err := env.cluster.Helm(env.helm, args...); err != nil {
		t.Fatal(err)
	}
}

// upgrade runs `helm upgrade` with the values files, and waits until
// nri-gpu on both nodes has reloaded the configuration it renders.
func upgrade(t *testing.T, values ...string) {
	t.Helper()
	reloads := map[string]int{}
	for _, n := range env.nodes {
		reloads[n.Name] = strings.Count(nriLog(t, n), "configuration reloaded")
	}
	helmUpgrade(t, values...)
	for _, n := range env.nodes {
		testutil.Within(t, podWait, n.Name+": nri-gpu reloads its configuration", func() bool {
			return strings.Count(nriLog(t, n), "configuration reloaded") > reloads[n.Name]
		})
	}
}

// TestSpecNodeGoneLowersAllocatable: when a GPU's device node disappears
// from a node, the device plugin reports it unhealthy and the node's
// allocatable drops by one; when it is back, so is the GPU.
func TestSpecNodeGoneLowersAllocatable(t *testing.T) {
	needCluster(t)
	n := env.b
	waitAllocatable(t, n, n.GPUs)
	removeGPU(t, n, 3)
	waitAllocatable(t, n, n.GPUs-1)
	restoreGPU(t, n, 3)
	waitAllocatable(t, n, n.GPUs)
}
