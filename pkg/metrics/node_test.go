package metrics_test

import (
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nri-gpu/nri-gpu/pkg/metrics"
)

// scrape returns the samples of m whose names start with prefix, as the
// exposition format writes them, sorted.
func scrape(t *testing.T, m *metrics.Metrics, prefix string) []string {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	var out []string
	for _, line := range strings.Split(rec.Body.String(), "\n") {
		if strings.HasPrefix(line, prefix) {
			out = append(out, line)
		}
	}
	slices.Sort(out)
	return out
}

// TestWatchNode: each scrape tells the node's devices as they are then:
// what each offers and what its holders take, each holder with the labels
// that join it to DCGM's series (UUID, gpu, GPU_I_ID) and name it (door,
// namespace, pod, claim); MPS daemons and their clients' bounds where MPS
// shares a device; nothing of a holding that has ended; one series of a
// label set that two holders share.
func TestWatchNode(t *testing.T) {
	tests := []struct {
		name string
		node metrics.Node
		want []string
	}{
		{name: "no devices"},
		{
			name: "a free GPU",
			node: metrics.Node{Devices: []metrics.Device{{Name: "nvidia.com/gpu=0", UUID: "GPU-a", Index: "0", Shares: 1}}},
			want: []string{
				`nri_gpu_device_shares_used{GPU_I_ID="",UUID="GPU-a",cdi_device="nvidia.com/gpu=0",gpu="0"} 0`,
				`nri_gpu_device_shares{GPU_I_ID="",UUID="GPU-a",cdi_device="nvidia.com/gpu=0",gpu="0"} 1`,
			},
		},
		{
			name: "an annotation pod and a device-plugin pod",
			node: metrics.Node{Devices: []metrics.Device{
				{Name: "nvidia.com/gpu=0", UUID: "GPU-a", Index: "0", Shares: 1, SharesUsed: 1, Holders: []metrics.Holder{{Door: metrics.DoorAnnotation, Namespace: "tenant", Pod: "agent", Shares: 1}}},
				{Name: "nvidia.com/gpu=1", UUID: "GPU-b", Index: "1", Shares: 1, SharesUsed: 1, Holders: []metrics.Holder{{Door: metrics.DoorDevicePlugin, Namespace: "tenant", Pod: "trainer", Shares: 1}}},
			}},
			want: []string{
				`nri_gpu_device_holder_shares{GPU_I_ID="",UUID="GPU-a",cdi_device="nvidia.com/gpu=0",claim="",door="annotation",gpu="0",namespace="tenant",pod="agent"} 1`,
				`nri_gpu_device_holder_shares{GPU_I_ID="",UUID="GPU-b",cdi_device="nvidia.com/gpu=1",claim="",door="device-plugin",gpu="1",namespace="tenant",pod="trainer"} 1`,
				`nri_gpu_device_holder{GPU_I_ID="",UUID="GPU-a",cdi_device="nvidia.com/gpu=0",claim="",door="annotation",gpu="0",namespace="tenant",pod="agent"} 1`,
				`nri_gpu_device_holder{GPU_I_ID="",UUID="GPU-b",cdi_device="nvidia.com/gpu=1",claim="",door="device-plugin",gpu="1",namespace="tenant",pod="trainer"} 1`,
				`nri_gpu_device_shares_used{GPU_I_ID="",UUID="GPU-a",cdi_device="nvidia.com/gpu=0",gpu="0"} 1`,
				`nri_gpu_device_shares_used{GPU_I_ID="",UUID="GPU-b",cdi_device="nvidia.com/gpu=1",gpu="1"} 1`,
				`nri_gpu_device_shares{GPU_I_ID="",UUID="GPU-a",cdi_device="nvidia.com/gpu=0",gpu="0"} 1`,
				`nri_gpu_device_shares{GPU_I_ID="",UUID="GPU-b",cdi_device="nvidia.com/gpu=1",gpu="1"} 1`,
			},
		},
		{
			name: "shared with MPS: a claim and a pod, memory counted",
			node: metrics.Node{Devices: []metrics.Device{{
				Name: "nvidia.com/gpu=0", UUID: "GPU-a", Index: "0", Shares: 4, SharesUsed: 2, Memory: 80 << 30, MemoryUsed: 50 << 30,
				Holders: []metrics.Holder{
					{Door: metrics.DoorDRA, Namespace: "tenant", Pod: "agent", Claim: "gpu-claim", Shares: 1, Memory: 30 << 30, MPSCompute: 25, MPSMemory: 30 << 30},
					{Door: metrics.DoorAnnotation, Namespace: "tenant", Pod: "other", Shares: 1, Memory: 20 << 30, MPSCompute: 25, MPSMemory: 20 << 30},
				},
				MPS: &metrics.MPS{Ready: true},
			}}},
			want: []string{
				`nri_gpu_device_holder_memory_bytes{GPU_I_ID="",UUID="GPU-a",cdi_device="nvidia.com/gpu=0",claim="",door="annotation",gpu="0",namespace="tenant",pod="other"} 2.147483648e+10`,
				`nri_gpu_device_holder_memory_bytes{GPU_I_ID="",UUID="GPU-a",cdi_device="nvidia.com/gpu=0",claim="gpu-claim",door="dra",gpu="0",namespace="tenant",pod="agent"} 3.221225472e+10`,
				`nri_gpu_device_holder_shares{GPU_I_ID="",UUID="GPU-a",cdi_device="nvidia.com/gpu=0",claim="",door="annotation",gpu="0",namespace="tenant",pod="other"} 1`,
				`nri_gpu_device_holder_shares{GPU_I_ID="",UUID="GPU-a",cdi_device="nvidia.com/gpu=0",claim="gpu-claim",door="dra",gpu="0",namespace="tenant",pod="agent"} 1`,
				`nri_gpu_device_holder{GPU_I_ID="",UUID="GPU-a",cdi_device="nvidia.com/gpu=0",claim="",door="annotation",gpu="0",namespace="tenant",pod="other"} 1`,
				`nri_gpu_device_holder{GPU_I_ID="",UUID="GPU-a",cdi_device="nvidia.com/gpu=0",claim="gpu-claim",door="dra",gpu="0",namespace="tenant",pod="agent"} 1`,
				`nri_gpu_device_memory_bytes{GPU_I_ID="",UUID="GPU-a",cdi_device="nvidia.com/gpu=0",gpu="0"} 8.589934592e+10`,
				`nri_gpu_device_memory_used_bytes{GPU_I_ID="",UUID="GPU-a",cdi_device="nvidia.com/gpu=0",gpu="0"} 5.36870912e+10`,
				`nri_gpu_device_shares_used{GPU_I_ID="",UUID="GPU-a",cdi_device="nvidia.com/gpu=0",gpu="0"} 2`,
				`nri_gpu_device_shares{GPU_I_ID="",UUID="GPU-a",cdi_device="nvidia.com/gpu=0",gpu="0"} 4`,
			},
		},
		{
			name: "two MIG devices of one GPU: its UUID, each its GPU instance",
			node: metrics.Node{Devices: []metrics.Device{
				{Name: "nvidia.com/gpu=0:0", UUID: "GPU-a", Index: "0", GPUInstance: "1", Shares: 1, SharesUsed: 1, Holders: []metrics.Holder{{Door: metrics.DoorAnnotation, Namespace: "tenant", Pod: "agent", Shares: 1}}},
				{Name: "nvidia.com/gpu=0:1", UUID: "GPU-a", Index: "0", GPUInstance: "2", Shares: 1},
			}},
			want: []string{
				`nri_gpu_device_holder_shares{GPU_I_ID="1",UUID="GPU-a",cdi_device="nvidia.com/gpu=0:0",claim="",door="annotation",gpu="0",namespace="tenant",pod="agent"} 1`,
				`nri_gpu_device_holder{GPU_I_ID="1",UUID="GPU-a",cdi_device="nvidia.com/gpu=0:0",claim="",door="annotation",gpu="0",namespace="tenant",pod="agent"} 1`,
				`nri_gpu_device_shares_used{GPU_I_ID="1",UUID="GPU-a",cdi_device="nvidia.com/gpu=0:0",gpu="0"} 1`,
				`nri_gpu_device_shares_used{GPU_I_ID="2",UUID="GPU-a",cdi_device="nvidia.com/gpu=0:1",gpu="0"} 0`,
				`nri_gpu_device_shares{GPU_I_ID="1",UUID="GPU-a",cdi_device="nvidia.com/gpu=0:0",gpu="0"} 1`,
				`nri_gpu_device_shares{GPU_I_ID="2",UUID="GPU-a",cdi_device="nvidia.com/gpu=0:1",gpu="0"} 1`,
			},
		},
		{
			name: "two sandboxes of one pod name: one series, what both take",
			node: metrics.Node{Devices: []metrics.Device{{
				Name: "nvidia.com/gpu=0", Index: "0", Shares: 4, SharesUsed: 2,
				Holders: []metrics.Holder{{Door: metrics.DoorAnnotation, Namespace: "tenant", Pod: "agent", Shares: 1}, {Door: metrics.DoorAnnotation, Namespace: "tenant", Pod: "agent", Shares: 1}},
			}}},
			want: []string{
				`nri_gpu_device_holder_shares{GPU_I_ID="",UUID="",cdi_device="nvidia.com/gpu=0",claim="",door="annotation",gpu="0",namespace="tenant",pod="agent"} 2`,
				`nri_gpu_device_holder{GPU_I_ID="",UUID="",cdi_device="nvidia.com/gpu=0",claim="",door="annotation",gpu="0",namespace="tenant",pod="agent"} 1`,
				`nri_gpu_device_shares_used{GPU_I_ID="",UUID="",cdi_device="nvidia.com/gpu=0",gpu="0"} 2`,
				`nri_gpu_device_shares{GPU_I_ID="",UUID="",cdi_device="nvidia.com/gpu=0",gpu="0"} 4`,
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := metrics.New()
			m.WatchNode(func() metrics.Node { return tc.node })
			if diff := cmp.Diff(tc.want, scrape(t, m, "nri_gpu_device_")); diff != "" {
				t.Errorf("device series (-want +got):\n%s", diff)
			}
		})
	}
}

// TestWatchNodeMPS: an MPS-shared GPU tells whether its daemon answers,
// how many clients it has and the bounds of each.
func TestWatchNodeMPS(t *testing.T) {
	for _, ready := range []bool{true, false} {
		m := metrics.New()
		m.WatchNode(func() metrics.Node {
			return metrics.Node{Devices: []metrics.Device{
				{Name: "nvidia.com/gpu=0", UUID: "GPU-a", Index: "0", Shares: 2, SharesUsed: 1, MPS: &metrics.MPS{Ready: ready},
					Holders: []metrics.Holder{{Door: metrics.DoorCount, Namespace: "tenant", Pod: "agent", Shares: 1, MPSCompute: 50, MPSMemory: 1 << 30}}},
				{Name: "nvidia.com/gpu=1", UUID: "GPU-b", Index: "1", Shares: 1},
			}}
		})
		up := "0"
		if ready {
			up = "1"
		}
		want := []string{
			`nri_gpu_mps_client_compute_percent{GPU_I_ID="",UUID="GPU-a",cdi_device="nvidia.com/gpu=0",claim="",door="count",gpu="0",namespace="tenant",pod="agent"} 50`,
			`nri_gpu_mps_client_pinned_memory_bytes{GPU_I_ID="",UUID="GPU-a",cdi_device="nvidia.com/gpu=0",claim="",door="count",gpu="0",namespace="tenant",pod="agent"} 1.073741824e+09`,
			`nri_gpu_mps_clients{GPU_I_ID="",UUID="GPU-a",cdi_device="nvidia.com/gpu=0",gpu="0"} 1`,
			`nri_gpu_mps_daemon_ready{GPU_I_ID="",UUID="GPU-a",cdi_device="nvidia.com/gpu=0",gpu="0"} ` + up,
		}
		if diff := cmp.Diff(want, scrape(t, m, "nri_gpu_mps_")); diff != "" {
			t.Errorf("ready %v: MPS series (-want +got):\n%s", ready, diff)
		}
	}
}

// TestWatchNodeFollows: the series follow the holdings, scrape by scrape:
// a holding that ended has none; metrics off read nothing.
func TestWatchNodeFollows(t *testing.T) {
	node := metrics.Node{Devices: []metrics.Device{{Name: "nvidia.com/gpu=0", Index: "0", Shares: 1, SharesUsed: 1,
		Holders: []metrics.Holder{{Door: metrics.DoorCount, Namespace: "tenant", Pod: "agent", Shares: 1}}}}}
	m := metrics.New()
	m.WatchNode(func() metrics.Node { return node })
	if got := scrape(t, m, "nri_gpu_device_holder{"); len(got) != 1 {
		t.Fatalf("holder series while held: %v", got)
	}
	node.Devices[0].Holders, node.Devices[0].SharesUsed = nil, 0
	if got := scrape(t, m, "nri_gpu_device_holder"); len(got) != 0 {
		t.Errorf("holder series after the holding ended: %v", got)
	}

	// A plugin built again watches in its place.
	m.WatchNode(func() metrics.Node {
		return metrics.Node{Devices: []metrics.Device{{Name: "nvidia.com/gpu=1", Index: "1", Shares: 1}}}
	})
	want := []string{`nri_gpu_device_shares{GPU_I_ID="",UUID="",cdi_device="nvidia.com/gpu=1",gpu="1"} 1`}
	if got := scrape(t, m, "nri_gpu_device_shares{"); !slices.Equal(got, want) {
		t.Errorf("after watching another node: %v, want %v", got, want)
	}

	var off *metrics.Metrics
	off.WatchNode(func() metrics.Node { t.Error("metrics off read the node"); return metrics.Node{} })
}
