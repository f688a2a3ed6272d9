package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/test/harness"
)

// TestGVisor runs GPU pods in gVisor (runsc on its systrap platform, and
// its containerd shim, built from gVisor's module by make e2e-tools:
// hack/gvisor.sh), given GPU 0 of the spec nri-gpu generated for a fake
// driver whose libraries are real shared objects, and has the probe
// dlopen them by soname inside the sandbox:
//
//   - hook-free: no OCI hook reaches the sandbox, and the libraries load;
//   - with the spec's hooks (create-symlinks, update-ldcache): gVisor's
//     gofer runs them as host root on the container's root, and the
//     libraries load; on containerd 2.x the default validator's
//     reject_oci_hook_adjustment refuses the container first;
//   - the same spec without its hooks, not hook-free: nothing makes the
//     sonames, and the libraries do not load.
//
// gVisor's gofer takes each device node from the host's /dev at its path
// in the container (not from the spec's hostPath), so containerd runs in a
// mount namespace whose /dev also holds the fake GPU's nodes.
func TestGVisor(t *testing.T) {
	needEnv(t)
	dir := filepath.Join(env.dir, "gvisor")
	image, root, specDir := probeHost(t, dir)
	prefix, stop, err := harness.DevNamespace(filepath.Join(dir, "devns"), filepath.Join(root, "dev"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	reject := env.tools.Containerd2()
	ctd := extraContainerd(t, "gvisor-ctd", harness.Options{Image: image, GVisor: filepath.Join(env.tools.Dir, "gvisor"), Prefix: prefix, RejectHooks: reject})
	for _, tc := range []struct {
		name, device string
		hookFree     bool
		// hooks: the container's spec has the NVIDIA hooks; loads: the
		// probe loads the libraries.
		hooks, loads bool
	}{
		{name: "hook-free", device: "0", hookFree: true, loads: true},
		{name: "hooks", device: "0", hooks: true, loads: true},
		{name: "spec without its hooks", device: "example.com/nohooks=0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			config := filepath.Join(ctd.Dir, fmt.Sprintf("nri-gpu-%v.yaml", tc.hookFree))
			if err := os.WriteFile(config, []byte(fmt.Sprintf("cdiSpecDirs: [%s]\nhookFree: %v\npolicy:\n  devices: [\"*/*\"]\n", specDir, tc.hookFree)), 0o644); err != nil {
				t.Fatal(err)
			}
			plug, err := ctd.StartPlugin("--config", config)
			if err != nil {
				t.Fatal(err)
			}
			defer plug.Stop()
			pod := harness.Pod{Name: "gvisor-" + strings.ReplaceAll(tc.name, " ", "-"), Namespace: "e2e", RuntimeHandler: harness.GVisorHandler, Annotations: map[string]string{"gpus.nri-gpu.io": tc.device}}
			podID, err := ctd.RunPod(pod)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if out, err := ctd.Crictl("rmp", "--force", podID); err != nil {
					t.Errorf("removing pod: %v: %s", err, out)
				}
			})
			if tc.hooks && reject {
				_, err := ctd.CreateContainer(podID, pod, harness.Container{Name: "cuda"})
				testutil.ErrorSays(t, err, "restricted OCI hook injection")
				return
			}
			id, spec := runContainer(t, ctd, podID, pod, harness.Container{Name: "cuda"})
			hooks := 0
			if spec.Hooks != nil {
				hooks = len(spec.Hooks.CreateRuntime) + len(spec.Hooks.CreateContainer) + len(spec.Hooks.StartContainer) + len(spec.Hooks.Prestart) + len(spec.Hooks.Poststart)
				for _, h := range spec.Hooks.CreateContainer {
					t.Logf("createContainer hook: %s", strings.Join(h.Args, " "))
				}
			}
			if (hooks > 0) != tc.hooks {
				t.Errorf("the container's spec has %d OCI hooks, want hooks: %v", hooks, tc.hooks)
			}
			kernel, err := ctd.Exec(id, "sh", "-c", "dmesg")
			if err != nil || !strings.Contains(kernel, "Starting gVisor") {
				t.Fatalf("the container does not run in gVisor: dmesg said %q (%v)", kernel, err)
			}
			dev, err := ctd.Exec(id, "sh", "-c", "ls -l /dev/nvidia0 /dev/nvidiactl")
			if err != nil || !strings.Contains(dev, "195,   0") || !strings.Contains(dev, "195, 255") {
				t.Errorf("the sandbox's GPU nodes: %q (%v), want nvidia0 195:0 and nvidiactl 195:255", dev, err)
			}
			out, err := ctd.Exec(id, "/probe")
			t.Logf("the probe in gVisor:\n%s", out)
			if !tc.loads {
				if err == nil || !strings.Contains(out, "libcuda.so.1: cannot open shared object file") {
					t.Errorf("the probe said %q (%v); want it unable to load libcuda.so.1", out, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("the probe could not load the driver in gVisor: %v", err)
			}
			for _, l := range fakeLibs {
				testutil.ErrorSays(t, fmt.Errorf("%s", out), l.fn+"="+l.ret)
			}
		})
	}
}
