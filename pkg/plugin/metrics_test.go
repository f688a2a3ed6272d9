package plugin_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/containerd/nri/pkg/api"
	"github.com/google/go-cmp/cmp"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
	"github.com/nri-gpu/nri-gpu/pkg/metrics"
	"github.com/nri-gpu/nri-gpu/pkg/plugin"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
)

// holderSeries returns the nri_gpu_device_holder samples of m, sorted.
func holderSeries(t *testing.T, m *metrics.Metrics) []string {
	t.Helper()
	var out []string
	for _, line := range strings.Split(scrape(t, m), "\n") {
		if strings.HasPrefix(line, "nri_gpu_device_holder{") {
			out = append(out, line)
		}
	}
	slices.Sort(out)
	return out
}

// TestHolderMetrics: every door's holding is one nri_gpu_device_holder
// series of its GPU, by UUID and index, naming the door and the holder
// (a pod by name, by count, by kubelet's allocation: nri-gpu's device
// plugin's, or a CDI device of the CRI request, which kubelet fills from
// device plugins; a claim and the pod it was prepared for); a pod
// removed leaves no series, and its GPU's shares are free again.
func TestHolderMetrics(t *testing.T) {
	m := metrics.New()
	p, _ := logged(t, "", plugin.WithSpecDirs([]string{namedGPUSpecDir(t, 5, func(i int) []string { return []string{fmt.Sprint(i), fmt.Sprintf("GPU-uuid-%d", i)} })}), plugin.WithMetrics(m))
	for _, c := range []struct {
		pod    string
		podAnn map[string]string
		ctrAnn map[string]string
		cdi    string // a CDI device of the CRI request
	}{
		{pod: "named", podAnn: map[string]string{"gpus.nri-gpu.io": "GPU-uuid-0"}},
		{pod: "counted", podAnn: map[string]string{"gpu-count.nri-gpu.io": "1"}},
		{pod: "kubelet", ctrAnn: map[string]string{"cdi.k8s.io/nri-gpu_main": "nvidia.com/gpu=2"}},
		{pod: "runtime", cdi: "nvidia.com/gpu=4"},
	} {
		pod := gpuPod(c.pod, c.podAnn)
		ctr := ctrOf(pod, c.ctrAnn)
		if c.cdi != "" {
			ctr.CDIDevices = []*api.CDIDevice{{Name: c.cdi}}
		}
		if _, _, err := p.CreateContainer(context.Background(), pod, ctr); err != nil {
			t.Fatalf("%s: %v", c.pod, err)
		}
	}
	if err := p.DRAView(config.Default().Start.DRA).Prepare(context.Background(),
		policy.Claim{UID: "uid-gpu", Namespace: "tenant", Name: "gpu", Pods: []policy.PodName{{Namespace: "tenant", Name: "claimed"}}},
		[]link.Allocated{{CDI: "nvidia.com/gpu=GPU-uuid-3", Requests: []string{"gpu"}}}); err != nil {
		t.Fatal(err)
	}
	series := func(gpu, door, pod, claim string) string {
		return fmt.Sprintf(`nri_gpu_device_holder{GPU_I_ID="",UUID="GPU-uuid-%s",cdi_device="nvidia.com/gpu=%s",claim=%q,door=%q,gpu=%q,namespace="tenant",pod=%q} 1`, gpu, gpu, claim, door, gpu, pod)
	}
	want := []string{
		series("0", "annotation", "named", ""),
		series("1", "count", "counted", ""),
		series("2", "device-plugin", "kubelet", ""),
		series("3", "dra", "claimed", "gpu"),
		series("4", "device-plugin", "runtime", ""),
	}
	if diff := cmp.Diff(want, holderSeries(t, m)); diff != "" {
		t.Errorf("holders (-want +got):\n%s", diff)
	}
	if body := scrape(t, m); !strings.Contains(body, `nri_gpu_device_shares_used{GPU_I_ID="",UUID="GPU-uuid-0",cdi_device="nvidia.com/gpu=0",gpu="0"} 1`) {
		t.Errorf("GPU 0 not used in:\n%s", body)
	}

	if err := p.StopPodSandbox(context.Background(), gpuPod("named", nil)); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want[1:], holderSeries(t, m)); diff != "" {
		t.Errorf("holders once pod named is gone (-want +got):\n%s", diff)
	}
	if body := scrape(t, m); !strings.Contains(body, `nri_gpu_device_shares_used{GPU_I_ID="",UUID="GPU-uuid-0",cdi_device="nvidia.com/gpu=0",gpu="0"} 0`) {
		t.Errorf("GPU 0 still used once its pod is gone:\n%s", body)
	}
}

// migNode is a spec of a MIG-enabled GPU 0 as nvidia-ctk writes one
// (the GPU, then its MIG devices 0:0, also named by its UUID MIG-aaa,
// and 0:1, each its GPU's node and two capability nodes) and of a whole
// GPU 1; with it, go-nvml's mock with GPU 0 in MIG mode, its MIG devices
// on GPU instances 3 and 5.
func migNode(t *testing.T) (specDir string, lib *dgxa100.Server) {
	t.Helper()
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "nvidia-caps"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"nvidia0", "nvidia1", "nvidia-caps/nvidia-cap30", "nvidia-caps/nvidia-cap31", "nvidia-caps/nvidia-cap50", "nvidia-caps/nvidia-cap51"} {
		writeFile(t, filepath.Join(dir, n), nil)
	}
	mig := func(name string, gi int) string {
		return fmt.Sprintf("  - name: %q\n    containerEdits:\n      deviceNodes: [{path: /dev/nvidia0, hostPath: %[2]s/nvidia0, type: c, major: 195, minor: 0}, {path: /dev/nvidia-caps/nvidia-cap%[3]d0, hostPath: %[2]s/nvidia-caps/nvidia-cap%[3]d0, type: c, major: 511, minor: %[3]d0}, {path: /dev/nvidia-caps/nvidia-cap%[3]d1, hostPath: %[2]s/nvidia-caps/nvidia-cap%[3]d1, type: c, major: 511, minor: %[3]d1}]\n", name, dir, gi)
	}
	specDir = specDirWith(t, dir, "gpu.yaml", fmt.Sprintf(`cdiVersion: "0.6.0"
kind: nvidia.com/gpu
devices:
  - name: "0"
    containerEdits:
      deviceNodes: [{path: /dev/nvidia0, hostPath: %[1]s/nvidia0, type: c, major: 195, minor: 0}]
  - name: "1"
    containerEdits:
      deviceNodes: [{path: /dev/nvidia1, hostPath: %[1]s/nvidia1, type: c, major: 195, minor: 1}]
`, dir)+mig("0:0", 3)+mig("MIG-aaa", 3)+mig("0:1", 5))
	lib = testutil.NVML(2)
	testutil.WithMIGs(lib, 0, testutil.MIG{UUID: "MIG-aaa", GI: 3}, testutil.MIG{UUID: "MIG-bbb", GI: 5})
	return specDir, lib
}

// TestMIGHolderMetrics: on a MIG-enabled GPU, each holder of a MIG
// device (a pod by name, a claim by the MIG device's UUID) is told once,
// under its MIG device, labelled as NVIDIA's DCGM exporter labels that
// MIG device's series (its GPU's UUID and index, its GPU instance id),
// so that the two join on (UUID, GPU_I_ID); a whole GPU's holder keeps
// its GPU's UUID and no instance. Where NVML does not tell the GPU
// instances, a MIG device is told by its own UUID, where the specs name
// it.
func TestMIGHolderMetrics(t *testing.T) {
	for _, withNVML := range []bool{true, false} {
		t.Run(fmt.Sprintf("NVML %v", withNVML), func(t *testing.T) {
			specDir, lib := migNode(t)
			gpu0, gpu1 := lib.Devices[0].(*dgxa100.Device).UUID, lib.Devices[1].(*dgxa100.Device).UUID
			opts := []plugin.Option{plugin.WithSpecDirs([]string{specDir}), plugin.WithPartMajors(func() []int64 { return []int64{511} })}
			type entity struct{ uuid, gi string }
			slice, claimed, whole, gpu0Label := entity{gpu0, "5"}, entity{gpu0, "3"}, entity{gpu1, ""}, gpu0
			if withNVML {
				opts = append(opts, plugin.WithNVML(lib))
			} else {
				slice, claimed, whole, gpu0Label = entity{"", ""}, entity{"MIG-aaa", ""}, entity{"", ""}, ""
			}
			m := metrics.New()
			p, _ := logged(t, "", append(opts, plugin.WithMetrics(m))...)
			for pod, dev := range map[string]string{"slice": "0:1", "whole": "1"} {
				if _, _, err := p.CreateContainer(context.Background(), gpuPod(pod, map[string]string{"gpus.nri-gpu.io": dev}), ctrOf(gpuPod(pod, nil), nil)); err != nil {
					t.Fatalf("%s: %v", pod, err)
				}
			}
			if err := p.DRAView(config.Default().Start.DRA).Prepare(context.Background(),
				policy.Claim{UID: "uid-mig", Namespace: "tenant", Name: "mig", Pods: []policy.PodName{{Namespace: "tenant", Name: "claimed"}}},
				[]link.Allocated{{CDI: "nvidia.com/gpu=MIG-aaa", Requests: []string{"gpu"}}}); err != nil {
				t.Fatal(err)
			}
			series := func(e entity, dev, gpu, door, pod, claim string) string {
				return fmt.Sprintf(`nri_gpu_device_holder{GPU_I_ID=%q,UUID=%q,cdi_device="nvidia.com/gpu=%s",claim=%q,door=%q,gpu=%q,namespace="tenant",pod=%q} 1`, e.gi, e.uuid, dev, claim, door, gpu, pod)
			}
			want := []string{
				series(claimed, "0:0", "0", "dra", "claimed", "mig"),
				series(slice, "0:1", "0", "annotation", "slice", ""),
				series(whole, "1", "1", "annotation", "whole", ""),
			}
			slices.Sort(want)
			if diff := cmp.Diff(want, holderSeries(t, m)); diff != "" {
				t.Errorf("holders (-want +got):\n%s", diff)
			}
			// GPU 0 itself is taken by its MIG devices' holders.
			if body := scrape(t, m); !strings.Contains(body, fmt.Sprintf(`nri_gpu_device_shares_used{GPU_I_ID="",UUID=%q,cdi_device="nvidia.com/gpu=0",gpu="0"} 1`, gpu0Label)) {
				t.Errorf("GPU 0 not taken by its MIG devices' holders:\n%s", body)
			}
		})
	}
}
