package e2e

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nri-gpu/nri-gpu/test/harness"
)

// startKubelet starts a real kubelet (standalone, static pods) against
// ctd, stopped, its pods removed, when the test ends.
func startKubelet(t *testing.T, ctd *harness.Containerd) *harness.Kubelet {
	t.Helper()
	bin := os.Getenv(harness.KubeletEnv)
	if bin == "" {
		if os.Getenv(RequiredEnv) == "1" {
			t.Fatalf("no kubelet: set %s (make test builds it)", harness.KubeletEnv)
		}
		t.Skipf("no kubelet: set %s (make test builds it)", harness.KubeletEnv)
	}
	k, err := harness.StartKubelet(filepath.Join(ctd.Dir, "kubelet"), bin, ctd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := k.Stop(); err != nil {
			t.Error(err)
		}
	})
	return k
}

// podWait is how long a pod may take to run through kubelet: it reads
// the manifest directory every second and retries a failed creation on
// its next sync.
const podWait = 60 * time.Second

// running returns the spec of the running container of static pod name.
func running(t *testing.T, ctd *harness.Containerd, k *harness.Kubelet, name string) (string, []string) {
	t.Helper()
	id, err := k.RunningContainer(name, podWait)
	if err != nil {
		t.Fatal(err)
	}
	spec, err := ctd.ContainerSpec(id)
	if err != nil {
		t.Fatal(err)
	}
	return id, gpuNodes(spec)
}

// refused waits for kubelet to report that nri-gpu refused the container
// of static pod name (CreateContainerError with every one of want), after
// the first since bytes of its log, and checks that the pod has no
// container.
func refused(t *testing.T, k *harness.Kubelet, since int, name string, want ...string) {
	t.Helper()
	if _, err := k.WaitLog(since, podWait, append([]string{"CreateContainerError", k.PodName(name)}, want...)...); err != nil {
		t.Fatal(err)
	}
	if ids, err := k.Containers(name); err != nil || len(ids) > 0 {
		t.Fatalf("pod %s has containers %v (%v), want none", k.PodName(name), ids, err)
	}
}

func addPod(t *testing.T, k *harness.Kubelet, p harness.StaticPod) {
	t.Helper()
	if p.Namespace == "" {
		p.Namespace = "e2e"
	}
	if err := k.AddPod(p); err != nil {
		t.Fatal(err)
	}
}

// TestKubelet runs pods through a real kubelet (v1.34, standalone, static
// pods) on this suite's containerd version, with nri-gpu on a 4-GPU host:
// a pod's container sees only its GPU; a refused pod never gets a
// container and kubelet reports nri-gpu's reason; exclusive holdings,
// count requests and restarts of nri-gpu and kubelet behave as through
// the CRI alone.
func TestKubelet(t *testing.T) {
	needEnv(t)
	ctd := extraContainerd(t, "kubelet", harness.Options{})
	plugin := startPlugin(t, ctd, "namespaces: [e2e]", "devices: [nvidia.com/gpu=*]", "maxDevicesPerPod: 2", "exclusive: true")
	k := startKubelet(t, ctd)

	// A GPU pod's container sees its GPU, and only it.
	addPod(t, k, harness.StaticPod{Name: "gpu1", Annotations: map[string]string{"gpus.nri-gpu.io": "1"}})
	gpu1, nodes := running(t, ctd, k, "gpu1")
	if !slices.Equal(nodes, []string{"/dev/nvidia1"}) {
		t.Errorf("pod gpu1 got %v, want /dev/nvidia1", nodes)
	}
	out, err := ctd.Exec(gpu1, "ls", "/dev")
	if err != nil {
		t.Fatal(err)
	}
	if seen := slices.DeleteFunc(strings.Fields(out), func(n string) bool {
		return !strings.HasPrefix(n, "nvidia") || n == "nvidiactl" || n == "nvidia-uvm"
	}); !slices.Equal(seen, []string{"nvidia1"}) {
		t.Errorf("inside pod gpu1, /dev holds GPUs %v, want nvidia1 only", seen)
	}

	// A pod policy refuses never gets a container; kubelet says why.
	since := k.LogSize()
	addPod(t, k, harness.StaticPod{Name: "elsewhere", Namespace: "default", Annotations: map[string]string{"gpus.nri-gpu.io": "0"}})
	refused(t, k, since, "elsewhere", "denied by policy", "pods of namespace", "may not request devices")

	// Exclusive: a pod asking for a held GPU waits, refused, until the
	// holder is deleted; kubelet's next try then gets it.
	addPod(t, k, harness.StaticPod{Name: "holder", Annotations: map[string]string{"gpus.nri-gpu.io": "2"}})
	running(t, ctd, k, "holder")
	since = k.LogSize()
	addPod(t, k, harness.StaticPod{Name: "waiter", Annotations: map[string]string{"gpus.nri-gpu.io": harness.UUID(2)}})
	refused(t, k, since, "waiter", "denied by policy", "is held by pod e2e/"+k.PodName("holder"), "policy.exclusive")
	if err := k.RemovePod("holder"); err != nil {
		t.Fatal(err)
	}
	if _, nodes := running(t, ctd, k, "waiter"); !slices.Equal(nodes, []string{"/dev/nvidia2"}) {
		t.Errorf("pod waiter got %v once the holder was deleted, want /dev/nvidia2", nodes)
	}

	// Count requests take the free GPUs (0 and 3); one more is refused.
	addPod(t, k, harness.StaticPod{Name: "two", Annotations: map[string]string{"gpu-count.nri-gpu.io": "2"}})
	two, twoNodes := running(t, ctd, k, "two")
	if !slices.Equal(twoNodes, []string{"/dev/nvidia0", "/dev/nvidia3"}) {
		t.Errorf("pod two got %v, want the free /dev/nvidia0 and /dev/nvidia3", twoNodes)
	}
	since = k.LogSize()
	addPod(t, k, harness.StaticPod{Name: "one", Annotations: map[string]string{"gpu-count.nri-gpu.io": "1"}})
	refused(t, k, since, "one", "denied by policy", "0 are free and 4 held")

	// nri-gpu killed and started again, then kubelet restarted: the
	// running containers stay as they are, and nothing is handed out twice.
	plugin.Kill()
	if _, err := ctd.StartPlugin("--config", filepath.Join(ctd.Dir, "nri-gpu.yaml")); err != nil {
		t.Fatal(err)
	}
	since = k.LogSize()
	if err := k.Restart(); err != nil {
		t.Fatal(err)
	}
	refused(t, k, since, "one", "denied by policy", "0 are free and 4 held")
	for name, id := range map[string]string{"gpu1": gpu1, "two": two} {
		if ids, err := k.Containers(name); err != nil || !slices.Equal(ids, []string{id}) {
			t.Errorf("after the restarts pod %s has containers %v (%v), want its first, %s", name, ids, err, id)
		}
	}

	// Deleting a pod frees its GPUs for the one waiting.
	if err := k.RemovePod("two"); err != nil {
		t.Fatal(err)
	}
	if _, nodes := running(t, ctd, k, "one"); len(nodes) != 1 || !slices.Contains(twoNodes, nodes[0]) {
		t.Errorf("pod one got %v once pod two was deleted, want one of %v", nodes, twoNodes)
	}
}
