package cluster

import (
	"context"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
)

// TestRefusedReasonInEvents: a pod nri-gpu refuses shows nri-gpu's
// reason where an operator reads it (`kubectl describe`: the pod's
// Events and its container's waiting state): a pod of a namespace the
// policy refuses, and a pod asking for a GPU another pod holds under
// exclusive. The holder, an annotation pod, lowers its node's
// allocatable by the GPU it holds, and gives it back when deleted.
func TestRefusedReasonInEvents(t *testing.T) {
	needCluster(t)
	ctx := context.Background()
	ns := namespace("outsider")
	if _, err := env.client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.client.CoreV1().Namespaces().Delete(ctx, ns.Name, metav1.DeleteOptions{}) })
	waitServiceAccount(t, ns.Name)

	createPod(t, gpuPod(ns.Name, "refused", 0, map[string]string{"gpus.nri-gpu.io": "0"}, env.a.Name))
	refusedWith(t, ns.Name, "refused", "denied by policy", "pods of namespace", "may not request devices")

	createPod(t, gpuPod("default", "holder", 0, map[string]string{"gpus.nri-gpu.io": "1"}, env.a.Name))
	holder := waitRunning(t, "default", "holder")
	if seen := gpusSeen(t, holder); len(seen) != 1 || seen[0] != "nvidia1" {
		t.Errorf("the holder sees %v, want nvidia1", seen)
	}
	// One pool per node: the device plugin no longer offers GPU 1.
	waitAllocatable(t, env.a, env.a.GPUs-1)

	createPod(t, gpuPod("default", "waiter", 0, map[string]string{"gpus.nri-gpu.io": "1"}, env.a.Name))
	refusedWith(t, "default", "waiter", "denied by policy", "is held by pod default/holder", "policy.exclusive")

	deletePod(t, "default", "holder")
	// kubelet's next try gives the waiter the GPU; then it is held again.
	waiter := waitRunning(t, "default", "waiter")
	if seen := gpusSeen(t, waiter); len(seen) != 1 || seen[0] != "nvidia1" {
		t.Errorf("the waiter sees %v, want nvidia1", seen)
	}
	deletePod(t, "default", "waiter")
	waitAllocatable(t, env.a, env.a.GPUs)
}

// refusedWith waits until pod namespace/name's container waits in
// CreateContainerError with a message holding each of want, and a
// Warning Event of the pod says the same, and checks that it has no
// running container.
func refusedWith(t *testing.T, namespace, name string, want ...string) {
	t.Helper()
	ctx := context.Background()
	var status, event string
	var seen *corev1.PodStatus // the pod's last status, shown if it never comes
	defer func() {
		if t.Failed() && seen != nil {
			t.Logf("pod %s/%s last seen: phase %s, containers %+v", namespace, name, seen.Phase, seen.ContainerStatuses)
		}
	}()
	testutil.Within(t, podWait, fmt.Sprintf("pod %s/%s refused with %q", namespace, name, want), func() bool {
		p, err := env.client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			seen = &p.Status
		}
		if err != nil || len(p.Status.ContainerStatuses) == 0 {
			return false
		}
		if w := p.Status.ContainerStatuses[0].State.Waiting; w != nil && w.Reason == "CreateContainerError" {
			status = w.Message
		}
		if e := warning(namespace, name, "Failed", want); e != nil {
			event = e.Message
		}
		return containsAll(status, want) && event != ""
	})
	t.Logf("%s/%s: event %q", namespace, name, event)
	p, err := env.client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Status.ContainerStatuses[0].State.Running != nil {
		t.Errorf("pod %s/%s runs, though refused", namespace, name)
	}
}

// warning returns the last Warning event of pod namespace/name of reason
// ("": any) whose message says each of want, or nil.
func warning(namespace, name, reason string, want []string) *corev1.Event {
	events, err := env.client.CoreV1().Events(namespace).List(context.Background(), metav1.ListOptions{
		FieldSelector: fields.Set{"involvedObject.name": name, "involvedObject.kind": "Pod"}.String(),
	})
	if err != nil {
		return nil
	}
	var found *corev1.Event
	for i, e := range events.Items {
		if e.Type == corev1.EventTypeWarning && (reason == "" || e.Reason == reason) && containsAll(e.Message, want) {
			found = &events.Items[i]
		}
	}
	return found
}

func containsAll(s string, want []string) bool {
	for _, w := range want {
		if !strings.Contains(s, w) {
			return false
		}
	}
	return true
}

// waitServiceAccount waits for the default service account of a new
// namespace: pods cannot be created there before it.
func waitServiceAccount(t *testing.T, namespace string) {
	t.Helper()
	testutil.Within(t, podWait, "service account of "+namespace, func() bool {
		_, err := env.client.CoreV1().ServiceAccounts(namespace).Get(context.Background(), "default", metav1.GetOptions{})
		return err == nil
	})
}
