package cluster

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/nri-gpu/nri-gpu/pkg/access"
	"github.com/nri-gpu/nri-gpu/test/harness"
)

// TestUserNamespacedPods: pods with hostUsers: false (Kubernetes' user
// namespaces, on by default since 1.36) on node-b, containerd 2.3.7 with
// runc 1.5.2. Asked by annotation, nri-gpu gives the GPU: the container
// runs as root of a user namespace of its own, opens its GPU (the fake
// node's hostPath differs from its path: nri-gpu binds it, with its
// cgroup rule) and reads its record. Through the device plugin and DRA,
// node-b's containerd injects the devices with its own CDI (on there),
// which runc cannot create in a user namespace for such a node: nri-gpu
// refuses the container saying what to do, instead of runc failing it.
func TestUserNamespacedPods(t *testing.T) {
	needCluster(t)
	n := env.b
	hostUsers := false
	userNS := func(p *corev1.Pod) *corev1.Pod {
		p.Spec.HostUsers = &hostUsers
		return p
	}

	p := createPod(t, userNS(gpuPod("default", "userns-annotation", 0, map[string]string{"gpus.nri-gpu.io": "1"}, n.Name)))
	p = waitRunning(t, "default", p.Name)
	if seen := gpusSeen(t, p); len(seen) != 1 || seen[0] != "nvidia1" {
		t.Errorf("sees %v, want nvidia1", seen)
	}
	id := containerID(t, p, "main")
	out, err := n.Ctd.Exec(id, "sh", "-c", "head -n 1 /proc/self/uid_map; head -c 1 /dev/nvidia1 2>&1; grep -c nvidia.com/gpu=1 $"+access.EnvVar+"; true")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("hostUsers: false, by annotation: %s", strings.Join(strings.Fields(out), " "))
	if f := strings.Fields(out); len(f) < 3 || f[0] != "0" || f[1] == "0" {
		t.Errorf("uid map %q, want root of a namespace mapped to another host uid", out)
	}
	if !strings.Contains(out, "/dev/nvidia1: No such device or address") || !strings.HasSuffix(strings.TrimSpace(out), "1") {
		t.Errorf("in the container: %q, want /dev/nvidia1 opened (ENXIO) and named by its record", out)
	}
	deletePod(t, "default", p.Name)

	createPod(t, userNS(gpuPod("default", "userns-device-plugin", 1, nil, n.Name)))
	refusedWith(t, "default", "userns-device-plugin", "which the runtime's own CDI injects", "enable_cdi = false")
	deletePod(t, "default", "userns-device-plugin")

	createTemplate(t, "default", "userns-gpu", harness.ClaimSpec(driverName, 1))
	claimer := userNS(claimPod("default", "userns-claim", n, "userns-gpu", ""))
	claimer.Spec.Containers = claimer.Spec.Containers[:1] // gpu
	createPod(t, claimer)
	refusedWith(t, "default", "userns-claim", "which the runtime's own CDI injects", "enable_cdi = false")
	deletePod(t, "default", "userns-claim")
	waitAllocatable(t, n, n.GPUs)
}
