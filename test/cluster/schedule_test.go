package cluster

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
)

// TestDeploymentPlacedByGPUs: a Deployment of pods asking for one
// nvidia.com/gpu each fills both nodes (2 pods on node-a, 4 on node-b),
// each pod seeing only its own GPU; one replica more stays Pending, and
// the scheduler says why.
func TestDeploymentPlacedByGPUs(t *testing.T) {
	needCluster(t)
	labels := map[string]string{"app": "gpu-deployment"}
	dep := createDeployment(t, "gpu-deployment", labels, 6)
	pods := runningPods(t, labels, 6)
	perNode := map[string][]string{}
	for i := range pods {
		seen := gpusSeen(t, &pods[i])
		if len(seen) != 1 {
			t.Errorf("pod %s on %s sees GPUs %v, want one", pods[i].Name, pods[i].Spec.NodeName, seen)
		}
		perNode[pods[i].Spec.NodeName] = append(perNode[pods[i].Spec.NodeName], seen...)
	}
	for _, want := range []struct {
		node string
		gpus []string
	}{{env.a.Name, []string{"nvidia0", "nvidia1"}}, {env.b.Name, []string{"nvidia0", "nvidia1", "nvidia2", "nvidia3"}}} {
		got := perNode[want.node]
		slices.Sort(got)
		if !slices.Equal(got, want.gpus) {
			t.Errorf("%s: its pods see %v, want each of %v once", want.node, got, want.gpus)
		}
	}

	// A seventh replica finds no GPU free anywhere.
	scaleUnschedulable(t, dep.Name, labels, 7, "nvidia.com/gpu")
}

// createDeployment creates a Deployment of replicas sleeping pods asking
// for one nvidia.com/gpu each, deleted when the test ends.
func createDeployment(t *testing.T, name string, labels map[string]string, replicas int32) *appsv1.Deployment {
	t.Helper()
	tmpl := gpuPod("default", "", 1, nil, "")
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: tmpl.Spec},
		},
	}
	if _, err := env.client.AppsV1().Deployments("default").Create(context.Background(), dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteDeployment(t, dep.Name, labels) })
	return dep
}

// runningPods waits until n pods with labels run, and returns them.
func runningPods(t *testing.T, labels map[string]string, n int) []corev1.Pod {
	t.Helper()
	for deadline := time.Now().Add(2 * podWait); ; time.Sleep(200 * time.Millisecond) {
		pods := labelled(t, labels)
		if len(pods) == n && !slices.ContainsFunc(pods, func(p corev1.Pod) bool { return p.Status.Phase != corev1.PodRunning }) {
			return pods
		}
		if time.Now().After(deadline) {
			t.Fatalf("not %d running GPU pods in %s:\n%s", n, 2*podWait, describe(pods))
		}
	}
}

// scaleUnschedulable scales Deployment name to replicas and waits until
// a pod of it is unschedulable for want of resource.
func scaleUnschedulable(t *testing.T, name string, labels map[string]string, replicas int32, resource string) {
	t.Helper()
	ctx := context.Background()
	deps := env.client.AppsV1().Deployments("default")
	scale, err := deps.GetScale(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	scale.Spec.Replicas = replicas
	if _, err := deps.UpdateScale(ctx, name, scale, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Within(t, podWait, fmt.Sprintf("replica %d unschedulable", replicas), func() bool {
		for _, p := range labelled(t, labels) {
			if p.Spec.NodeName == "" && unschedulable(p, "Insufficient "+resource) {
				return true
			}
		}
		return false
	})
}

// TestPlacedWhereGPUsFit: a pod asking for 3 GPUs can only run on node-b
// and does, seeing 3; a pod asking for 5 fits no node and stays Pending
// with the scheduler's reason in its conditions.
func TestPlacedWhereGPUsFit(t *testing.T) {
	needCluster(t)
	createPod(t, gpuPod("default", "three-gpus", 3, nil, ""))
	p := waitRunning(t, "default", "three-gpus")
	if p.Spec.NodeName != env.b.Name {
		t.Errorf("the 3-GPU pod runs on %s, want %s (the only node with 4)", p.Spec.NodeName, env.b.Name)
	}
	if seen := gpusSeen(t, p); len(seen) != 3 {
		t.Errorf("the 3-GPU pod sees %v, want 3 GPUs", seen)
	}

	createPod(t, gpuPod("default", "five-gpus", 5, nil, ""))
	testutil.Within(t, podWait, "the 5-GPU pod unschedulable", func() bool {
		p, err := env.client.CoreV1().Pods("default").Get(context.Background(), "five-gpus", metav1.GetOptions{})
		return err == nil && unschedulable(*p, "Insufficient nvidia.com/gpu")
	})
	// The scheduler binds a pod only after an attempt it fits, and its
	// attempt said it fits nowhere: Pending, on no node.
	if p, err := env.client.CoreV1().Pods("default").Get(context.Background(), "five-gpus", metav1.GetOptions{}); err != nil || p.Status.Phase != corev1.PodPending || p.Spec.NodeName != "" {
		t.Errorf("the 5-GPU pod: %v, phase %s on %q; want Pending on no node", err, p.Status.Phase, p.Spec.NodeName)
	}
}

// unschedulable reports whether p's PodScheduled condition is False
// because it is Unschedulable, with a message holding reason.
func unschedulable(p corev1.Pod, reason string) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled {
			return c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable && strings.Contains(c.Message, reason)
		}
	}
	return false
}

// labelled returns the default namespace's pods with labels.
func labelled(t *testing.T, labels map[string]string) []corev1.Pod {
	t.Helper()
	sel := metav1.FormatLabelSelector(&metav1.LabelSelector{MatchLabels: labels})
	pods, err := env.client.CoreV1().Pods("default").List(context.Background(), metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		t.Fatal(err)
	}
	return pods.Items
}

// deleteDeployment deletes a Deployment and waits until its pods are
// gone.
func deleteDeployment(t *testing.T, name string, labels map[string]string) {
	t.Helper()
	ctx := context.Background()
	fg := metav1.DeletePropagationForeground
	_ = env.client.AppsV1().Deployments("default").Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: &fg})
	for _, p := range labelled(t, labels) {
		deletePod(t, "default", p.Name)
	}
	testutil.Within(t, 60*time.Second, "the Deployment's pods gone", func() bool { return len(labelled(t, labels)) == 0 })
}

// describe says, a line per pod, where each runs and in which state, as
// `kubectl get pods -o wide` and the pods' conditions do.
func describe(pods []corev1.Pod) string {
	var b strings.Builder
	for _, p := range pods {
		fmt.Fprintf(&b, "%s on %q: %s %s %s", p.Name, p.Spec.NodeName, p.Status.Phase, p.Status.Reason, p.Status.Message)
		for _, c := range p.Status.ContainerStatuses {
			if w := c.State.Waiting; w != nil {
				fmt.Fprintf(&b, "; %s waiting: %s %s", c.Name, w.Reason, w.Message)
			}
		}
		for _, c := range p.Status.Conditions {
			if c.Status != corev1.ConditionTrue {
				fmt.Fprintf(&b, "; %s %s: %s", c.Type, c.Reason, c.Message)
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}

// TestCountBesideKubeletAllocation: kubelet allocates a device-plugin
// pod's GPU when it admits the pod, well before its container is created
// (here, while an init container runs); a count-annotation pod created
// meanwhile on that node gets the other GPU, not the one kubelet gave
// (the device-plugin pod's container would then be refused for as long as
// the count pod lives), and both run, each with its own GPU.
func TestCountBesideKubeletAllocation(t *testing.T) {
	needCluster(t)
	kubeletPod := gpuPod("default", "kubelet-first", 1, nil, env.a.Name)
	kubeletPod.Spec.InitContainers = []corev1.Container{{Name: "wait", Image: kubeletPod.Spec.Containers[0].Image, ImagePullPolicy: corev1.PullNever, Command: []string{"/bin/sleep", "6"}}}
	createPod(t, kubeletPod)
	testutil.Within(t, podWait, "pod kubelet-first's init container running", func() bool {
		p, err := env.client.CoreV1().Pods("default").Get(context.Background(), kubeletPod.Name, metav1.GetOptions{})
		return err == nil && len(p.Status.InitContainerStatuses) == 1 && p.Status.InitContainerStatuses[0].State.Running != nil
	})
	createPod(t, gpuPod("default", "count-meanwhile", 0, map[string]string{"gpu-count.nri-gpu.io": "1"}, env.a.Name))
	counted := gpusSeen(t, waitRunning(t, "default", "count-meanwhile"))
	allocated := gpusSeen(t, waitRunning(t, "default", kubeletPod.Name))
	if len(counted) != 1 || len(allocated) != 1 || counted[0] == allocated[0] {
		t.Errorf("the count pod sees %v and the device-plugin pod %v: want one GPU each, not the same", counted, allocated)
	}
	if e := warning("default", kubeletPod.Name, "Failed", nil); e != nil {
		t.Errorf("the device-plugin pod's container was refused: %s", e.Message)
	}
	t.Logf("device-plugin pod (allocated first, created last): %v; count pod: %v", allocated, counted)
}
