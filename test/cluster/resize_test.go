package cluster

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/test/harness"
)

// TestInPlaceResize: a GPU pod of each door (a count annotation, the
// device plugin's resource, a DRA claim) resized in place (its CPU and
// memory, through the pod's resize subresource, GA since Kubernetes 1.35)
// keeps its container, its GPU and its GPU's use: runc's update rewrites
// the container's cgroup (on a cgroup v2 node with systemd, the scope's
// properties, devices included: what left GPUs unusable after a resize
// where a hook had added them, HAMi #1704), and the GPU still opens
// (ENXIO: let through by the device cgroup) while another GPU's node,
// made in the container, stays refused (EPERM). On every node.
func TestInPlaceResize(t *testing.T) {
	needCluster(t)
	createTemplate(t, "default", "resize-gpu", harness.ClaimSpec(driverName, 1))
	for _, n := range env.nodes {
		t.Run(n.Name, func(t *testing.T) {
			logsOnFailure(t, n)
			for _, door := range []struct {
				name, ctr string
				pod       func(name string) *corev1.Pod
			}{
				{"annotation", "main", func(name string) *corev1.Pod {
					return gpuPod("default", name, 0, map[string]string{"gpu-count.nri-gpu.io": "1"}, n.Name)
				}},
				{"device-plugin", "main", func(name string) *corev1.Pod { return gpuPod("default", name, 1, nil, n.Name) }},
				{"dra", "gpu", func(name string) *corev1.Pod { return claimPod("default", name, n, "resize-gpu", "") }},
			} {
				t.Run(door.name, func(t *testing.T) {
					resizeKeepsGPU(t, n, door.pod("resize-"+n.Name+"-"+door.name), door.ctr)
				})
			}
		})
	}
}

// resizeKeepsGPU runs pod p (Burstable: container ctr asks for CPU and
// memory), checks its GPU, resizes ctr in place and checks it again.
func resizeKeepsGPU(t *testing.T, n *harness.Node, p *corev1.Pod, ctr string) {
	t.Helper()
	i := containerIndex(t, p, ctr)
	p.Spec.Containers[i].Resources.Requests = resources(p.Spec.Containers[i].Resources.Requests, "100m", "64Mi")
	p.Spec.Containers[i].Resources.Limits = resources(p.Spec.Containers[i].Resources.Limits, "200m", "128Mi")
	createPod(t, p)
	running := waitAllRunning(t, p.Namespace, p.Name)
	id := containerID(t, running, ctr)
	gpus := gpusIn(t, n, id, p.Name)
	if len(gpus) != 1 {
		t.Fatalf("pod %s sees GPUs %v, want one", p.Name, gpus)
	}
	gpuAccess(t, n, id, gpus[0], "before the resize")

	resizeInPlace(t, p, i, ctr)
	after, err := env.client.CoreV1().Pods(p.Namespace).Get(context.Background(), p.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if again := containerID(t, after, ctr); again != id {
		t.Fatalf("pod %s's container %s was replaced by the resize (%s, was %s)", p.Name, ctr, again, id)
	}
	if now := gpusIn(t, n, id, p.Name); len(now) != 1 || now[0] != gpus[0] {
		t.Errorf("after the resize pod %s sees GPUs %v, want %s", p.Name, now, gpus[0])
	}
	gpuAccess(t, n, id, gpus[0], "after the resize")
}

// resizeInPlace asks container ctr (index i) of pod p for more CPU and
// memory through the pod's resize subresource and waits until kubelet
// says the new memory limit is in force.
func resizeInPlace(t *testing.T, p *corev1.Pod, i int, ctr string) {
	t.Helper()
	ctx := context.Background()
	// kubelet writes the pod's status meanwhile: the resize is asked
	// again on the pod as it is now, as kubectl does.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		got, err := env.client.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		got.Spec.Containers[i].Resources.Requests = resources(got.Spec.Containers[i].Resources.Requests, "150m", "96Mi")
		got.Spec.Containers[i].Resources.Limits = resources(got.Spec.Containers[i].Resources.Limits, "300m", "192Mi")
		_, err = env.client.CoreV1().Pods(p.Namespace).UpdateResize(ctx, p.Name, got, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatalf("resizing pod %s: %v", p.Name, err)
	}
	want := resource.MustParse("192Mi")
	testutil.Within(t, podWait, "pod "+p.Name+" resized in place", func() bool {
		now, err := env.client.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		for _, c := range now.Status.Conditions {
			if c.Type == corev1.PodResizePending || c.Type == corev1.PodResizeInProgress {
				return false
			}
		}
		for _, s := range now.Status.ContainerStatuses {
			if s.Name == ctr && s.Resources != nil {
				limit := s.Resources.Limits[corev1.ResourceMemory]
				return limit.Cmp(want) == 0
			}
		}
		return false
	})
}

// gpuAccess checks, in container id on node n, that GPU node gpu opens
// (ENXIO: the device cgroup lets it through, no driver behind the fake
// node) and that another GPU's node made in the container does not
// (EPERM from the device cgroup; on CRI-O, whose containers lack
// CAP_MKNOD by default, EPERM from mknod itself).
func gpuAccess(t *testing.T, n *harness.Node, id, gpu, when string) {
	t.Helper()
	minor, err := strconv.Atoi(strings.TrimPrefix(gpu, "nvidia"))
	if err != nil {
		t.Fatalf("GPU node %q: %v", gpu, err)
	}
	other := (minor + 1) % n.GPUs
	out, err := n.Ctd.Exec(id, "sh", "-c", fmt.Sprintf("head -c 1 /dev/%s 2>&1; mknod /tmp/other c 195 %d 2>&1 && head -c 1 /tmp/other 2>&1; rm -f /tmp/other; true", gpu, other))
	if err != nil {
		t.Fatalf("%s: exec: %v: %s", when, err, out)
	}
	for _, want := range []string{"/dev/" + gpu + ": No such device or address", "/tmp/other: Operation not permitted"} {
		if !strings.Contains(out, want) {
			t.Errorf("%s: in the container %q, want %q (its GPU let through, GPU %d refused by the device cgroup)", when, out, want, other)
		}
	}
}

// resources returns list with CPU and memory set.
func resources(list corev1.ResourceList, cpu, memory string) corev1.ResourceList {
	out := corev1.ResourceList{}
	for k, v := range list {
		out[k] = v
	}
	out[corev1.ResourceCPU] = resource.MustParse(cpu)
	out[corev1.ResourceMemory] = resource.MustParse(memory)
	return out
}

// containerIndex is the index of container ctr in pod p's spec.
func containerIndex(t *testing.T, p *corev1.Pod, ctr string) int {
	t.Helper()
	for i, c := range p.Spec.Containers {
		if c.Name == ctr {
			return i
		}
	}
	t.Fatalf("pod %s has no container %q", p.Name, ctr)
	return -1
}

// TestNodeShape: each node is the shape the suite says. On the cgroup
// v2 node (systemdShape), kubelet runs with its defaults: no cgroup
// driver, cgroup root or failCgroupV1 in its configuration, the systemd
// driver taken from what containerd reports, and nri-gpu's own container
// in a scope of a slice under kubepods.slice, as runc's systemd driver
// makes it; on the other nodes, the cgroupfs driver under the node's own
// cgroup root. A node of CRI-O (crioNode) is one: kubelet reports its
// containers as CRI-O's.
func TestNodeShape(t *testing.T) {
	needCluster(t)
	pods := nriPods(t)
	for _, n := range env.nodes {
		config := readFile(t, filepath.Join(n.Dir, "kubelet.yaml"))
		p, ok := pods[n.Name]
		if !ok || len(p.Status.ContainerStatuses) == 0 {
			t.Fatalf("no nri-gpu container on %s", n.Name)
		}
		id := runtimeID(p.Status.ContainerStatuses[0].ContainerID)
		if runtime, _, _ := strings.Cut(p.Status.ContainerStatuses[0].ContainerID, "://"); crioNode() != (runtime == "cri-o") {
			t.Errorf("%s: nri-gpu's container runs on %q", n.Name, runtime)
		}
		path, err := n.Ctd.Crictl("inspect", "-o", "go-template", "--template", "{{.info.runtimeSpec.linux.cgroupsPath}}", id)
		if err != nil {
			t.Fatalf("%s: %v: %s", n.Name, err, path)
		}
		if !systemdShape() {
			if !strings.Contains(config, "cgroupDriver: cgroupfs") || strings.Contains(path, ".slice") {
				t.Errorf("%s: cgroupfs wanted: nri-gpu's cgroups path %q, kubelet's configuration:\n%s", n.Name, path, config)
			}
			continue
		}
		for _, key := range []string{"cgroupDriver", "cgroupRoot", "failCgroupV1"} {
			if strings.Contains(config, key+":") {
				t.Errorf("%s: kubelet's configuration sets %s; the node runs kubelet's default", n.Name, key)
			}
		}
		if log := readFile(t, filepath.Join(n.Dir, "kubelet.log")); !strings.Contains(log, `"Using cgroup driver setting received from the CRI runtime" cgroupDriver="systemd"`) {
			t.Errorf("%s: kubelet does not say it took the systemd cgroup driver from containerd", n.Name)
		}
		scope := "cri-containerd"
		if crioNode() {
			scope = "crio"
		}
		if !strings.HasPrefix(path, "kubepods-") || !strings.Contains(path, ".slice:"+scope+":"+id) {
			t.Errorf("%s: nri-gpu's cgroups path %q, want a %s scope of a kubepods slice", n.Name, path, scope)
		}
	}
}
