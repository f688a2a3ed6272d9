package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
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

// gpusInside returns the GPU nodes a running container sees in its /dev
// (nvidia*, less the fake host's control nodes nvidiactl and nvidia-uvm).
func gpusInside(t *testing.T, ctd *harness.Containerd, id string) []string {
	t.Helper()
	out, err := ctd.Exec(id, "ls", "/dev")
	if err != nil {
		t.Fatal(err)
	}
	return slices.DeleteFunc(strings.Fields(out), func(n string) bool {
		return !strings.HasPrefix(n, "nvidia") || n == "nvidiactl" || n == "nvidia-uvm"
	})
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
	if seen := gpusInside(t, ctd, gpu1); !slices.Equal(seen, []string{"nvidia1"}) {
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

// TestDevicePlugin runs nri-gpu in device-plugin mode beside a real
// kubelet, on a fake 2-GPU host: pods that ask for nvidia.com/gpu in
// their limits each get a GPU of their own; one more, or one asking for
// more than the node has, is refused by kubelet's admission; a GPU an
// annotation pod holds is not offered to kubelet; deleting a pod frees
// its GPU; restarting kubelet or nri-gpu loses no allocation and hands
// out no GPU twice. On containerd 1.7 kubelet's allocation reaches nri-gpu
// as its cdi.k8s.io annotation; on 2.x, with containerd's own CDI on, as
// CRI CDI devices that containerd injects and nri-gpu accounts for.
func TestDevicePlugin(t *testing.T) {
	needEnv(t)
	host, err := harness.NewGPUHost(filepath.Join(env.dir, "dp-host"), 2)
	if err != nil {
		t.Fatal(err)
	}
	opts, mode := harness.Options{}, "annotations"
	if env.tools.Containerd2() {
		opts, mode = harness.Options{EnableCDI: true, CDISpecDirs: []string{host.SpecDir}}, "cri"
	}
	ctd := extraContainerd(t, "device-plugin", opts)
	k := startKubelet(t, ctd)
	config := filepath.Join(ctd.Dir, "nri-gpu.yaml")
	cfg := host.PluginConfig(nil, "namespaces: [e2e]", "devices: [nvidia.com/gpu=*]", "exclusive: true") +
		"devicePlugin:\n  kubeletDir: " + filepath.Join(k.VarLib, "kubelet", "device-plugins") +
		"\n  cdiDevices: " + mode + "\n  resources: [{name: nvidia.com/gpu}]\n"
	if err := os.WriteFile(config, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	// sees returns a pod's GPUs as it sees them in /dev.
	sees := func(name string) []string {
		t.Helper()
		id, err := k.RunningContainer(name, podWait)
		if err != nil {
			t.Fatal(err)
		}
		return gpusInside(t, ctd, id)
	}
	gpu := map[string]string{"nvidia.com/gpu": "1"}

	// A pod kubelet admits before the resource is registered runs with
	// nothing; nri-gpu says so when it registers.
	addPod(t, k, harness.StaticPod{Name: "early", Limits: gpu})
	if got := sees("early"); len(got) > 0 {
		t.Errorf("a pod admitted before nri-gpu registered sees %v", got)
	}
	plugin, err := ctd.StartPlugin("--config", config)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Within(t, podWait, "nri-gpu's word on pods admitted before it registered", func() bool {
		return strings.Contains(plugin.Log(), "a pod it admitted before this registration")
	})
	// kubelet counts that pod's GPU as taken (though it has none) until
	// it is deleted, as nri-gpu says to.
	if err := k.RemovePod("early"); err != nil {
		t.Fatal(err)
	}
	testutil.Within(t, podWait, "the early pod gone", func() bool {
		ids, err := k.Containers("early")
		return err == nil && len(ids) == 0
	})
	// told waits until nri-gpu has told kubelet the devices as want says,
	// after the first since bytes of its log, and kubelet has taken that
	// in, after the first kubeletSince bytes of its own.
	told := func(p *harness.Plugin, since, kubeletSince int, want string) {
		t.Helper()
		testutil.Within(t, podWait, fmt.Sprintf("nri-gpu telling kubelet %q", want), func() bool {
			return strings.Contains(p.Log()[since:], `devices="`+want+`"`)
		})
		if err := k.WaitDevices(kubeletSince, podWait, "nvidia.com/gpu", strings.Count(want, " healthy")); err != nil {
			t.Fatal(err)
		}
	}
	admissionRefuses := func(since int, name, want string) {
		t.Helper()
		if _, err := k.WaitLog(since, podWait, k.PodName(name), "UnexpectedAdmissionError", want); err != nil {
			t.Fatal(err)
		}
		if ids, err := k.Containers(name); err != nil || len(ids) > 0 {
			t.Fatalf("pod %s has containers %v (%v), want none", name, ids, err)
		}
	}
	told(plugin, 0, 0, "0 healthy, 1 healthy")

	since := k.LogSize()
	addPod(t, k, harness.StaticPod{Name: "big", Limits: map[string]string{"nvidia.com/gpu": "3"}})
	admissionRefuses(since, "big", "Requested: 3, Available: 2")

	// A GPU an annotation pod holds is not offered to kubelet.
	since = k.LogSize()
	addPod(t, k, harness.StaticPod{Name: "ann", Annotations: map[string]string{"gpus.nri-gpu.io": "0"}})
	if got := sees("ann"); !slices.Equal(got, []string{"nvidia0"}) {
		t.Fatalf("annotation pod sees %v, want nvidia0", got)
	}
	told(plugin, 0, since, "0 unhealthy, 1 healthy")
	addPod(t, k, harness.StaticPod{Name: "a", Limits: gpu})
	if got := sees("a"); !slices.Equal(got, []string{"nvidia1"}) {
		t.Errorf("pod a sees %v, want nvidia1, the one GPU not held", got)
	}
	// kubelet's allocation reached the runtime as the mode says: the
	// device plugin's annotation, or CRI CDI devices (no annotation).
	id, _ := k.RunningContainer("a", podWait)
	out, err := ctd.Crictl("inspect", id)
	if err != nil {
		t.Fatal(err)
	}
	var inspect struct {
		Status struct{ Annotations map[string]string }
	}
	if err := json.Unmarshal([]byte(out), &inspect); err != nil {
		t.Fatal(err)
	}
	if inspect.Status.Annotations["io.kubernetes.container.hash"] == "" {
		t.Fatalf("crictl inspect shows none of kubelet's annotations: %s", out)
	}
	if got, want := inspect.Status.Annotations["cdi.k8s.io/nri-gpu_nvidia.com_gpu"], map[string]string{"annotations": "nvidia.com/gpu=1", "cri": ""}[mode]; got != want {
		t.Errorf("pod a's container has annotation cdi.k8s.io/nri-gpu_nvidia.com_gpu=%q, want %q (cdiDevices: %s)", got, want, mode)
	}
	since = k.LogSize()
	addPod(t, k, harness.StaticPod{Name: "b", Limits: gpu})
	admissionRefuses(since, "b", "Requested: 1, Available: 0")

	// Deleting the annotation pod frees its GPU for kubelet.
	logged, since := len(plugin.Log()), k.LogSize()
	if err := k.RemovePod("ann"); err != nil {
		t.Fatal(err)
	}
	told(plugin, logged, since, "0 healthy, 1 healthy")
	addPod(t, k, harness.StaticPod{Name: "c", Limits: gpu})
	if got := sees("c"); !slices.Equal(got, []string{"nvidia0"}) {
		t.Errorf("pod c sees %v, want nvidia0, freed by the annotation pod", got)
	}
	ids := map[string][]string{}
	for _, name := range []string{"a", "c"} {
		if ids[name], err = k.Containers(name); err != nil {
			t.Fatal(err)
		}
	}

	// kubelet restarted (it empties its socket directory), then nri-gpu:
	// each time nri-gpu registers again, the running pods keep their
	// GPUs, and a new pod finds none free.
	registered, since := strings.Count(plugin.Log(), "registered with kubelet"), k.LogSize()
	if err := k.Restart(); err != nil {
		t.Fatal(err)
	}
	testutil.Within(t, podWait, "nri-gpu registering again after kubelet restarted", func() bool {
		return strings.Count(plugin.Log(), "registered with kubelet") > registered
	})
	if err := k.WaitDevices(since, podWait, "nvidia.com/gpu", 2); err != nil {
		t.Fatal(err)
	}
	since = k.LogSize()
	addPod(t, k, harness.StaticPod{Name: "d", Limits: gpu})
	admissionRefuses(since, "d", "Requested: 1, Available: 0")

	since = k.LogSize()
	plugin.Kill()
	if plugin, err = ctd.StartPlugin("--config", config); err != nil {
		t.Fatal(err)
	}
	told(plugin, 0, since, "0 healthy, 1 healthy")
	since = k.LogSize()
	addPod(t, k, harness.StaticPod{Name: "e", Limits: gpu})
	admissionRefuses(since, "e", "Requested: 1, Available: 0")
	for name, want := range ids {
		if got, err := k.Containers(name); err != nil || !slices.Equal(got, want) {
			t.Errorf("after the restarts pod %s has containers %v (%v), want %v", name, got, err, want)
		}
	}

	// Deleting a pod frees its GPU for the next.
	if err := k.RemovePod("a"); err != nil {
		t.Fatal(err)
	}
	testutil.Within(t, podWait, "pod a gone", func() bool { // kubelet frees a's GPU once a is gone
		ids, err := k.Containers("a")
		return err == nil && len(ids) == 0
	})
	addPod(t, k, harness.StaticPod{Name: "f", Limits: gpu})
	if got := sees("f"); !slices.Equal(got, []string{"nvidia1"}) {
		t.Errorf("pod f sees %v, want nvidia1, freed by pod a", got)
	}
}
