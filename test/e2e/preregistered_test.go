package e2e

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/nri-gpu/nri-gpu/test/harness"
)

// TestPreRegisteredPlugin installs nri-gpu where containerd starts plugins
// itself (plugin_path), with its configuration in plugin_config_path. The
// binary runs with no arguments, so the device resolves only if the
// configuration containerd handed it (cdiSpecDirs) was applied.
func TestPreRegisteredPlugin(t *testing.T) {
	needEnv(t)
	ctd, err := harness.StartContainerd(filepath.Join(env.dir, "ctd-prereg"), env.tools, harness.Options{
		Image:       env.image,
		PreRegister: env.host.PluginConfig(nil, "allowAll: true"),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ctd.Stop(); err != nil {
			t.Error(err)
		}
	})
	podID, pod := newPod(t, ctd, map[string]string{"gpus.nri-gpu.io": "all"})
	_, spec := runContainer(t, ctd, podID, pod, harness.Container{Name: "c"})
	for _, want := range []string{"/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl"} {
		if !slices.Contains(devicePaths(spec), want) {
			t.Errorf("devices %v lack %s", devicePaths(spec), want)
		}
	}
}
