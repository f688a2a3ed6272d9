package cluster

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nri-gpu/nri-gpu/test/harness"
)

// TestInstalled: the chart, installed with Helm's install against the
// API server, runs nri-gpu on both nodes, placed there by the DaemonSet
// controller, Ready through its probes and registered with each node's
// containerd; the pod runs as the chart's ServiceAccount with no token,
// and nothing grants that account any access.
func TestInstalled(t *testing.T) {
	needCluster(t)
	ctx := context.Background()
	pods := nriPods(t)
	for _, n := range []*harness.Node{env.a, env.b} {
		p, ok := pods[n.Name]
		if !ok {
			t.Fatalf("no nri-gpu pod on %s (pods by node: %v)", n.Name, keys(pods))
		}
		if len(p.OwnerReferences) != 1 || p.OwnerReferences[0].Kind != "DaemonSet" {
			t.Errorf("%s: nri-gpu's pod is owned by %v, want its DaemonSet", n.Name, p.OwnerReferences)
		}
		if !podReady(p) {
			t.Errorf("%s: nri-gpu's pod is not Ready: %+v", n.Name, p.Status.Conditions)
		}
		if p.Spec.ServiceAccountName != releaseName || p.Spec.AutomountServiceAccountToken == nil || *p.Spec.AutomountServiceAccountToken {
			t.Errorf("%s: service account %q, automount %v; want the chart's, without a token", n.Name, p.Spec.ServiceAccountName, p.Spec.AutomountServiceAccountToken)
		}
		for _, v := range p.Spec.Volumes {
			if v.Projected != nil {
				t.Errorf("%s: nri-gpu's pod has a projected volume %q (a token)", n.Name, v.Name)
			}
		}
		if log := nriLog(t, n); !strings.Contains(log, "connected to runtime") {
			t.Errorf("%s: nri-gpu's log does not say it connected to containerd:\n%s", n.Name, log)
		}
	}
	if _, err := env.client.CoreV1().ServiceAccounts(nriNamespace).Get(ctx, releaseName, metav1.GetOptions{}); err != nil {
		t.Errorf("the chart's ServiceAccount: %v", err)
	}
	// No binding names nri-gpu's account: it needs no access.
	crbs, err := env.client.RbacV1().ClusterRoleBindings().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rbs, err := env.client.RbacV1().RoleBindings("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range crbs.Items {
		for _, s := range b.Subjects {
			if s.Namespace == nriNamespace {
				t.Errorf("ClusterRoleBinding %s grants %s/%s access", b.Name, s.Namespace, s.Name)
			}
		}
	}
	for _, b := range rbs.Items {
		if b.Namespace == nriNamespace {
			t.Errorf("RoleBinding %s/%s in nri-gpu's namespace", b.Namespace, b.Name)
		}
	}
}

// TestNodeCapacity: with the chart's device-plugin resource, each node's
// status shows its GPUs as nvidia.com/gpu capacity and allocatable.
func TestNodeCapacity(t *testing.T) {
	needCluster(t)
	for _, n := range []*harness.Node{env.a, env.b} {
		waitAllocatable(t, n, n.GPUs)
		node, err := env.client.CoreV1().Nodes().Get(context.Background(), n.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if c := node.Status.Capacity[harness.GPUResource]; c.Value() != int64(n.GPUs) {
			t.Errorf("%s: capacity %s, want %d", n.Name, c.String(), n.GPUs)
		}
	}
}

// podReady reports whether p's Ready condition is True.
func podReady(p corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
