package link_test

import (
	"strings"
	"testing"

	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
)

// TestDeviceName: a device's name in the ResourceSlice is a DNS label:
// "gpu-<minor>" for a GPU whose minor is known (NVIDIA's DRA driver's
// names), else its CDI class and name, lowercased, cut to 63.
func TestDeviceName(t *testing.T) {
	tests := []struct {
		name string
		info link.Info
		want string
	}{
		{"a GPU by its minor, not its index", link.Info{Kind: "nvidia.com/gpu", Name: "1", Type: link.TypeGPU, Index: 1, Minor: 3}, "gpu-3"},
		{"a GPU of minor 0", link.Info{Kind: "nvidia.com/gpu", Name: "GPU-abc", Type: link.TypeGPU, Index: -1, Minor: 0}, "gpu-0"},
		{"a GPU whose minor is unknown", link.Info{Kind: "nvidia.com/gpu", Name: "GPU-ABC", Type: link.TypeGPU, Minor: -1}, "gpu-gpu-abc"},
		{"a MIG device", link.Info{Kind: "nvidia.com/gpu", Name: "0:1", Type: link.TypeMIG, Minor: 0}, "gpu-0-1"},
		{"another kind", link.Info{Kind: "vendor.com/fpga", Name: "Card_A.1", Minor: -1}, "fpga-card-a-1"},
		{"cut at a dash", link.Info{Kind: "vendor.com/x", Name: strings.Repeat("a", 61) + "-bbbb", Minor: -1}, "x-" + strings.Repeat("a", 61)},
		{"cut within a word", link.Info{Kind: "vendor.com/x", Name: strings.Repeat("a", 70), Minor: -1}, "x-" + strings.Repeat("a", 61)},
		{"one character longer than a label", link.Info{Kind: "vendor.com/x", Name: strings.Repeat("a", 62), Minor: -1}, "x-" + strings.Repeat("a", 61)},
		{"exactly a label", link.Info{Kind: "vendor.com/x", Name: strings.Repeat("a", 61), Minor: -1}, "x-" + strings.Repeat("a", 61)},
		{"cut where a dash ends the label", link.Info{Kind: "vendor.com/x", Name: strings.Repeat("a", 60) + "-bbbb", Minor: -1}, "x-" + strings.Repeat("a", 60)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.info.DeviceName(); got != tc.want {
				t.Errorf("DeviceName() = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestOptions: the driver parses exactly what nri-gpu starts it with,
// and refuses to start without what it cannot guess.
func TestOptions(t *testing.T) {
	in := link.Options{Node: "node-1", LogLevel: "debug", LogFormat: "json"}
	in.DRA.Enabled = true
	in.DRA.DriverName, in.DRA.PluginDir, in.DRA.RegistryDir = "gpu.example.com", "/var/lib/kubelet/plugins", "/var/lib/kubelet/plugins_registry"
	in.DRA.UnhealthyTaint, in.DRA.CDIDevices = "NoExecute", "nri-gpu"
	for _, kubeconfig := range []string{"", "/etc/nri-gpu/kubeconfig"} {
		in.DRA.Kubeconfig = kubeconfig
		var stderr strings.Builder
		got, err := link.ParseOptions(in.Args(), &stderr)
		if err != nil {
			t.Fatalf("ParseOptions(%q): %v", in.Args(), err)
		}
		if got.DRA.DriverName != in.DRA.DriverName || got.DRA.PluginDir != in.DRA.PluginDir || got.DRA.RegistryDir != in.DRA.RegistryDir ||
			got.DRA.UnhealthyTaint != in.DRA.UnhealthyTaint || got.DRA.CDIDevices != in.DRA.CDIDevices || got.DRA.Kubeconfig != in.DRA.Kubeconfig || got.Node != in.Node || got.LogLevel != in.LogLevel || got.LogFormat != in.LogFormat || !got.DRA.Enabled {
			t.Errorf("ParseOptions(Args()) = %+v, want %+v", got, in)
		}
	}
	for _, missing := range []string{"driver-name", "node-name", "plugin-dir", "registry-dir", "unhealthy-taint"} {
		var args []string
		for _, a := range in.Args() {
			if !strings.HasPrefix(a, "--"+missing+"=") {
				args = append(args, a)
			}
		}
		_, err := link.ParseOptions(args, &strings.Builder{})
		if err == nil || !strings.Contains(err.Error(), "--"+missing+" is needed") {
			t.Errorf("without --%s: %v", missing, err)
		}
	}
	for _, extra := range [][]string{{"extra"}, {"extra", "more"}} {
		if _, err := link.ParseOptions(append(in.Args(), extra...), &strings.Builder{}); err == nil || !strings.Contains(err.Error(), `unexpected argument "extra"`) {
			t.Errorf("arguments %q after the flags: %v, want the first named", extra, err)
		}
	}
	if _, err := link.ParseOptions(append(in.Args(), "--unhealthy-taint=PreferNoSchedule"), &strings.Builder{}); err == nil || !strings.Contains(err.Error(), `--unhealthy-taint="PreferNoSchedule"`) {
		t.Errorf("an effect kube-controller-manager does not act on: %v", err)
	}
	if _, err := link.ParseOptions(append(in.Args(), "--cdi-devices=annotations"), &strings.Builder{}); err == nil || !strings.Contains(err.Error(), `--cdi-devices="annotations": want cri or nri-gpu`) {
		t.Errorf("a cdiDevices the driver has no use for: %v", err)
	}
	var older []string // as a driver is started by an nri-gpu before the flag
	for _, a := range in.Args() {
		if !strings.HasPrefix(a, "--cdi-devices=") {
			older = append(older, a)
		}
	}
	if got, err := link.ParseOptions(older, &strings.Builder{}); err != nil || got.DRA.CDIDevices != "cri" {
		t.Errorf("without --cdi-devices: %q, %v; want cri", got.DRA.CDIDevices, err)
	}
	if _, err := link.ParseOptions([]string{"--no-such-flag"}, &strings.Builder{}); err == nil {
		t.Error("an unknown flag was taken")
	}
}
