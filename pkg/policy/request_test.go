package policy_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
)

func TestParse(t *testing.T) {
	pod := func(key, item, device string) policy.Request {
		return policy.Request{Device: device, Item: item, Key: key, Origin: policy.OriginPod}
	}
	cdiReq := func(key, device string) policy.Request {
		return policy.Request{Device: device, Item: device, Key: key, Origin: policy.OriginCDI}
	}
	both := []string{"gpus.nri-gpu.io", "nvidia.cdi.k8s.io"}
	tests := []struct {
		name     string
		honorCDI bool
		// keys are the annotation keys read; none: nri-gpu's.
		keys []string
		// nameless: the runtime names the container none (else "main").
		nameless bool
		podAnn   map[string]string
		ctrAnn   map[string]string
		cdiDevs  []string
		want     []policy.Request
		count    int
		wantErr  []string
	}{
		{name: "no annotations", want: nil},
		{name: "other annotations only", podAnn: map[string]string{"gpus.example.com": "0"}, want: nil},
		{
			name:   "short index",
			podAnn: map[string]string{"gpus.nri-gpu.io": "1"},
			want:   []policy.Request{pod("gpus.nri-gpu.io", "1", "nvidia.com/gpu=1")},
		},
		{
			name:   "short UUID, MIG and all",
			podAnn: map[string]string{"gpus.nri-gpu.io": "GPU-4f0c5d4e-1a2b,0:1,all"},
			want: []policy.Request{
				pod("gpus.nri-gpu.io", "GPU-4f0c5d4e-1a2b", "nvidia.com/gpu=GPU-4f0c5d4e-1a2b"),
				pod("gpus.nri-gpu.io", "0:1", "nvidia.com/gpu=0:1"),
				pod("gpus.nri-gpu.io", "all", "nvidia.com/gpu=all"),
			},
		},
		{
			name:   "qualified names kept, spaces trimmed, duplicates merged",
			podAnn: map[string]string{"gpus.nri-gpu.io": " nvidia.com/gpu=0 , 0,example.com/nic=eth1 "},
			want: []policy.Request{
				pod("gpus.nri-gpu.io", "nvidia.com/gpu=0", "nvidia.com/gpu=0"),
				pod("gpus.nri-gpu.io", "example.com/nic=eth1", "example.com/nic=eth1"),
			},
		},
		{
			name: "container scope beats pod scope beats plain",
			podAnn: map[string]string{
				"gpus.nri-gpu.io/container.main": "2", "gpus.nri-gpu.io/pod": "1", "gpus.nri-gpu.io": "0",
			},
			want: []policy.Request{pod("gpus.nri-gpu.io/container.main", "2", "nvidia.com/gpu=2")},
		},
		{
			name:   "pod scope beats plain",
			podAnn: map[string]string{"gpus.nri-gpu.io/container.other": "2", "gpus.nri-gpu.io/pod": "1", "gpus.nri-gpu.io": "0"},
			want:   []policy.Request{pod("gpus.nri-gpu.io/pod", "1", "nvidia.com/gpu=1")},
		},
		{
			name:     "a container without a name, its pod asking per container: refused",
			nameless: true,
			podAnn:   map[string]string{"gpus.nri-gpu.io/container.main": "2", "gpus.nri-gpu.io/pod": "1"},
			wantErr:  []string{`pod annotation "gpus.nri-gpu.io/container.main" asks per container`, "named this container none", "io.kubernetes.container.name"},
		},
		{
			name:     "a container without a name, NVIDIA's key per container: refused",
			nameless: true,
			keys:     both,
			podAnn:   map[string]string{"nvidia.cdi.k8s.io/container.main": "nvidia.com/gpu=2"},
			wantErr:  []string{`pod annotation "nvidia.cdi.k8s.io/container.main" asks per container`},
		},
		{
			name:     "a container without a name, its pod asking for every container",
			nameless: true,
			podAnn:   map[string]string{"gpus.nri-gpu.io/pod": "1", "other.example.com/container.main": "x"},
			want:     []policy.Request{pod("gpus.nri-gpu.io/pod", "1", "nvidia.com/gpu=1")},
		},
		{
			name:   "another container's annotation does not apply",
			podAnn: map[string]string{"gpus.nri-gpu.io/container.other": "2"},
			want:   nil,
		},
		{
			name:     "cdi.k8s.io annotations, in key order, merged with the pod's",
			honorCDI: true,
			podAnn:   map[string]string{"gpus.nri-gpu.io": "0"},
			ctrAnn: map[string]string{
				"cdi.k8s.io/b": "nvidia.com/gpu=1", "cdi.k8s.io/a": "nvidia.com/gpu=0,nvidia.com/gpu=3", "other": "x",
			},
			want: []policy.Request{
				pod("gpus.nri-gpu.io", "0", "nvidia.com/gpu=0"),
				cdiReq("cdi.k8s.io/a", "nvidia.com/gpu=3"),
				cdiReq("cdi.k8s.io/b", "nvidia.com/gpu=1"),
			},
		},
		{
			name:   "the device plugin's devices.nri-gpu.io annotation, read even where cdi.k8s.io is not honoured",
			podAnn: map[string]string{"devices.nri-gpu.io/nvidia.com_gpu": "nvidia.com/gpu=2"},
			ctrAnn: map[string]string{
				"devices.nri-gpu.io/nvidia.com_gpu": "nvidia.com/gpu=0,nvidia.com/gpu=1", "cdi.k8s.io/a": "nvidia.com/gpu=3",
			},
			want: []policy.Request{
				cdiReq("devices.nri-gpu.io/nvidia.com_gpu", "nvidia.com/gpu=0"),
				cdiReq("devices.nri-gpu.io/nvidia.com_gpu", "nvidia.com/gpu=1"),
			},
		},
		{
			name:    "a malformed devices.nri-gpu.io annotation",
			ctrAnn:  map[string]string{"devices.nri-gpu.io/nvidia.com_gpu": "nvidia.com/gpu=0,gpu1"},
			wantErr: []string{`container annotation "devices.nri-gpu.io/nvidia.com_gpu"`, "gpu1"},
		},
		{
			name:   "cdi.k8s.io annotations ignored unless honoured, but the device plugin's",
			ctrAnn: map[string]string{"cdi.k8s.io/a": "nvidia.com/gpu=0", "cdi.k8s.io/nri-gpu_nvidia.com_gpu": "nvidia.com/gpu=1"},
			want:   []policy.Request{cdiReq("cdi.k8s.io/nri-gpu_nvidia.com_gpu", "nvidia.com/gpu=1")},
		},
		{
			name:     "the runtime's CDI devices after the annotations, a device asked for twice once",
			honorCDI: true,
			podAnn:   map[string]string{"gpus.nri-gpu.io": "0"},
			cdiDevs:  []string{"nvidia.com/gpu=1", "nvidia.com/gpu=0"},
			want: []policy.Request{
				pod("gpus.nri-gpu.io", "0", "nvidia.com/gpu=0"),
				{Device: "nvidia.com/gpu=1", Item: "nvidia.com/gpu=1", Origin: policy.OriginRuntime},
			},
		},
		{
			name:    "a malformed CDI device of the runtime",
			cdiDevs: []string{"gpu0"},
			wantErr: []string{`CDI device "gpu0" of the container's CRI request`},
		},
		{
			name:   "count",
			podAnn: map[string]string{"gpu-count.nri-gpu.io": " 2 "},
			count:  2,
		},
		{
			name:     "count with cdi.k8s.io requests",
			honorCDI: true,
			podAnn:   map[string]string{"gpu-count.nri-gpu.io": "1"},
			ctrAnn:   map[string]string{"cdi.k8s.io/a": "example.com/nic=0"},
			count:    1,
			want:     []policy.Request{cdiReq("cdi.k8s.io/a", "example.com/nic=0")},
		},
		{
			name:    "count and named devices on one pod",
			podAnn:  map[string]string{"gpu-count.nri-gpu.io": "1", "gpus.nri-gpu.io/container.other": "0"},
			wantErr: []string{`pod annotations "gpu-count.nri-gpu.io" and "gpus.nri-gpu.io/container.other"`, "not both"},
		},
		{
			name:    "count not a number",
			podAnn:  map[string]string{"gpu-count.nri-gpu.io": "two"},
			wantErr: []string{`pod annotation "gpu-count.nri-gpu.io"`, `"two" is not a whole number from 1 to 1024`},
		},
		{
			name:    "count zero",
			podAnn:  map[string]string{"gpu-count.nri-gpu.io": "0"},
			wantErr: []string{`"0" is not a whole number`},
		},
		{
			name:    "count too large",
			podAnn:  map[string]string{"gpu-count.nri-gpu.io": "100000"},
			wantErr: []string{`"100000" is not a whole number`},
		},
		{
			name:    "empty item",
			podAnn:  map[string]string{"gpus.nri-gpu.io": "0,,1"},
			wantErr: []string{`pod annotation "gpus.nri-gpu.io", item 2 ""`, "empty device name"},
		},
		{
			name:    "empty value",
			podAnn:  map[string]string{"gpus.nri-gpu.io/pod": ""},
			wantErr: []string{`pod annotation "gpus.nri-gpu.io/pod", item 1`, "empty device name"},
		},
		{
			name:    "malformed qualified name",
			podAnn:  map[string]string{"gpus.nri-gpu.io": "nvidia.com/=0"},
			wantErr: []string{`item 1 "nvidia.com/=0"`, "missing"},
		},
		{
			name:    "bad short name",
			podAnn:  map[string]string{"gpus.nri-gpu.io": "0;rm -rf"},
			wantErr: []string{`item 1 "0;rm -rf"`, "invalid character"},
		},
		{
			name:    "path traversal",
			podAnn:  map[string]string{"gpus.nri-gpu.io": "../../dev/sda"},
			wantErr: []string{`item 1 "../../dev/sda"`},
		},
		{
			name:    "overlong item is cut in the message",
			podAnn:  map[string]string{"gpus.nri-gpu.io": strings.Repeat("a", 20000)},
			wantErr: []string{"20000 bytes long", strings.Repeat("a", 64) + "..."},
		},
		{
			name:    "too many items",
			podAnn:  map[string]string{"gpus.nri-gpu.io": strings.Repeat("0,", 300) + "0"},
			wantErr: []string{`pod annotation "gpus.nri-gpu.io"`, "301 items, more than 256"},
		},
		{
			name:     "too many cdi.k8s.io items",
			honorCDI: true,
			ctrAnn:   map[string]string{"cdi.k8s.io/x": strings.Repeat("nvidia.com/gpu=0,", 299) + "nvidia.com/gpu=0"},
			wantErr:  []string{`container annotation "cdi.k8s.io/x"`, "300 items"},
		},
		{
			name:     "too many items across cdi.k8s.io keys",
			honorCDI: true,
			ctrAnn: map[string]string{
				"cdi.k8s.io/a": strings.Repeat("nvidia.com/gpu=0,", 199) + "nvidia.com/gpu=0",
				"cdi.k8s.io/b": strings.Repeat("nvidia.com/gpu=1,", 199) + "nvidia.com/gpu=1",
			},
			wantErr: []string{"container annotations cdi.k8s.io/* and devices.nri-gpu.io/*", "more than 256 items together"},
		},
		{
			name:    "too many devices across annotations and the CRI request",
			podAnn:  map[string]string{"gpus.nri-gpu.io": strings.Repeat("0,", 199) + "0"},
			cdiDevs: slices.Repeat([]string{"nvidia.com/gpu=1"}, 100),
			wantErr: []string{"the container's annotations and CRI request", "300 devices asked for, more than 256"},
		},
		{
			name:    "invalid UTF-8",
			podAnn:  map[string]string{"gpus.nri-gpu.io": "0,\xff\xfe"},
			wantErr: []string{`item 2 "\xff\xfe"`},
		},
		{
			name:    "shell metacharacters",
			podAnn:  map[string]string{"gpus.nri-gpu.io": "$(reboot)"},
			wantErr: []string{`item 1 "$(reboot)"`},
		},
		{
			name:   "NVIDIA's key not read unless configured",
			podAnn: map[string]string{"nvidia.cdi.k8s.io": "nvidia.com/gpu=0"},
			want:   nil,
		},
		{
			name:   "NVIDIA's key, plain",
			keys:   both,
			podAnn: map[string]string{"nvidia.cdi.k8s.io": "nvidia.com/gpu=0,nvidia.com/gpu=1"},
			want:   []policy.Request{pod("nvidia.cdi.k8s.io", "nvidia.com/gpu=0", "nvidia.com/gpu=0"), pod("nvidia.cdi.k8s.io", "nvidia.com/gpu=1", "nvidia.com/gpu=1")},
		},
		{
			name: "NVIDIA's key: container scope beats pod scope beats plain",
			keys: both,
			podAnn: map[string]string{
				"nvidia.cdi.k8s.io/container.main": "nvidia.com/gpu=2", "nvidia.cdi.k8s.io/pod": "nvidia.com/gpu=1", "nvidia.cdi.k8s.io": "nvidia.com/gpu=0",
			},
			want: []policy.Request{pod("nvidia.cdi.k8s.io/container.main", "nvidia.com/gpu=2", "nvidia.com/gpu=2")},
		},
		{
			name:   "NVIDIA's key: pod scope beats plain",
			keys:   []string{"nvidia.cdi.k8s.io"},
			podAnn: map[string]string{"nvidia.cdi.k8s.io/pod": "nvidia.com/gpu=1", "nvidia.cdi.k8s.io": "nvidia.com/gpu=0", "nvidia.cdi.k8s.io/container.other": "nvidia.com/gpu=3"},
			want:   []policy.Request{pod("nvidia.cdi.k8s.io/pod", "nvidia.com/gpu=1", "nvidia.com/gpu=1")},
		},
		{
			name:   "nri-gpu's and NVIDIA's keys: the union, once",
			keys:   both,
			podAnn: map[string]string{"gpus.nri-gpu.io": "0,1", "nvidia.cdi.k8s.io": "nvidia.com/gpu=1,nvidia.com/gpu=2"},
			want: []policy.Request{
				pod("gpus.nri-gpu.io", "0", "nvidia.com/gpu=0"), pod("gpus.nri-gpu.io", "1", "nvidia.com/gpu=1"),
				pod("nvidia.cdi.k8s.io", "nvidia.com/gpu=2", "nvidia.com/gpu=2"),
			},
		},
		{
			name:   "only NVIDIA's key read: nri-gpu's ignored",
			keys:   []string{"nvidia.cdi.k8s.io"},
			podAnn: map[string]string{"gpus.nri-gpu.io": "0", "nvidia.cdi.k8s.io": "nvidia.com/gpu=1"},
			want:   []policy.Request{pod("nvidia.cdi.k8s.io", "nvidia.com/gpu=1", "nvidia.com/gpu=1")},
		},
		{
			name:    "NVIDIA's key takes qualified names only",
			keys:    both,
			podAnn:  map[string]string{"nvidia.cdi.k8s.io": "nvidia.com/gpu=0,1"},
			wantErr: []string{`pod annotation "nvidia.cdi.k8s.io", item 2 "1"`, "qualified CDI names"},
		},
		{
			name:    "a count beside NVIDIA's key",
			keys:    both,
			podAnn:  map[string]string{"gpu-count.nri-gpu.io": "1", "nvidia.cdi.k8s.io/pod": "nvidia.com/gpu=0"},
			wantErr: []string{`"gpu-count.nri-gpu.io" and "nvidia.cdi.k8s.io/pod"`, "not both"},
		},
		{
			name:     "bad cdi.k8s.io value",
			honorCDI: true,
			ctrAnn:   map[string]string{"cdi.k8s.io/dp": "nvidia.com/gpu=0, nvidia.com/gpu=1"},
			wantErr:  []string{`container annotation "cdi.k8s.io/dp"`, `" nvidia.com/gpu=1"`},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := policy.NewParser("nvidia.com/gpu", tc.honorCDI, tc.keys...)
			if err != nil {
				t.Fatal(err)
			}
			name := "main"
			if tc.nameless {
				name = ""
			}
			got, err := p.Parse(policy.Container{
				Namespace: "ns", Pod: "pod", Name: name, PodAnnotations: tc.podAnn, Annotations: tc.ctrAnn, CDIDevices: tc.cdiDevs,
			})
			if len(tc.wantErr) > 0 {
				testutil.ErrorSays(t, err, tc.wantErr...)
				if !errors.Is(err, policy.ErrInvalidRequest) {
					t.Errorf("error %v does not wrap ErrInvalidRequest", err)
				}
				if len(err.Error()) > 1000 {
					t.Errorf("error is %d bytes long", len(err.Error()))
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got.Requests); diff != "" {
				t.Errorf("requests (-want +got):\n%s", diff)
			}
			if got.Count != tc.count {
				t.Errorf("count %d, want %d", got.Count, tc.count)
			}
		})
	}
}

func TestNewParserRejectsBadKind(t *testing.T) {
	for _, kind := range []string{"", "gpu", "nvidia.com/", "/gpu", "nvidia.com/g=pu"} {
		if _, err := policy.NewParser(kind, true); err == nil {
			t.Errorf("kind %q accepted", kind)
		}
	}
}

// TestFromKubelet: what kubelet allocated (the CRI request's CDI devices,
// the annotations of nri-gpu's device plugin) is told from what a pod
// asks for itself.
func TestFromKubelet(t *testing.T) {
	for _, tc := range []struct {
		req  policy.Request
		want bool
	}{
		{policy.Request{Device: "nvidia.com/gpu=0", Origin: policy.OriginRuntime}, true},
		{policy.Request{Device: "nvidia.com/gpu=0", Key: policy.DevicePluginAnnotation("nvidia.com/gpu"), Origin: policy.OriginCDI}, true},
		{policy.Request{Device: "nvidia.com/gpu=0", Key: "cdi.k8s.io/nri-gpu_nvidia.com_gpu", Origin: policy.OriginCDI}, true},
		{policy.Request{Device: "nvidia.com/gpu=0", Key: "cdi.k8s.io/other_nvidia.com_gpu", Origin: policy.OriginCDI}, false},
		{policy.Request{Device: "nvidia.com/gpu=0", Key: "gpus.nri-gpu.io", Origin: policy.OriginPod}, false},
		{policy.Request{Device: "nvidia.com/gpu=0", Key: "devices.nri-gpu.io/nvidia.com_gpu", Origin: policy.OriginPod}, false},
	} {
		if got := tc.req.FromKubelet(); got != tc.want {
			t.Errorf("%+v: FromKubelet %v, want %v", tc.req, got, tc.want)
		}
	}
	if got := policy.DevicePluginAnnotation("nvidia.com/gpu"); got != "devices.nri-gpu.io/nvidia.com_gpu" {
		t.Errorf("DevicePluginAnnotation(nvidia.com/gpu) = %q", got)
	}
}
