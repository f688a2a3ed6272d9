package cluster

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/plugin"
	"github.com/nri-gpu/nri-gpu/test/harness"
)

// nodeDriverRoot is the fake NVIDIA driver's root on each node, where
// the GPU Operator puts a containerized driver's.
const nodeDriverRoot = "/run/nvidia/driver"

// generatedKind is the kind of the spec nri-gpu generates in
// TestDriverUpgradeOnNodes, beside the nodes' own nvidia.com/gpu spec.
const generatedKind = "fakedriver.example.com/gpu"

// generateValues have nri-gpu generate the spec of the fake driver under
// nodeDriverRoot, every second, and put nri-gpu on the node for its hooks
// in the node's own /run.
const generateValues = `config:
  generateSpecs: true
  generateInterval: 1s
  driverRoot: ` + nodeDriverRoot + `
  defaultKind: ` + generatedKind + `
  policy:
    namespaces: [default, "tenant-*"]
    devices: ["nvidia.com/gpu=*", "` + generatedKind + `=*"]
    exclusive: true
hostPaths:
  hookDir: /run/nri-gpu-bin
`

// TestDriverUpgradeOnNodes: on both nodes (containerd 1.7.35 and 2.3.7)
// nri-gpu, installed by the chart with generation on, generates the spec
// of a fake NVIDIA driver whose libnvidia-ml is a real shared object
// (harness.FakeDriver) from the node's containerized driver root, with
// nri-gpu itself, put on the node by the chart's init container, as the
// spec's hook. The driver is upgraded on both nodes as an installer does
// it (new libraries, libnvidia-ml.so.1 repointed, the old removed, the
// module reloaded): each nri-gpu, whose NVML now reports a version
// mismatch, starts again in place (same pod, no restart counted), writes
// the new driver's spec, and pods created afterwards get the new
// driver's libcuda; the pods created before keep running with the old
// one.
func TestDriverUpgradeOnNodes(t *testing.T) {
	needCluster(t)
	old, upgraded := "550.54.15", "560.35.03"
	both := env.nodes
	build := filepath.Join(env.dir, "fake-driver")
	for i, n := range both {
		dir := filepath.Join(build, n.Name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, v := range []string{old, upgraded} {
			d := harness.FakeDriver{Version: v, KernelVersionFile: nodeDriverRoot + "/nvidia-module-version", GPUs: n.GPUs, UUIDPrefix: fmt.Sprintf("GPU-0d1e2f%02x-4b5c-4d6e-8f70-", i)}
			if _, err := d.BuildNVML(dir); err != nil {
				t.Fatal(err)
			}
			// libcuda of the version: a file naming it is enough here
			// (TestDriverUpgrade dlopens it).
			if err := os.WriteFile(filepath.Join(dir, "libcuda.so."+v), []byte("\x7fELF libcuda "+v), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		root := onNode(n, nodeDriverRoot)
		if err := os.MkdirAll(filepath.Join(root, "dev"), 0o755); err != nil {
			t.Fatal(err)
		}
		for g := range n.GPUs {
			if err := unix.Mknod(filepath.Join(root, "dev", fmt.Sprintf("nvidia%d", g)), unix.S_IFCHR|0o666, int(unix.Mkdev(harness.NvidiaMajor, uint32(g)))); err != nil {
				t.Fatal(err)
			}
		}
		if err := unix.Mknod(filepath.Join(root, "dev", "nvidiactl"), unix.S_IFCHR|0o666, int(unix.Mkdev(harness.NvidiaMajor, 255))); err != nil {
			t.Fatal(err)
		}
		if err := harness.InstallFakeDriver(dir, filepath.Join(root, "usr", "lib64"), filepath.Join(root, "nvidia-module-version"), old, ""); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, n := range both {
			for _, p := range []string{nodeDriverRoot, "/run/nri-gpu-bin", filepath.Join(harness.NodeSpecDir, plugin.GeneratedSpecName)} {
				if err := os.RemoveAll(onNode(n, p)); err != nil {
					t.Error(err)
				}
			}
		}
	})
	restartWith(t, both, driverName, env.values, valuesFile(t, "generate-values.yaml", generateValues))
	t.Cleanup(func() { restartWith(t, both, driverName, env.values) })

	generated := func(n *harness.Node, v string) func() bool {
		return func() bool {
			data, err := os.ReadFile(onNode(n, filepath.Join(harness.NodeSpecDir, plugin.GeneratedSpecName)))
			return err == nil && strings.Contains(string(data), "libcuda.so."+v)
		}
	}
	libcuda := func(p string, n *harness.Node) string {
		t.Helper()
		pod := waitRunning(t, "default", p)
		id := containerID(t, pod, "main")
		out, err := n.Ctd.Exec(id, "sh", "-c", "cat /usr/lib64/libcuda.so.*.*")
		if err != nil {
			t.Fatalf("%s: reading libcuda: %v: %s", p, err, out)
		}
		// The link the spec's create-symlinks hook makes: the hook ran,
		// nri-gpu, put on the node by the chart.
		if link, err := n.Ctd.Exec(id, "readlink", "/usr/lib64/libcuda.so"); err != nil || strings.TrimSpace(link) != "libcuda.so.1" {
			t.Errorf("%s: /usr/lib64/libcuda.so links to %q (%v), want libcuda.so.1, made by the spec's hook", p, strings.TrimSpace(link), err)
		}
		return strings.TrimPrefix(strings.TrimSpace(out), "\x7fELF ")
	}
	nriPod := map[string]string{}
	for _, n := range both {
		testutil.Within(t, 30*time.Second, n.Name+": the spec of driver "+old, generated(n, old))
		nriPod[n.Name] = nriPods(t)[n.Name].Name
		createPod(t, gpuPod("default", "driver-before-"+n.Name, 0, map[string]string{"gpus.nri-gpu.io": "0"}, n.Name))
	}
	for _, n := range both {
		if got := libcuda("driver-before-"+n.Name, n); got != "libcuda "+old {
			t.Errorf("%s: the pod created before the upgrade has %q, want libcuda %s", n.Name, got, old)
		}
	}

	upgradedAt := time.Now()
	for _, n := range both {
		root := onNode(n, nodeDriverRoot)
		if err := harness.InstallFakeDriver(filepath.Join(build, n.Name), filepath.Join(root, "usr", "lib64"), filepath.Join(root, "nvidia-module-version"), upgraded, old); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range both {
		testutil.Within(t, 30*time.Second, n.Name+": the spec of driver "+upgraded, generated(n, upgraded))
		t.Logf("%s: the spec of driver %s written within %s of the upgrade", n.Name, upgraded, time.Since(upgradedAt).Round(100*time.Millisecond))
		p := nriPods(t)[n.Name]
		if p.Name != nriPod[n.Name] || len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].RestartCount != 0 {
			t.Errorf("%s: nri-gpu's pod is %s (was %s), statuses %+v: want the same pod, its container never restarted", n.Name, p.Name, nriPod[n.Name], p.Status.ContainerStatuses)
		}
		if log := nriLog(t, n); !strings.Contains(log, "the NVIDIA driver changed under this process's NVML") {
			t.Errorf("%s: nri-gpu's log does not say the driver changed", n.Name)
		}
		createPod(t, gpuPod("default", "driver-after-"+n.Name, 0, map[string]string{"gpus.nri-gpu.io": "1"}, n.Name))
	}
	for _, n := range both {
		if got := libcuda("driver-after-"+n.Name, n); got != "libcuda "+upgraded {
			t.Errorf("%s: the pod created after the upgrade has %q, want libcuda %s", n.Name, got, upgraded)
		}
		if got := libcuda("driver-before-"+n.Name, n); got != "libcuda "+old {
			t.Errorf("%s: the pod created before the upgrade now has %q, want the libcuda %s it was given", n.Name, got, old)
		}
	}
}

// onNode is the host path of path, under /run (or /var/run), as node n
// has it: its own /run.
func onNode(n *harness.Node, path string) string {
	return filepath.Join(n.Dir, "run", strings.TrimPrefix(strings.TrimPrefix(path, "/var"), "/run/"))
}
