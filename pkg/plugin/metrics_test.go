package plugin_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

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
// (a pod by name, by count, by kubelet's allocation; a claim and the pod
// it was prepared for); a pod removed leaves no series, and its GPU's
// shares are free again.
func TestHolderMetrics(t *testing.T) {
	m := metrics.New()
	p, _ := logged(t, "", plugin.WithSpecDirs([]string{namedGPUSpecDir(t, 4, func(i int) []string { return []string{fmt.Sprint(i), fmt.Sprintf("GPU-uuid-%d", i)} })}), plugin.WithMetrics(m))
	for _, c := range []struct {
		pod    string
		podAnn map[string]string
		ctrAnn map[string]string
	}{
		{pod: "named", podAnn: map[string]string{"gpus.nri-gpu.io": "GPU-uuid-0"}},
		{pod: "counted", podAnn: map[string]string{"gpu-count.nri-gpu.io": "1"}},
		{pod: "kubelet", ctrAnn: map[string]string{"cdi.k8s.io/nri-gpu_main": "nvidia.com/gpu=2"}},
	} {
		pod := gpuPod(c.pod, c.podAnn)
		if _, _, err := p.CreateContainer(context.Background(), pod, ctrOf(pod, c.ctrAnn)); err != nil {
			t.Fatalf("%s: %v", c.pod, err)
		}
	}
	if err := p.DRAView(config.Default().Start.DRA).Prepare(context.Background(),
		policy.Claim{UID: "uid-gpu", Namespace: "tenant", Name: "gpu", Pods: []string{"tenant/claimed"}},
		[]link.Allocated{{CDI: "nvidia.com/gpu=GPU-uuid-3", Requests: []string{"gpu"}}}); err != nil {
		t.Fatal(err)
	}
	series := func(gpu, door, pod, claim string) string {
		return fmt.Sprintf(`nri_gpu_device_holder{UUID="GPU-uuid-%s",cdi_device="nvidia.com/gpu=%s",claim=%q,door=%q,gpu=%q,namespace="tenant",pod=%q} 1`, gpu, gpu, claim, door, gpu, pod)
	}
	want := []string{
		series("0", "annotation", "named", ""),
		series("1", "count", "counted", ""),
		series("2", "device-plugin", "kubelet", ""),
		series("3", "dra", "claimed", "gpu"),
	}
	if diff := cmp.Diff(want, holderSeries(t, m)); diff != "" {
		t.Errorf("holders (-want +got):\n%s", diff)
	}
	if body := scrape(t, m); !strings.Contains(body, `nri_gpu_device_shares_used{UUID="GPU-uuid-0",cdi_device="nvidia.com/gpu=0",gpu="0"} 1`) {
		t.Errorf("GPU 0 not used in:\n%s", body)
	}

	if err := p.StopPodSandbox(context.Background(), gpuPod("named", nil)); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want[1:], holderSeries(t, m)); diff != "" {
		t.Errorf("holders once pod named is gone (-want +got):\n%s", diff)
	}
	if body := scrape(t, m); !strings.Contains(body, `nri_gpu_device_shares_used{UUID="GPU-uuid-0",cdi_device="nvidia.com/gpu=0",gpu="0"} 0`) {
		t.Errorf("GPU 0 still used once its pod is gone:\n%s", body)
	}
}
