// Package crio tests nri-gpu against a real CRI-O (built from its Go
// module), the runc containerd 2.x ships with, Debian's conmon, crictl
// and a fake GPU host. It needs root; without root every test is skipped
// and says why, unless NRI_GPU_E2E_REQUIRED=1 (make test) makes that a
// failure.
package crio

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	oci "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/test/harness"
)

// env is the shared setup: one CRI-O whose own CDI reads no spec
// directory (CRI-O cannot turn its CDI off), nri-gpu
// connected to its NRI, and the fake GPU host its specs describe.
var env struct {
	skip  string
	dir   string
	tools harness.Tools
	crio  harness.CRIOTools
	image string
	host  *harness.GPUHost
	rt    *harness.Containerd
	nri   *harness.Plugin
}

func TestMain(m *testing.M) {
	code, err := setup()
	if err != nil {
		fmt.Fprintf(os.Stderr, "crio setup: %v\n", err)
		code = 1
	}
	if code == 0 {
		code = m.Run()
	}
	if env.rt != nil {
		if err := env.rt.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "crio teardown: %v\n", err)
			code = 1
		}
	}
	if env.dir != "" && os.Getenv("NRI_GPU_E2E_KEEP") == "" {
		_ = os.RemoveAll(env.dir)
	}
	os.Exit(code)
}

func setup() (int, error) {
	var err error
	switch {
	case os.Geteuid() != 0:
		env.skip = "the CRI-O tests need root (device nodes, mounts, runc)"
	default:
		if env.tools, err = harness.FindTools(""); err == nil {
			env.crio, err = harness.FindCRIO("")
		}
		if err != nil {
			env.skip = fmt.Sprintf("tools missing (run make test): %v", err)
		}
	}
	if env.skip != "" {
		if os.Getenv("NRI_GPU_E2E_REQUIRED") == "1" {
			return 1, fmt.Errorf("%s, and NRI_GPU_E2E_REQUIRED=1", env.skip)
		}
		fmt.Fprintf(os.Stderr, "SKIP crio: %s\n", env.skip)
		return 0, nil
	}
	// Under /tmp, short: it holds unix sockets, whatever TMPDIR is.
	if env.dir, err = os.MkdirTemp("/tmp", "nri-gpu-crio-"); err != nil {
		return 1, err
	}
	env.image = filepath.Join(env.dir, "busybox.tar")
	if err := harness.BuildImage(env.tools.Busybox, env.image); err != nil {
		return 1, err
	}
	if env.host, err = harness.NewGPUHost(env.dir, 2); err != nil {
		return 1, err
	}
	if env.rt, err = harness.StartCRIO(filepath.Join(env.dir, "crio"), env.tools, env.crio, harness.Options{Image: env.image}); err != nil {
		return 1, err
	}
	config := filepath.Join(env.dir, "nri-gpu.yaml")
	if err := os.WriteFile(config, []byte(env.host.PluginConfig(nil, "namespaces: [e2e]", "devices: [nvidia.com/gpu=*]", "exclusive: true")), 0o644); err != nil {
		return 1, err
	}
	if env.nri, err = env.rt.StartPlugin("--config", config); err != nil {
		return 1, fmt.Errorf("%w\nCRI-O's log:\n%s", err, env.rt.LogTail(30))
	}
	return 0, nil
}

func needEnv(t *testing.T) {
	t.Helper()
	if env.skip != "" {
		t.Skip(env.skip)
	}
}

var pods atomic.Int32

// newPod runs a pod of annotations on CRI-O, removed when the test ends.
func newPod(t *testing.T, annotations map[string]string) (string, harness.Pod) {
	t.Helper()
	pod := harness.Pod{Name: fmt.Sprintf("pod-%d", pods.Add(1)), Namespace: "e2e", Annotations: annotations}
	id, err := env.rt.RunPod(pod)
	if err != nil {
		t.Fatalf("%v\nCRI-O's log:\n%s", err, env.rt.LogTail(20))
	}
	t.Cleanup(func() {
		if out, err := env.rt.Crictl("rmp", "--force", id); err != nil && !strings.Contains(out, "not found") {
			t.Errorf("removing pod: %v: %s", err, out)
		}
	})
	return id, pod
}

// gpuNodes are the /dev/nvidiaN nodes of a spec.
func gpuNodes(s *oci.Spec) []string {
	var out []string
	for _, d := range s.Linux.Devices {
		if strings.HasPrefix(d.Path, "/dev/nvidia") && d.Path != "/dev/nvidiactl" && d.Path != "/dev/nvidia-uvm" {
			out = append(out, d.Path)
		}
	}
	slices.Sort(out)
	return out
}

// TestCRIO: nri-gpu registers with CRI-O's NRI and says what CRI-O can
// apply, by the NRI version CRI-O runs (1.34.0's applies no cgroup rule
// of a plugin, whatever NRI's map of releases says); a pod asking GPU 1 by annotation
// gets it (its node in the container's spec, usable inside), a second
// pod asking it under exclusive is refused naming the holder, also after
// nri-gpu was killed and started again (CRI-O's Synchronize and the
// record), and a container that reaches nri-gpu without a name (CRI-O names it by
// kubelet's label, which crictl does not set) while its pod asks per
// container is refused saying why.
func TestCRIO(t *testing.T) {
	needEnv(t)
	log := env.nri.Log()
	if env.crio.Version == "" {
		t.Fatal("crio --version said no version")
	}
	if !strings.Contains(log, "what the runtime can apply: cri-o "+env.crio.Version) || !strings.Contains(log, "does not apply cgroup rules") {
		t.Errorf("nri-gpu does not say what CRI-O %s applies:\n%s", env.crio.Version, log)
	}
	id, pod := newPod(t, map[string]string{"gpus.nri-gpu.io": "1"})
	ctr, err := env.rt.CreateContainer(id, pod, harness.Container{Name: "main"})
	if err != nil {
		t.Fatalf("%v\nCRI-O's log:\n%s", err, env.rt.LogTail(20))
	}
	if err := env.rt.StartContainer(ctr); err != nil {
		t.Fatal(err)
	}
	spec, err := env.rt.ContainerSpec(ctr)
	if err != nil {
		t.Fatal(err)
	}
	if got := gpuNodes(spec); !slices.Equal(got, []string{"/dev/nvidia1"}) {
		t.Errorf("GPU nodes in the spec %v, want /dev/nvidia1", got)
	}
	if out, err := env.rt.Exec(ctr, "ls", "/dev"); err != nil || !strings.Contains(out, "nvidia1") || strings.Contains(out, "nvidia0") {
		t.Errorf("/dev in the container: %v\n%s", err, out)
	}

	other, otherPod := newPod(t, map[string]string{"gpus.nri-gpu.io": "1"})
	if _, err := env.rt.CreateContainer(other, otherPod, harness.Container{Name: "main"}); err == nil || !strings.Contains(err.Error(), "held by pod e2e/"+pod.Name) {
		t.Errorf("a second pod asking GPU 1: %v, want refused naming %s", err, pod.Name)
	}

	// nri-gpu killed and started again: CRI-O's Synchronize reports the
	// running container, the record says what its pod holds, and GPU 1
	// stays its pod's.
	env.nri.Kill()
	if env.nri, err = env.rt.StartPlugin("--config", filepath.Join(env.dir, "nri-gpu.yaml")); err != nil {
		t.Fatal(err)
	}
	testutil.Within(t, 10*time.Second, "the restarted nri-gpu saying what pods hold", func() bool {
		return strings.Contains(env.nri.Log(), "restored devices held by pod")
	})
	again, againPod := newPod(t, map[string]string{"gpus.nri-gpu.io": "1"})
	if _, err := env.rt.CreateContainer(again, againPod, harness.Container{Name: "main"}); err == nil || !strings.Contains(err.Error(), "held by pod e2e/"+pod.Name) {
		t.Errorf("a pod asking GPU 1 after nri-gpu restarted: %v, want refused naming %s", err, pod.Name)
	}

	nameless, namelessPod := newPod(t, map[string]string{"gpus.nri-gpu.io/container.main": "0"})
	_, err = env.rt.CreateContainer(nameless, namelessPod, harness.Container{Name: "main", Unlabelled: true})
	if err == nil || !strings.Contains(strings.ReplaceAll(err.Error(), `\"`, `"`), `pod annotation "gpus.nri-gpu.io/container.main" asks per container, and the runtime named this container none`) {
		t.Errorf("a container without a name, its pod asking per container: %v, want refused saying why", err)
	}
}
