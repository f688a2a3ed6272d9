package e2e

import (
	"slices"
	"strings"
	"testing"

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
