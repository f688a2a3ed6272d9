package cluster

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/access"
	"github.com/nri-gpu/nri-gpu/test/harness"
)

// TestUserNamespacedPods: pods with hostUsers: false (Kubernetes' user
// namespaces, on by default since 1.36) on node-b, containerd 2.3.7 with
// runc 1.5.2, whose own CDI is on. Asked by annotation, nri-gpu gives the
// GPU: the container runs as root of a user namespace of its own, opens
// its GPU (the fake node's hostPath differs from its path: nri-gpu binds
// it, with its cgroup rule) and reads its record. Through the device
// plugin and DRA with the suite's settings, node-b's containerd injects
// the devices with its own CDI, which runc cannot create in a user
// namespace for such a node: nri-gpu refuses the container saying what
// to do, instead of runc failing it. Done so (both doors' cdiDevices:
// nri-gpu, nri-gpu on node-b restarted to read it), they hand the
// runtime nothing to inject, and both pods run as the annotation's does
// (the claim's as uid 1000).
func TestUserNamespacedPods(t *testing.T) {
	needCluster(t)
	n := env.b
	hostUsers := false
	userNS := func(p *corev1.Pod) *corev1.Pod {
		p.Spec.HostUsers = &hostUsers
		return p
	}
	// runs checks that container ctr of pod name runs as uid of a user
	// namespace whose root is mapped elsewhere, opens its one GPU and
	// reads it in its record; it returns the GPU.
	runs := func(name, ctr, door, uid string) string {
		t.Helper()
		p := waitAllRunning(t, "default", name)
		seen := seenBy(t, p, ctr)
		if len(seen) != 1 {
			t.Fatalf("%s: sees %v, want one GPU", door, seen)
		}
		index := strings.TrimPrefix(seen[0], "nvidia")
		out, err := n.Ctd.Exec(containerID(t, p, ctr), "sh", "-c", "id -u; head -n 1 /proc/self/uid_map; head -c 1 /dev/"+seen[0]+" 2>&1; grep -c nvidia.com/gpu="+index+" $"+access.EnvVar+"; true")
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("hostUsers: false, %s: %s", door, strings.Join(strings.Fields(out), " "))
		if f := strings.Fields(out); len(f) < 4 || f[0] != uid || f[1] != "0" || f[2] == "0" {
			t.Errorf("%s: %q, want uid %s in a namespace whose root is mapped to another host uid", door, out, uid)
		}
		if !strings.Contains(out, "/dev/"+seen[0]+": No such device or address") || !strings.HasSuffix(strings.TrimSpace(out), "1") {
			t.Errorf("%s: in the container: %q, want /dev/%s opened (ENXIO) and named by its record", door, out, seen[0])
		}
		return seen[0]
	}

	p := createPod(t, userNS(gpuPod("default", "userns-annotation", 0, map[string]string{"gpus.nri-gpu.io": "1"}, n.Name)))
	if got := runs(p.Name, "main", "by annotation", "0"); got != "nvidia1" {
		t.Errorf("by annotation: sees %s, want nvidia1", got)
	}
	deletePod(t, "default", p.Name)

	devicePlugin := func() *corev1.Pod { return userNS(gpuPod("default", "userns-device-plugin", 1, nil, n.Name)) }
	createTemplate(t, "default", "userns-gpu", harness.ClaimSpec(driverName, 1))
	claimer := func() *corev1.Pod {
		p := userNS(claimPod("default", "userns-claim", n, "userns-gpu", ""))
		p.Spec.Containers = p.Spec.Containers[:1] // gpu
		return p
	}
	createPod(t, devicePlugin())
	refusedWith(t, "default", "userns-device-plugin", "which the runtime's own CDI injects", "cdiDevices: nri-gpu", "enable_cdi = false")
	deletePod(t, "default", "userns-device-plugin")
	createPod(t, claimer())
	refusedWith(t, "default", "userns-claim", "which the runtime's own CDI injects", "cdiDevices: nri-gpu", "enable_cdi = false")
	deletePod(t, "default", "userns-claim")
	waitAllocatable(t, n, n.GPUs)

	own := valuesFile(t, "userns-values.yaml", "config:\n  devicePlugin: {cdiDevices: nri-gpu}\n  dra: {cdiDevices: nri-gpu}\n")
	restartNRI(t, n, env.values, own)
	t.Cleanup(func() { restartNRI(t, n, env.values) })
	createPod(t, devicePlugin())
	runs("userns-device-plugin", "main", "device plugin, cdiDevices: nri-gpu", "0")
	deletePod(t, "default", "userns-device-plugin")
	// As a user other than the namespace's root.
	nonRoot := claimer()
	uid := int64(1000)
	nonRoot.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsUser: &uid}
	createPod(t, nonRoot)
	runs("userns-claim", "gpu", "DRA claim, cdiDevices: nri-gpu, uid 1000", "1000")
	deletePod(t, "default", "userns-claim")
	waitAllocatable(t, n, n.GPUs)
}

// restartNRI restarts nri-gpu on node n with the values files
// (restartWith) and waits until the new one serves every door: its device
// plugin registered with kubelet, every GPU allocatable and in its
// ResourceSlice.
func restartNRI(t *testing.T, n *harness.Node, values ...string) {
	t.Helper()
	restartWith(t, []*harness.Node{n}, driverName, values...)
	testutil.Within(t, podWait, n.Name+": nri-gpu's device plugin registered with kubelet", func() bool {
		return strings.Contains(devicePluginLog(t, n), "registered with kubelet")
	})
	waitAllocatable(t, n, n.GPUs)
	waitSlice(t, n, gpuNames(n)...)
}
