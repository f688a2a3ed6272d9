package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/test/harness"
)

// TestNoDoubleInjectionWithRuntimeCDI runs nri-gpu beside containerd's own
// CDI support (enable_cdi on, the default on 2.x): a device containerd
// injects for a cdi.k8s.io annotation is not injected again, nor are its
// spec's edits (hooks would run twice), while a pod annotation's device
// still is.
func TestNoDoubleInjectionWithRuntimeCDI(t *testing.T) {
	needEnv(t)
	ctd := extraContainerd(t, "ctd-both", harness.Options{EnableCDI: true, CDISpecDirs: []string{env.host.SpecDir}})
	p := startPlugin(t, ctd)

	podID, pod := newPod(t, ctd, map[string]string{"gpus.nri-gpu.io": "1"})
	_, spec := runContainer(t, ctd, podID, pod, harness.Container{
		Name: "c", Annotations: map[string]string{"cdi.k8s.io/dp": "nvidia.com/gpu=0"},
	})
	paths := devicePaths(spec)
	for _, want := range []string{"/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm"} {
		if n := len(slices.DeleteFunc(slices.Clone(paths), func(p string) bool { return p != want })); n != 1 {
			t.Errorf("%s appears %d times in %v, want once", want, n, paths)
		}
	}
	if n := len(spec.Hooks.CreateContainer) + len(spec.Hooks.Poststart); n != 2 {
		t.Errorf("%d hooks, want the spec's two once: %+v", n, spec.Hooks)
	}
	if n := len(slices.DeleteFunc(slices.Clone(spec.Process.Env), func(e string) bool { return e != "NVIDIA_VISIBLE_DEVICES=void" })); n != 1 {
		t.Errorf("NVIDIA_VISIBLE_DEVICES appears %d times", n)
	}
	if !strings.Contains(p.Log(), "already injected by the runtime") {
		t.Error("nri-gpu did not log that it left the runtime's device alone")
	}
}

// TestRequiredPluginFailsClosed shows the containerd 2.2+ setup under which
// a GPU pod fails instead of starting without its GPU when nri-gpu is
// absent: NRI's default validator, and the pod annotation
// required-plugins.noderesource.dev naming nri-gpu.
func TestRequiredPluginFailsClosed(t *testing.T) {
	needEnv(t)
	if !env.tools.Containerd2() {
		t.Skipf("containerd %s has no NRI default validator (2.2+): the gap is documented", env.tools.ContainerdVersion)
	}
	ctd := extraContainerd(t, "ctd-required", harness.Options{DefaultValidator: true})
	annotations := map[string]string{
		"gpus.nri-gpu.io":                   "0",
		"required-plugins.noderesource.dev": `["nri-gpu"]`,
	}
	podID, pod := newPod(t, ctd, annotations)
	id, err := ctd.CreateContainer(podID, pod, harness.Container{Name: "without"})
	if err == nil {
		t.Fatalf("container %s was created without nri-gpu running", id)
	}
	if !strings.Contains(err.Error(), `required plugin \"nri-gpu\" not present`) && !strings.Contains(err.Error(), `required plugin "nri-gpu" not present`) {
		t.Errorf("error does not name the missing plugin: %v", err)
	}

	startPlugin(t, ctd)
	_, spec := runContainer(t, ctd, podID, pod, harness.Container{Name: "with"})
	if !slices.Contains(devicePaths(spec), "/dev/nvidia0") {
		t.Errorf("with nri-gpu running, devices %v", devicePaths(spec))
	}
}

// TestBesideNVIDIAsNRIPlugin runs NVIDIA's own NRI plugin (the NVIDIA
// Container Toolkit's, which asks the runtime to inject with AddCDIDevice)
// beside nri-gpu on containerd 2.x with its own CDI on. With NVIDIA's
// annotation key in nri-gpu's annotationKeys, a pod annotated for NVIDIA's
// plugin would get its GPU from both: nri-gpu refuses the container at
// NRI validation, naming the device and the other plugin. With the key
// taken out of nri-gpu's configuration (reloaded, no restart), the same
// pod's container is created with the GPU's device node, env and hooks
// once each, from NVIDIA's plugin through the runtime's CDI.
func TestBesideNVIDIAsNRIPlugin(t *testing.T) {
	needEnv(t)
	if !env.tools.Containerd2() {
		t.Skip("NVIDIA's plugin injects through AddCDIDevice, which needs the runtime's own CDI (containerd 2.x)")
	}
	bin := env.tools.Path("nvidia-nri-plugin")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("NVIDIA's NRI plugin: %v (make test builds it)", err)
	}
	ctd := extraContainerd(t, "beside-nvidia", harness.Options{EnableCDI: true, CDISpecDirs: []string{env.host.SpecDir}})
	config := filepath.Join(ctd.Dir, "nri-gpu.yaml")
	write := func(keys string) {
		replaceFile(t, config, env.host.PluginConfig(nil, "exclusive: true")+"annotationKeys: ["+keys+"]\n")
	}
	write("gpus.nri-gpu.io, nvidia.cdi.k8s.io")
	plugin, err := ctd.StartPlugin("--config", config)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(plugin.Log(), "ValidateContainerAdjustment") {
		t.Errorf("nri-gpu did not subscribe to validation on containerd 2.x; log:\n%s", plugin.Log())
	}
	logPath := filepath.Join(ctd.Dir, "nvidia-nri.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	cmd := exec.Command(bin, "--socket-path", ctd.NRISock, "--idx", "20")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	testutil.Within(t, 10*time.Second, "NVIDIA's plugin registered", func() bool {
		data, _ := os.ReadFile(logPath)
		return strings.Contains(string(data), "NVIDIA's NRI plugin started")
	})

	podID, pod := newPod(t, ctd, map[string]string{"nvidia.cdi.k8s.io": "nvidia.com/gpu=1"})
	_, err = ctd.CreateContainer(podID, pod, harness.Container{Name: "both"})
	testutil.ErrorSays(t, err, "a device would be injected twice",
		"nvidia.com/gpu=1, which nri-gpu injects as nvidia.com/gpu=1 and plugin", "20-nvidia-nri-plugin", "asks the runtime to inject")

	write("gpus.nri-gpu.io")
	testutil.Within(t, 15*time.Second, "nri-gpu's configuration reloaded", func() bool { return strings.Contains(plugin.Log(), "configuration reloaded") })
	_, spec := runContainer(t, ctd, podID, pod, harness.Container{Name: "nvidia"})
	if got := gpuNodes(spec); !slices.Equal(got, []string{"/dev/nvidia1"}) {
		t.Errorf("NVIDIA's plugin alone: GPU nodes %v, want /dev/nvidia1 once", got)
	}
	seen := map[string]int{}
	for _, e := range spec.Process.Env {
		seen[e]++
	}
	for _, m := range spec.Mounts {
		seen["mount "+m.Destination]++
	}
	if spec.Hooks != nil {
		for _, h := range spec.Hooks.CreateContainer {
			seen["hook "+strings.Join(h.Args, " ")]++
		}
	}
	for k, n := range seen {
		if n > 1 {
			t.Errorf("%q is in the container's spec %d times", k, n)
		}
	}
	if _, ok := spec.Annotations["nri-gpu.io/devices"]; ok {
		t.Errorf("nri-gpu recorded devices it did not inject: %v", spec.Annotations)
	}
}
