package dra_test

import (
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	"sigs.k8s.io/yaml"

	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
)

// NVIDIA's published parameters: demo/specs/quickstart/v1/gpu-test5.yaml
// of kubernetes-sigs/dra-driver-nvidia-gpu at commit
// 95932046683719c43b6a0dd9613c2e5aad5d6703 (its "ts-gpu" and "mps-gpu"
// configurations; gpu-test6.yaml and gpu-test-mps.yaml repeat them).
const (
	publishedTimeSlicing = `
apiVersion: resource.nvidia.com/v1beta1
kind: GpuConfig
sharing:
  strategy: TimeSlicing
  timeSlicingConfig:
    interval: Long
`
	publishedMPS = `
apiVersion: resource.nvidia.com/v1beta1
kind: GpuConfig
sharing:
  strategy: MPS
  mpsConfig:
    defaultActiveThreadPercentage: 50
    defaultPinnedDeviceMemoryLimit: 10Gi
`
)

// opaque is a configuration of the driver's, of requests (none: all),
// from source, with YAML parameters.
func opaque(t *testing.T, source resourceapi.AllocationConfigSource, params string, requests ...string) resourceapi.DeviceAllocationConfiguration {
	t.Helper()
	raw, err := yaml.YAMLToJSON([]byte(params))
	if err != nil {
		t.Fatal(err)
	}
	return resourceapi.DeviceAllocationConfiguration{Source: source, Requests: requests, DeviceConfiguration: resourceapi.DeviceConfiguration{
		Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: driver, Parameters: runtime.RawExtension{Raw: raw}},
	}}
}

// TestGpuConfig: NVIDIA's GpuConfig parameters, as its published
// manifests write them, are what a claim asks of its devices' sharing
// (the claim's configuration over its class's, a per-device limit over
// the default); another driver's are not read; another kind or version,
// an unknown field, a value out of range refuse the claim, naming the
// requests and the reason.
func TestGpuConfig(t *testing.T) {
	const gi = int64(1) << 30
	tests := []struct {
		name    string
		configs func(t *testing.T) []resourceapi.DeviceAllocationConfiguration
		want    policy.GpuConfig // of request "gpus" on gpu-0
		wantErr string
	}{
		{name: "none", configs: func(*testing.T) []resourceapi.DeviceAllocationConfiguration { return nil }},
		{name: "published time-slicing", configs: func(t *testing.T) []resourceapi.DeviceAllocationConfiguration {
			return []resourceapi.DeviceAllocationConfiguration{opaque(t, resourceapi.AllocationConfigSourceClaim, publishedTimeSlicing, "gpus")}
		}, want: policy.GpuConfig{Strategy: config.StrategyTimeSlicing}},
		{name: "published MPS", configs: func(t *testing.T) []resourceapi.DeviceAllocationConfiguration {
			return []resourceapi.DeviceAllocationConfiguration{opaque(t, resourceapi.AllocationConfigSourceClaim, publishedMPS, "gpus")}
		}, want: policy.GpuConfig{Strategy: config.StrategyMPS, ActiveThreadPercentage: 50, PinnedMemory: 10 * gi}},
		{name: "the claim's over the class's, whatever their order", configs: func(t *testing.T) []resourceapi.DeviceAllocationConfiguration {
			return []resourceapi.DeviceAllocationConfiguration{
				opaque(t, resourceapi.AllocationConfigSourceClaim, publishedMPS),
				opaque(t, resourceapi.AllocationConfigSourceClass, publishedTimeSlicing),
			}
		}, want: policy.GpuConfig{Strategy: config.StrategyMPS, ActiveThreadPercentage: 50, PinnedMemory: 10 * gi}},
		{name: "another request's, and another driver's, not read", configs: func(t *testing.T) []resourceapi.DeviceAllocationConfiguration {
			other := opaque(t, resourceapi.AllocationConfigSourceClaim, "{kind: Anything}", "gpus")
			other.Opaque.Driver = "gpu.example.com"
			return []resourceapi.DeviceAllocationConfiguration{opaque(t, resourceapi.AllocationConfigSourceClaim, publishedMPS, "other"), other}
		}},
		{name: "a per-device limit by index", configs: func(t *testing.T) []resourceapi.DeviceAllocationConfiguration {
			return []resourceapi.DeviceAllocationConfiguration{opaque(t, resourceapi.AllocationConfigSourceClaim, publishedMPS+"    defaultPerDevicePinnedMemoryLimit: {\"0\": 2Gi, \"1\": 3Gi}\n")}
		}, want: policy.GpuConfig{Strategy: config.StrategyMPS, ActiveThreadPercentage: 50, PinnedMemory: 2 * gi}},
		{name: "another kind", configs: func(t *testing.T) []resourceapi.DeviceAllocationConfiguration {
			return []resourceapi.DeviceAllocationConfiguration{opaque(t, resourceapi.AllocationConfigSourceClaim, "{apiVersion: resource.nvidia.com/v1beta1, kind: MigDeviceConfig}", "gpus")}
		}, wantErr: "config of requests [gpus]: opaque device configuration not honoured: MigDeviceConfig of resource.nvidia.com/v1beta1; nri-gpu honours GpuConfig of resource.nvidia.com/v1beta1"},
		{name: "another version", configs: func(t *testing.T) []resourceapi.DeviceAllocationConfiguration {
			return []resourceapi.DeviceAllocationConfiguration{opaque(t, resourceapi.AllocationConfigSourceClaim, strings.Replace(publishedMPS, "v1beta1", "v1", 1))}
		}, wantErr: "GpuConfig of resource.nvidia.com/v1; nri-gpu honours GpuConfig of resource.nvidia.com/v1beta1"},
		{name: "an unknown field", configs: func(t *testing.T) []resourceapi.DeviceAllocationConfiguration {
			return []resourceapi.DeviceAllocationConfiguration{opaque(t, resourceapi.AllocationConfigSourceClaim, publishedMPS+"    privileged: true\n")}
		}, wantErr: `config of every request: opaque device configuration not honoured: json: unknown field "privileged"`},
		{name: "a percentage out of range", configs: func(t *testing.T) []resourceapi.DeviceAllocationConfiguration {
			return []resourceapi.DeviceAllocationConfiguration{opaque(t, resourceapi.AllocationConfigSourceClaim, strings.Replace(publishedMPS, ": 50", ": 101", 1))}
		}, wantErr: "mpsConfig.defaultActiveThreadPercentage 101 is not between 1 and 100"},
		{name: "a limit under 1Mi", configs: func(t *testing.T) []resourceapi.DeviceAllocationConfiguration {
			return []resourceapi.DeviceAllocationConfiguration{opaque(t, resourceapi.AllocationConfigSourceClaim, strings.Replace(publishedMPS, "10Gi", "1Ki", 1))}
		}, wantErr: "mpsConfig.defaultPinnedDeviceMemoryLimit 1Ki is less than 1Mi"},
		{name: "multi-user MPS", configs: func(t *testing.T) []resourceapi.DeviceAllocationConfiguration {
			return []resourceapi.DeviceAllocationConfiguration{opaque(t, resourceapi.AllocationConfigSourceClaim, publishedMPS+"    multiUser: true\n")}
		}, wantErr: "mpsConfig.multiUser"},
		{name: "a strategy of neither", configs: func(t *testing.T) []resourceapi.DeviceAllocationConfiguration {
			return []resourceapi.DeviceAllocationConfiguration{opaque(t, resourceapi.AllocationConfigSourceClaim, strings.Replace(publishedMPS, "strategy: MPS", "strategy: Exclusive", 1))}
		}, wantErr: `sharing.strategy "Exclusive" is neither TimeSlicing nor MPS`},
		{name: "MPS settings with time-slicing", configs: func(t *testing.T) []resourceapi.DeviceAllocationConfiguration {
			return []resourceapi.DeviceAllocationConfiguration{opaque(t, resourceapi.AllocationConfigSourceClaim, strings.Replace(publishedMPS, "strategy: MPS", "strategy: TimeSlicing", 1))}
		}, wantErr: "mpsConfig with strategy TimeSlicing"},
		{name: "an interval of none", configs: func(t *testing.T) []resourceapi.DeviceAllocationConfiguration {
			return []resourceapi.DeviceAllocationConfiguration{opaque(t, resourceapi.AllocationConfigSourceClaim, strings.Replace(publishedTimeSlicing, "Long", "Forever", 1))}
		}, wantErr: `timeSlicingConfig.interval "Forever" is none of Default, Short, Medium, Long`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := allocated("cfg", "uid-cfg", result("gpus", driver, node, "gpu-0"))
			c.Status.Allocation.Devices.Config = tc.configs(t)
			src := newSource("gpu-0")
			s := start(t, src, c)
			resp, err := s.dra.NodePrepareResources(context.Background(), &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{{Namespace: "ns", Name: "cfg", Uid: "uid-cfg"}}})
			if err != nil {
				t.Fatal(err)
			}
			got := resp.Claims["uid-cfg"]
			if tc.wantErr != "" {
				if !strings.Contains(got.Error, "claim ns/cfg") || !strings.Contains(got.Error, tc.wantErr) {
					t.Errorf("error %q, want one naming the claim and saying %q", got.Error, tc.wantErr)
				}
				if len(src.prepared["uid-cfg"]) > 0 {
					t.Errorf("a claim whose configuration is not honoured was held: %v", src.prepared["uid-cfg"])
				}
				return
			}
			if got.Error != "" {
				t.Fatal(got.Error)
			}
			want := []link.Allocated{{CDI: "nvidia.com/gpu=0", Requests: []string{"gpus"}, GpuConfig: tc.want}}
			if diff := cmp.Diff(want, src.prepared["uid-cfg"]); diff != "" {
				t.Errorf("held (-want +got):\n%s", diff)
			}
			// NVIDIA's gpu-test5 asks for interval Long: accepted, and the
			// driver says it is not applied.
			if said := s.warned(`timeSlicingConfig.interval "Long" is not applied`); said != (tc.name == "published time-slicing") {
				t.Errorf("warned that the interval is not applied: %v", said)
			}
		})
	}
}
