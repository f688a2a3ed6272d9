package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nri-gpu/nri-gpu/test/harness"
)

// TestInstalled: the chart, installed with Helm's install against the
// API server, runs nri-gpu on both nodes, placed there by the DaemonSet
// controller, Ready through its probes and registered with each node's
// containerd; the pod runs as the chart's ServiceAccount, whose token the
// DRA driver and the events use, and that account may do what they do
// only.
func TestInstalled(t *testing.T) {
	needCluster(t)
	ctx := context.Background()
	pods := nriPods(t)
	for _, n := range env.nodes {
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
		// The DRA driver (on in this installation) talks to the API
		// server: the chart's account, with its token.
		if p.Spec.ServiceAccountName != releaseName || p.Spec.AutomountServiceAccountToken == nil || !*p.Spec.AutomountServiceAccountToken {
			t.Errorf("%s: service account %q, automount %v; want the chart's, with a token for the DRA driver", n.Name, p.Spec.ServiceAccountName, p.Spec.AutomountServiceAccountToken)
		}
		if log := nriLog(t, n); !strings.Contains(log, "connected to runtime") {
			t.Errorf("%s: nri-gpu's log does not say it connected to containerd:\n%s", n.Name, log)
		}
		// DRA on: its driver runs as nri-gpu's child, in its container.
		if pid := draDriver(t, n); pid == 0 {
			t.Errorf("%s: no nri-gpu-dra process with DRA on", n.Name)
		} else if parent := parentProgram(t, pid); parent != "nri-gpu" {
			t.Errorf("%s: nri-gpu-dra's parent is %q, want nri-gpu", n.Name, parent)
		}
	}
	if _, err := env.client.CoreV1().ServiceAccounts(nriNamespace).Get(ctx, releaseName, metav1.GetOptions{}); err != nil {
		t.Errorf("the chart's ServiceAccount: %v", err)
	}
	// The bindings that name nri-gpu's account are the DRA driver's and
	// the events', and they grant what those do and nothing else.
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
			if s.Namespace == nriNamespace && b.Name != releaseName+"-dra" && b.Name != releaseName+"-events" {
				t.Errorf("ClusterRoleBinding %s grants %s/%s access", b.Name, s.Namespace, s.Name)
			}
		}
	}
	for _, b := range rbs.Items {
		if b.Namespace == nriNamespace {
			t.Errorf("RoleBinding %s/%s in nri-gpu's namespace", b.Namespace, b.Name)
		}
	}
	for _, c := range []struct {
		verb, group, resource string
		allowed               bool
	}{
		{"create", "resource.k8s.io", "resourceslices", true},
		{"delete", "resource.k8s.io", "resourceslices", true},
		{"get", "resource.k8s.io", "resourceclaims", true},
		{"watch", "", "pods", true},
		{"get", "", "nodes", true},
		{"create", "events.k8s.io", "events", true},
		{"update", "events.k8s.io", "events", false},
		{"delete", "events.k8s.io", "events", false},
		{"update", "resource.k8s.io", "resourceclaims", false},
		{"list", "resource.k8s.io", "resourceclaims", false},
		{"create", "", "pods", false},
		{"list", "", "secrets", false},
		{"update", "", "nodes", false},
	} {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:               "system:serviceaccount:" + nriNamespace + ":" + releaseName,
			Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + nriNamespace, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: c.verb, Group: c.group, Resource: c.resource},
		}}
		got, err := env.client.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.Status.Allowed != c.allowed {
			t.Errorf("nri-gpu's account may %s %s.%s: %v, want %v", c.verb, c.resource, c.group, got.Status.Allowed, c.allowed)
		}
	}
}

// TestNodeCapacity: with the chart's device-plugin resource, each node's
// status shows its GPUs as nvidia.com/gpu capacity and allocatable.
func TestNodeCapacity(t *testing.T) {
	needCluster(t)
	for _, n := range env.nodes {
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

// parentProgram returns the program name of process pid's parent.
func parentProgram(t *testing.T, pid int) string {
	t.Helper()
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// pid (comm) state ppid ...: comm may hold spaces, so read after ')'.
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	cmdline, err := os.ReadFile("/proc/" + fields[1] + "/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Base(strings.Split(string(cmdline), "\x00")[0])
}
