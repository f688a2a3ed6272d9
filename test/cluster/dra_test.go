package cluster

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/test/harness"
)

// driverName is the chart's DRA driver, and its DeviceClass.
const driverName = "gpu.nri-gpu.io"

// slice returns the devices of node n's ResourceSlice of nri-gpu's
// driver, by name.
func slice(t *testing.T, n *harness.Node) map[string]resourceapi.Device {
	t.Helper()
	slices, err := env.client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{
		FieldSelector: fields.Set{"spec.nodeName": n.Name, "spec.driver": driverName}.String(),
	})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]resourceapi.Device{}
	for _, s := range slices.Items {
		for _, d := range s.Spec.Devices {
			out[d.Name] = d
		}
	}
	return out
}

// waitSlice waits until node n's ResourceSlice offers exactly want.
func waitSlice(t *testing.T, n *harness.Node, want ...string) {
	t.Helper()
	var got []string
	testutil.Within(t, podWait, fmt.Sprintf("%s's ResourceSlice offers %v", n.Name, want), func() bool {
		got = got[:0]
		for name := range slice(t, n) {
			got = append(got, name)
		}
		slices.Sort(got)
		return slices.Equal(got, want)
	})
}

// gpuNames are the ResourceSlice names of node n's GPUs, but skip.
func gpuNames(n *harness.Node, skip ...int) []string {
	var out []string
	for i := range n.GPUs {
		if !slices.Contains(skip, i) {
			out = append(out, fmt.Sprintf("gpu-%d", i))
		}
	}
	return out
}

// claimPod is a pod on node n whose container "gpu" uses the claim
// "gpu" (from template, or the ResourceClaim claim) and whose container
// "plain" uses nothing.
func claimPod(namespace, name string, n *harness.Node, template, claim string) *corev1.Pod {
	p := harness.SleepPod(namespace, name, 0)
	p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": n.Name}
	gpu := p.Spec.Containers[0]
	gpu.Name = "gpu"
	gpu.Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
	plain := p.Spec.Containers[0]
	plain.Name = "plain"
	p.Spec.Containers = []corev1.Container{gpu, plain}
	pc := corev1.PodResourceClaim{Name: "gpu"}
	if template != "" {
		pc.ResourceClaimTemplateName = &template
	} else {
		pc.ResourceClaimName = &claim
	}
	p.Spec.ResourceClaims = []corev1.PodResourceClaim{pc}
	return p
}

// claimSpec asks for count devices of the DeviceClass class.
func claimSpec(class string, count int64) resourceapi.ResourceClaimSpec {
	return resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
		Name:    "gpus",
		Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count},
	}}}}
}

// createTemplate creates a ResourceClaimTemplate, deleted when the test
// ends.
func createTemplate(t *testing.T, namespace, name string, spec resourceapi.ResourceClaimSpec) {
	t.Helper()
	ctx := context.Background()
	tpl := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}, Spec: resourceapi.ResourceClaimTemplateSpec{Spec: spec}}
	if _, err := env.client.ResourceV1().ResourceClaimTemplates(namespace).Create(ctx, tpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = env.client.ResourceV1().ResourceClaimTemplates(namespace).Delete(ctx, name, metav1.DeleteOptions{})
	})
}

// seenBy returns the GPU device nodes container ctr of pod p sees.
func seenBy(t *testing.T, p *corev1.Pod, ctr string) []string {
	t.Helper()
	for _, s := range p.Status.ContainerStatuses {
		if s.Name == ctr {
			return gpusIn(t, nodeOf(t, p), strings.TrimPrefix(s.ContainerID, "containerd://"), p.Name)
		}
	}
	t.Fatalf("pod %s has no container %q", p.Name, ctr)
	return nil
}

// waitAllRunning waits until every container of pod namespace/name runs.
func waitAllRunning(t *testing.T, namespace, name string) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	testutil.Within(t, podWait, "pod "+namespace+"/"+name+" Running", func() bool {
		p, err := env.client.CoreV1().Pods(namespace).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil || p.Status.Phase != corev1.PodRunning || len(p.Status.ContainerStatuses) != len(p.Spec.Containers) {
			return false
		}
		pod = p
		return !slices.ContainsFunc(p.Status.ContainerStatuses, func(s corev1.ContainerStatus) bool { return s.State.Running == nil })
	})
	return pod
}

// TestDRASlices: nri-gpu publishes each node's GPUs as one ResourceSlice
// of its driver, pool the node, one device per GPU named as NVIDIA's DRA
// driver names it, with the attributes the specs tell (type, index,
// minor) and none they do not (no NVML on these nodes: no productName,
// no memory).
func TestDRASlices(t *testing.T) {
	needCluster(t)
	for _, n := range []*harness.Node{env.a, env.b} {
		waitSlice(t, n, gpuNames(n)...)
		for i := range n.GPUs {
			d := slice(t, n)[fmt.Sprintf("gpu-%d", i)]
			if got := d.Attributes["type"].StringValue; got == nil || *got != "gpu" {
				t.Errorf("%s gpu-%d: type %v, want gpu", n.Name, i, got)
			}
			for _, a := range []resourceapi.QualifiedName{"index", "minor"} {
				if got := d.Attributes[a].IntValue; got == nil || *got != int64(i) {
					t.Errorf("%s gpu-%d: %s %v, want %d", n.Name, i, a, got, i)
				}
			}
			if _, ok := d.Attributes["productName"]; ok || len(d.Capacity) > 0 {
				t.Errorf("%s gpu-%d: attributes %v, capacity %v: made up without NVML", n.Name, i, d.Attributes, d.Capacity)
			}
		}
	}
	if _, err := env.client.ResourceV1().DeviceClasses().Get(context.Background(), driverName, metav1.GetOptions{}); err != nil {
		t.Errorf("the chart's DeviceClass: %v", err)
	}
}

// TestDRAClaim: on each node (containerd 1.7 with CDI off, where only
// nri-gpu can inject; 2.3.7 with CDI on, where containerd injects) a pod
// whose container "gpu" uses a claim made from a template gets exactly
// the GPU the scheduler allocated, and its container "plain" gets none;
// the GPU is held by the claim in the one pool: the device plugin no
// longer offers it, and an annotation pod asking for it by name is
// refused naming the claim and its pod. Deleting the pod unprepares the
// claim and frees the GPU.
func TestDRAClaim(t *testing.T) {
	needCluster(t)
	createTemplate(t, "default", "one-gpu", claimSpec(driverName, 1))
	for _, n := range []*harness.Node{env.a, env.b} {
		t.Run(n.Name, func(t *testing.T) {
			name := "claimer-" + n.Name
			createPod(t, claimPod("default", name, n, "one-gpu", ""))
			p := waitAllRunning(t, "default", name)
			seen := seenBy(t, p, "gpu")
			if len(seen) != 1 {
				t.Fatalf("container gpu sees %v, want one GPU", seen)
			}
			if plain := seenBy(t, p, "plain"); len(plain) != 0 {
				t.Errorf("container plain, which uses no claim, sees %v", plain)
			}
			claim := allocatedClaim(t, p)
			gpu := strings.TrimPrefix(seen[0], "nvidia")
			if got := claim.Status.Allocation.Devices.Results[0].Device; got != "gpu-"+gpu {
				t.Errorf("the claim was allocated %s, the container sees %s", got, seen[0])
			}
			waitAllocatable(t, n, n.GPUs-1)

			waiter := "by-name-" + n.Name
			createPod(t, gpuPod("default", waiter, 0, map[string]string{"gpus.nri-gpu.io": gpu}, n.Name))
			refusedWith(t, "default", waiter, "is held by claim default/"+claim.Name+" of pod default/"+name)
			deletePod(t, "default", waiter)

			deletePod(t, "default", name)
			waitAllocatable(t, n, n.GPUs)
			if log := nriLog(t, n); !strings.Contains(log, "unprepared claim") || !strings.Contains(log, "released devices of DRA claim") {
				t.Errorf("nri-gpu's log on %s does not say it unprepared and released the claim", n.Name)
			}
		})
	}
}

// allocatedClaim returns the claim made for pod p's claim "gpu".
func allocatedClaim(t *testing.T, p *corev1.Pod) *resourceapi.ResourceClaim {
	t.Helper()
	name := ""
	for _, s := range p.Status.ResourceClaimStatuses {
		if s.Name == "gpu" && s.ResourceClaimName != nil {
			name = *s.ResourceClaimName
		}
	}
	if name == "" {
		for _, c := range p.Spec.ResourceClaims {
			if c.Name == "gpu" && c.ResourceClaimName != nil {
				name = *c.ResourceClaimName
			}
		}
	}
	c, err := env.client.ResourceV1().ResourceClaims(p.Namespace).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Status.Allocation == nil || len(c.Status.Allocation.Devices.Results) == 0 {
		t.Fatalf("claim %s is not allocated", name)
	}
	return c
}
