package link_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
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

// TestOptions: the driver is handed exactly what nri-gpu starts it
// with, its configuration's DRA block whole, and refuses to start on
// what the configuration's validation refuses, or without what it
// cannot guess.
func TestOptions(t *testing.T) {
	in := link.Options{DRA: config.Default().Start.DRA, Node: "node-1", LogLevel: "debug", LogFormat: "json"}
	in.DRA.Enabled = true
	in.DRA.DriverName, in.DRA.UnhealthyTaint, in.DRA.CDIDevices = "gpu.example.com", "NoExecute", "nri-gpu"
	for _, kubeconfig := range []string{"", "/etc/nri-gpu/kubeconfig"} {
		in.DRA.Kubeconfig = kubeconfig
		got, err := link.ParseOptions(in.Args(), &strings.Builder{})
		if err != nil {
			t.Fatalf("ParseOptions(%q): %v", in.Args(), err)
		}
		if diff := cmp.Diff(in, got); diff != "" {
			t.Errorf("ParseOptions(Args()) (-want +got):\n%s", diff)
		}
	}
	edited := func(f func(*link.Options)) []string {
		o := in
		f(&o)
		return o.Args()
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no options", nil, "--options is needed"},
		{"no node", edited(func(o *link.Options) { o.Node = "" }), "the node's name is needed"},
		{"an effect kube-controller-manager does not act on", edited(func(o *link.Options) { o.DRA.UnhealthyTaint = "PreferNoSchedule" }), `start.dra.unhealthyTaint`},
		{"a cdiDevices the driver has no use for", edited(func(o *link.Options) { o.DRA.CDIDevices = "annotations" }), `start.dra.cdiDevices`},
		{"a relative plugin directory", edited(func(o *link.Options) { o.DRA.PluginDir = "plugins" }), `start.dra.pluginDir`},
		{"a field it does not know", []string{`--options={"Node":"n","Privileged":true}`}, `unknown field "Privileged"`},
		{"not JSON", []string{"--options=node-1"}, "--options: invalid character"},
		{"an argument after the flags", append(in.Args(), "extra"), `unexpected argument "extra"`},
		{"a flag of before", append(in.Args(), "--driver-name=x"), "flag provided but not defined: -driver-name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := link.ParseOptions(tc.args, &strings.Builder{})
			testutil.ErrorSays(t, err, tc.want)
		})
	}
}

// TestAsked: a claim's allocated devices reach the admission as they
// resolve in the snapshot (footprint and hooks), or with why they do not,
// each with what the claim asked of it.
func TestAsked(t *testing.T) {
	snap := testutil.Snapshot(t, `cdiVersion: "0.7.0"
kind: nvidia.com/gpu
devices:
  - name: "0"
    containerEdits: {deviceNodes: [{path: /dev/null, type: c, major: 1, minor: 3}]}
containerEdits:
  hooks: [{hookName: createContainer, path: /usr/bin/nvidia-cdi-hook}]
`)
	cfg := policy.GpuConfig{Strategy: config.StrategyMPS, ActiveThreadPercentage: 30}
	got := link.Asked(snap, []link.Allocated{
		{CDI: "nvidia.com/gpu=0", Requests: []string{"r"}, Use: policy.Use{Shares: 1}, MemoryAsked: true, GpuConfig: cfg},
		{CDI: "nvidia.com/gpu=9", Requests: []string{"s"}},
	})
	if len(got) != 2 {
		t.Fatalf("asked %+v, want two devices", got)
	}
	zero, nine := got[0], got[1]
	if zero.Unresolved != nil || len(zero.Device.Nodes) != 1 || len(zero.Hooks) != 1 || zero.Claim == nil ||
		zero.Claim.Name != "nvidia.com/gpu=0" || !slices.Equal(zero.Claim.Requests, []string{"r"}) || zero.Claim.Use.Shares != 1 || !zero.Claim.MemoryAsked || zero.Claim.GpuConfig != cfg {
		t.Errorf("GPU 0 asked as %+v (claim %+v); want its footprint, hook and what the claim asked", zero, zero.Claim)
	}
	if !errors.Is(nine.Unresolved, specs.ErrUnresolvable) || nine.Device.Name != "nvidia.com/gpu=9" || nine.Claim == nil || !slices.Equal(nine.Claim.Requests, []string{"s"}) {
		t.Errorf("GPU 9 asked as %+v; want it unresolvable, with its request", nine)
	}
}
