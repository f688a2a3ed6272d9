package e2e

import (
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
	ctd := extraContainerd(t, "ctd-prereg", harness.Options{PreRegister: env.host.PluginConfig(nil, "allowAll: true")})
	podID, pod := newPod(t, ctd, map[string]string{"gpus.nri-gpu.io": "all"})
	_, spec := runContainer(t, ctd, podID, pod, harness.Container{Name: "c"})
	for _, want := range []string{"/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl"} {
		if !slices.Contains(devicePaths(spec), want) {
			t.Errorf("devices %v lack %s", devicePaths(spec), want)
		}
	}
}
