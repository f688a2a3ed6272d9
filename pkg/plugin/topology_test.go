package plugin_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/plugin"
)

// TestCountRequestsFollowTopology: on a 4-GPU PCIe node across two
// sockets (even GPUs on one, odd on the other, as NVML reports it), a
// count request for 2 gets a same-socket pair, where spec order alone
// would give a pair across the sockets.
func TestCountRequestsFollowTopology(t *testing.T) {
	dir := t.TempDir()
	var spec strings.Builder
	spec.WriteString("cdiVersion: \"0.6.0\"\nkind: nvidia.com/gpu\ndevices:\n")
	for i := 0; i < 4; i++ {
		node := filepath.Join(dir, fmt.Sprintf("nvidia%d", i))
		if err := os.WriteFile(node, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&spec, "  - name: %q\n    containerEdits:\n      deviceNodes: [{path: /dev/nvidia%d, hostPath: %s, type: c, major: 195, minor: %d}]\n", fmt.Sprint(i), i, node, i)
	}
	specDir := filepath.Join(dir, "cdi")
	if err := os.MkdirAll(specDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(specDir, "gpu.yaml"), []byte(spec.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	s := testutil.NVML(4)
	for i, d := range s.Devices {
		dev := d.(*dgxa100.Device)
		dev.GetTopologyCommonAncestorFunc = func(o nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) {
			j := slices.Index(s.Devices, o)
			if i%2 == j%2 {
				return nvml.TOPOLOGY_NODE, nvml.SUCCESS
			}
			return nvml.TOPOLOGY_SYSTEM, nvml.SUCCESS
		}
	}
	cfg, err := config.Parse(nil)
	if err != nil {
		t.Fatal(err)
	}
	p, err := plugin.New(cfg, quiet(), plugin.WithSpecDirs([]string{specDir}), plugin.WithNVML(s))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	count := func(name, n string) string {
		t.Helper()
		pod := &api.PodSandbox{Id: "id-" + name, Name: name, Namespace: "tenant", Annotations: map[string]string{"gpu-count.nri-gpu.io": n}}
		adj, _, err := p.CreateContainer(context.Background(), pod, &api.Container{Id: name + "-c", PodSandboxId: pod.Id, Name: "c", Linux: &api.LinuxContainer{}})
		if err != nil {
			t.Fatal(err)
		}
		return adj.GetAnnotations()[plugin.CountedAnnotation]
	}
	if got := count("a", "1"); got != "nvidia.com/gpu=0" {
		t.Errorf("a request for 1 got %s, want the first free, GPU 0", got)
	}
	if got := count("b", "2"); got != "nvidia.com/gpu=1,nvidia.com/gpu=3" {
		t.Errorf("a request for 2 got %s, want the same-socket pair 1 and 3", got)
	}
}
