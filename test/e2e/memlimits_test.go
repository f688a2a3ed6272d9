package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nri-gpu/nri-gpu/pkg/memlimit"
	"github.com/nri-gpu/nri-gpu/test/harness"
)

// boundedSharing shares GPU 0 four ways by time-slicing, with 40Gi of
// memory counted: 10Gi for each pod.
const boundedSharing = `sharing: [{devices: ["nvidia.com/gpu=0"], replicas: 4, memory: 40Gi}]`

// boundsDriver installs, under a new driver root, a fake NVIDIA driver of
// the suite host's GPUs (their UUIDs) that records the per-cgroup memory
// limits it is asked to set in limits (built here, or ahead where
// harness.FakeDriverEnv says: the VM's node has no compiler), and returns
// the root.
func boundsDriver(t *testing.T) (root, limits string) {
	t.Helper()
	dir := t.TempDir()
	root = filepath.Join(dir, "root")
	d, build := harness.GuestFakeDriver(), os.Getenv(harness.FakeDriverEnv)
	if build == "" {
		build = filepath.Join(dir, "build")
		d.KernelVersionFile, d.LimitsFile = filepath.Join(dir, "nvidia-module-version"), filepath.Join(dir, "limits")
		if err := harness.BuildFakeDriver(d, build); err != nil {
			t.Fatal(err)
		}
	}
	// Built ahead, its files are at fixed paths: none left of another
	// test.
	files := filepath.Dir(d.LimitsFile)
	if err := os.MkdirAll(files, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{d.LimitsFile, d.LimitsFile + ".not-supported"} {
		if err := os.Remove(f); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}
	if err := harness.InstallFakeDriver(build, filepath.Join(root, "usr", "lib64"), d.KernelVersionFile, d.Version, ""); err != nil {
		t.Fatal(err)
	}
	return root, d.LimitsFile
}

// TestDriverBoundsMemory: a pod given GPU 0, which time-slicing shares
// with its memory counted, is bounded by the driver (a fake NVML, loaded
// by nri-gpu through go-nvml's dlopen, recording each call), whether it
// asks by annotation or as kubelet asks a device plugin's allocation (its
// CRI request's CDI device). On a cgroup v2 node (the VM's): at the
// container's start, on its own cgroup (the one its process is in), soft
// and hard at the pod's 10Gi (its environment asking more gets no more);
// set again on the same cgroup by an nri-gpu killed and started again;
// lifted at its stop. On cgroup v1 (this workplace's hosts): refused
// under policy.memoryLimits: enforced, saying why; run under agreement,
// no limit set, said in nri-gpu's log. A driver that answers
// NOT_SUPPORTED refuses it too, or runs it by agreement.
func TestDriverBoundsMemory(t *testing.T) {
	needEnv(t)
	v2 := memlimit.Cgroups{Root: "/sys/fs/cgroup"}.V2() == nil
	// kubelet's allocation reaches the runtime as a device plugin's
	// cdi.k8s.io annotation on containerd 1.7, as CRI CDI devices that
	// containerd's own CDI injects on 2.x (TestDevicePlugin).
	kubelet, opts := harness.Container{Name: "c", Annotations: map[string]string{"cdi.k8s.io/nri-gpu_nvidia.com_gpu": "nvidia.com/gpu=0"}}, harness.Options{}
	if env.tools.Containerd2() {
		kubelet = harness.Container{Name: "c", CDIDevices: []string{"nvidia.com/gpu=0"}}
		opts = harness.Options{EnableCDI: true, CDISpecDirs: []string{env.host.SpecDir}}
	}
	doors := map[string]harness.Container{
		"annotation":    {Name: "c", Env: map[string]string{"NVIDIA_GPU_MEMORY_LIMIT": "999999"}},
		"device plugin": kubelet,
	}
	asks := map[string]map[string]string{"annotation": {"gpus.nri-gpu.io": "0"}}
	for _, mode := range []string{"enforced", "agreement"} {
		for door, ctr := range doors {
			t.Run(mode+", "+door, func(t *testing.T) {
				o := harness.Options{}
				if door == "device plugin" {
					o = opts
				}
				boundsByDoor(t, mode, v2, asks[door], ctr, o)
			})
		}
	}
}

// boundsByDoor runs TestDriverBoundsMemory's pod on a containerd of
// opts: asking by its pod's annotations ann, or as ctr asks.
func boundsByDoor(t *testing.T, mode string, v2 bool, ann map[string]string, ctr harness.Container, opts harness.Options) {
	t.Helper()
	root, limits := boundsDriver(t)
	ctd := extraContainerd(t, "ctd-bounds", opts)
	config := "version: v1\n" + env.host.PluginConfig(nil, "exclusive: true", "memoryLimits: "+mode, boundedSharing) + "start:\n  driverRoot: " + root + "\n"
	start := func() *harness.Plugin {
		t.Helper()
		file := filepath.Join(ctd.Dir, "nri-gpu.yaml")
		if err := os.WriteFile(file, []byte(config), 0o644); err != nil {
			t.Fatal(err)
		}
		p, err := ctd.StartPlugin("--config", file)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	p := start()
	podID, pod := newPod(t, ctd, ann)
	if !v2 {
		if mode == "enforced" {
			createFailsOn(t, ctd, podID, pod, ctr, `device "nvidia.com/gpu=0": policy.sharing[0] (replicas 4, timeSlicing) counts each holder's memory, which the driver cannot bound here`,
				"is not cgroup v2", "policy.memoryLimits: agreement")
			return
		}
		runContainer(t, ctd, podID, pod, ctr)
		if got, _ := harness.ReadLimits(limits); len(got) != 0 {
			t.Errorf("limits set on cgroup v1: %v", got)
		}
		if !strings.Contains(p.Log(), "GPU memory bounded by agreement only") {
			t.Errorf("nri-gpu's log does not say the pod runs by agreement:\n%s", p.Log())
		}
		return
	}
	id, _ := runContainer(t, ctd, podID, pod, ctr)
	cgroup := containerCgroup(t, ctd, id)
	set := fmt.Sprintf("%s %s %d %d", harness.UUID(0), cgroup, uint64(10<<30), uint64(10<<30))
	wantLimits(t, limits, set)
	p.Kill()
	p = start()
	wantLimits(t, limits, set, set)
	if out, err := ctd.Crictl("stop", id); err != nil {
		t.Fatalf("stopping the container: %v\n%s", err, out)
	}
	wantLimits(t, limits, set, set, fmt.Sprintf("%s %s 0 %d", harness.UUID(0), cgroup, memlimit.Unlimited))
	// A driver that answers NOT_SUPPORTED (another pod, asked of a newly
	// started nri-gpu: the node is asked once).
	if err := os.WriteFile(limits+".not-supported", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	p.Kill()
	start()
	otherID, other := newPod(t, ctd, ann)
	if mode == "enforced" {
		createFailsOn(t, ctd, otherID, other, ctr, "which the driver cannot bound here", "Not Supported")
	} else {
		runContainer(t, ctd, otherID, other, ctr)
	}
}

// containerCgroup returns the full path of the cgroup v2 directory of
// container id's process.
func containerCgroup(t *testing.T, ctd *harness.Containerd, id string) string {
	t.Helper()
	out, err := ctd.Crictl("inspect", "-o", "go-template", "--template", "{{.info.pid}}", id)
	if err != nil {
		t.Fatalf("the container's pid: %v\n%s", err, out)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("the container's pid %q: %v", out, err)
	}
	dir, err := memlimit.Host.Of(pid, id)
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// wantLimits checks the fake driver's calls, waiting a while for them
// (a restarted nri-gpu sets its bounds again once it has synchronized).
func wantLimits(t *testing.T, file string, want ...string) {
	t.Helper()
	var got []string
	deadline := time.Now().Add(10 * time.Second)
	for {
		var err error
		if got, err = harness.ReadLimits(file); err != nil {
			t.Fatal(err)
		}
		if strings.Join(got, "\n") == strings.Join(want, "\n") || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("the driver was asked\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
