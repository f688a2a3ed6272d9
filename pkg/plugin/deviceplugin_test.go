package plugin_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/deviceplugin"
)

// resourceSpec has GPU 0 by index and by UUID, GPU 1, and GPU 2 whose
// host node is a file the test removes; %s is that file.
const resourceSpec = `
cdiVersion: "0.6.0"
kind: nvidia.com/gpu
devices:
  - name: "0"
    containerEdits:
      deviceNodes: [{path: /dev/nvidia0, hostPath: /dev/null}]
  - name: GPU-0
    containerEdits:
      deviceNodes: [{path: /dev/nvidia0, hostPath: /dev/null}]
  - name: "1"
    containerEdits:
      deviceNodes: [{path: /dev/nvidia1, hostPath: /dev/zero}]
  - name: "2"
    containerEdits:
      deviceNodes: [{path: /dev/nvidia2, hostPath: %s, type: c, major: 195, minor: 2}]
  - name: all
    containerEdits:
      deviceNodes: [{path: /dev/nvidia0, hostPath: /dev/null}, {path: /dev/nvidia1, hostPath: /dev/zero}]
`

// TestResourceDevices: what a device plugin tells kubelet, as pods come
// and go and the host changes.
func TestResourceDevices(t *testing.T) {
	dir := t.TempDir()
	node := filepath.Join(dir, "nvidia2")
	if err := os.WriteFile(node, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	specFile := filepath.Join(dir, "cdi", "gpu.yaml")
	if err := os.MkdirAll(filepath.Dir(specFile), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(specFile, []byte(fmt.Sprintf(resourceSpec, node)), 0o644); err != nil {
		t.Fatal(err)
	}
	p := inProcess(t, "policy: {exclusive: true}", filepath.Dir(specFile))
	res := p.Resource(config.Resource{Name: "nvidia.com/gpu", Kind: "nvidia.com/gpu", Devices: []string{"*"}})
	want := func(what, list string) {
		t.Helper()
		if got := deviceplugin.Describe(res.Devices()); got != list {
			t.Errorf("%s: devices %q, want %q", what, got, list)
		}
	}
	create := func(podName string, podAnn, ctrAnn map[string]string) {
		t.Helper()
		pod := &api.PodSandbox{Id: "id-" + podName, Name: podName, Namespace: "tenant", Annotations: podAnn}
		ctr := &api.Container{Id: podName + "-c", PodSandboxId: pod.Id, Name: "c", Annotations: ctrAnn, Linux: &api.LinuxContainer{}}
		if _, _, err := p.CreateContainer(context.Background(), pod, ctr); err != nil {
			t.Fatal(err)
		}
	}

	want("at start", "0 healthy, 1 healthy, 2 healthy")
	if got := res.Preferred([]string{"2", "1", "0"}, []string{"2"}, 2); !slices.Equal(got, []string{"2", "0"}) {
		t.Errorf("preferred %v, want [2 0]: the one that must be, then in order", got)
	}

	create("ann", map[string]string{"gpus.nri-gpu.io": "GPU-0"}, nil)
	want("GPU 0 held by an annotation pod, by its UUID", "0 unhealthy, 1 healthy, 2 healthy")
	create("kube", nil, map[string]string{"cdi.k8s.io/nri-gpu_nvidia.com_gpu": "nvidia.com/gpu=1"})
	want("GPU 1 allocated by kubelet", "0 unhealthy, 1 healthy, 2 healthy")
	create("kube-nri", nil, map[string]string{"devices.nri-gpu.io/nvidia.com_gpu": "nvidia.com/gpu=2"})
	want("GPU 2 allocated by kubelet, with cdiDevices: nri-gpu", "0 unhealthy, 1 healthy, 2 healthy")
	if err := p.StopPodSandbox(context.Background(), &api.PodSandbox{Id: "id-kube-nri"}); err != nil {
		t.Fatal(err)
	}
	if err := p.StopPodSandbox(context.Background(), &api.PodSandbox{Id: "id-ann"}); err != nil {
		t.Fatal(err)
	}
	want("the annotation pod stopped", "0 healthy, 1 healthy, 2 healthy")

	if err := os.Remove(node); err != nil {
		t.Fatal(err)
	}
	// A node found there is looked for again within a second.
	testutil.Within(t, 5*time.Second, "GPU 2 unhealthy, its node gone", func() bool {
		return deviceplugin.Describe(res.Devices()) == "0 healthy, 1 healthy, 2 unhealthy"
	})

	// GPU 1 leaves the spec: it stays listed, unhealthy.
	text := strings.Replace(fmt.Sprintf(resourceSpec, node), `  - name: "1"
    containerEdits:
      deviceNodes: [{path: /dev/nvidia1, hostPath: /dev/zero}]
`, "", 1)
	if err := os.WriteFile(specFile, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	testutil.Within(t, 5*time.Second, "GPU 1 reported gone", func() bool {
		return deviceplugin.Describe(res.Devices()) == "0 healthy, 1 unhealthy, 2 unhealthy"
	})

	// A resource of some devices only, and policy.devices, narrow it.
	narrow := inProcess(t, "policy: {devices: ['nvidia.com/gpu=[01]', 'nvidia.com/gpu=GPU-*']}", filepath.Dir(specFile))
	only := narrow.Resource(config.Resource{Name: "example.com/gpu-one", Kind: "nvidia.com/gpu", Devices: []string{"GPU-*", "2"}})
	if got := deviceplugin.Describe(only.Devices()); got != "GPU-0 healthy" {
		t.Errorf("a resource of GPU-* and 2 under a policy of 0, 1 and GPU-*: %q, want GPU-0 only", got)
	}
}

// TestSharedResource: a device policy.sharing shares N ways is offered as
// N replicas, which kubelet hands out as it does devices; replicas used
// through other doors (an annotation pod, a count) are withheld, the last
// ones first; a preferred allocation spreads a pod's replicas over
// devices, the least used first, and gives one device twice only to make
// up the size. Devices sharing does not cover are offered as before.
func TestSharedResource(t *testing.T) {
	specDir := gpuSpecDir(t, 3)
	p := inProcess(t, `policy:
  exclusive: true
  sharing: [{devices: ["nvidia.com/gpu=0", "nvidia.com/gpu=1"], replicas: 3}]
`, specDir)
	res := p.Resource(config.Resource{Name: "nvidia.com/gpu.shared", Kind: "nvidia.com/gpu", Devices: []string{"*"}})
	want := func(what, list string) {
		t.Helper()
		if got := deviceplugin.Describe(res.Devices()); got != list {
			t.Errorf("%s: devices %q, want %q", what, got, list)
		}
	}
	create := func(podName string, podAnn map[string]string) {
		t.Helper()
		pod := gpuPod(podName, podAnn)
		if _, _, err := p.CreateContainer(context.Background(), pod, ctrOf(pod, nil)); err != nil {
			t.Fatal(err)
		}
	}
	want("at start", "0::0 healthy, 0::1 healthy, 0::2 healthy, 1::0 healthy, 1::1 healthy, 1::2 healthy, 2 healthy")
	create("ann", map[string]string{"gpus.nri-gpu.io": "0"})
	create("count", map[string]string{"gpu-count.nri-gpu.io": "1"})
	// The count takes the least used shared GPU: 1 (0 has a user).
	want("GPU 0 and GPU 1 used once each through annotations", "0::0 healthy, 0::1 healthy, 0::2 unhealthy, 1::0 healthy, 1::1 healthy, 1::2 unhealthy, 2 healthy")
	create("ann2", map[string]string{"gpus.nri-gpu.io": "0"})
	want("GPU 0 used twice", "0::0 healthy, 0::1 unhealthy, 0::2 unhealthy, 1::0 healthy, 1::1 healthy, 1::2 unhealthy, 2 healthy")
	// kubelet's own allocations are its own count: a pod kubelet gave
	// replica 0::0 changes nothing here.
	kube := gpuPod("kube", nil)
	if _, _, err := p.CreateContainer(context.Background(), kube, ctrOf(kube, map[string]string{"cdi.k8s.io/nri-gpu_nvidia.com_gpu.shared": "nvidia.com/gpu=0"})); err != nil {
		t.Fatal(err)
	}
	want("kubelet's pod on GPU 0", "0::0 healthy, 0::1 unhealthy, 0::2 unhealthy, 1::0 healthy, 1::1 healthy, 1::2 unhealthy, 2 healthy")
	// ... and GPU 0 now has its three users: a fourth is refused.
	extra := gpuPod("extra", map[string]string{"gpus.nri-gpu.io": "0"})
	_, _, err := p.CreateContainer(context.Background(), extra, ctrOf(extra, nil))
	testutil.ErrorSays(t, err, "used by 3 already: pod tenant/ann, pod tenant/ann2, pod tenant/kube")

	for _, tc := range []struct {
		name            string
		available, must []string
		size            int
		want            []string
	}{
		{"one replica per GPU, the least used first", []string{"0::0", "1::0", "1::1", "2"}, nil, 2, []string{"2", "1::0"}},
		{"a GPU the pod must have is not given again", []string{"0::0", "1::0", "1::1", "2"}, []string{"1::1"}, 2, []string{"1::1", "2"}},
		{"a second replica only to make up the size", []string{"1::0", "1::1"}, nil, 2, []string{"1::0", "1::1"}},
		{"another GPU before a second replica of the least used", []string{"0::0", "1::0", "1::1"}, nil, 2, []string{"1::0", "0::0"}},
		{"another GPU before a second replica of the one the pod must have", []string{"0::0", "1::0", "1::1"}, []string{"1::1"}, 2, []string{"1::1", "0::0"}},
	} {
		if got := res.Preferred(tc.available, tc.must, tc.size); !slices.Equal(got, tc.want) {
			t.Errorf("%s: preferred %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestDevicePluginAnnotationsWithoutCDIAnnotations: with
// honorCDIAnnotations off, the annotations of nri-gpu's own device plugin
// (kubelet's allocation, either key) are still injected; any other
// cdi.k8s.io annotation is not.
func TestDevicePluginAnnotationsWithoutCDIAnnotations(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "gpu.yaml"), []byte(fmt.Sprintf(resourceSpec, "/dev/null")), 0o644); err != nil {
		t.Fatal(err)
	}
	p := inProcess(t, "honorCDIAnnotations: false\npolicy: {exclusive: true}", dir)
	for i, tc := range []struct {
		ann  map[string]string
		want []string
	}{
		{map[string]string{"cdi.k8s.io/nri-gpu_nvidia.com_gpu": "nvidia.com/gpu=0"}, []string{"/dev/nvidia0"}},
		{map[string]string{"devices.nri-gpu.io/nvidia.com_gpu": "nvidia.com/gpu=1"}, []string{"/dev/nvidia1"}},
		{map[string]string{"cdi.k8s.io/other_nvidia.com_gpu": "nvidia.com/gpu=2"}, nil},
	} {
		pod := &api.PodSandbox{Id: fmt.Sprint("id-", i), Name: fmt.Sprint("p", i), Namespace: "tenant"}
		ctr := &api.Container{Id: fmt.Sprint("c", i), PodSandboxId: pod.Id, Name: "c", Annotations: tc.ann, Linux: &api.LinuxContainer{}}
		adj, _, err := p.CreateContainer(context.Background(), pod, ctr)
		if err != nil {
			t.Fatalf("%v: %v", tc.ann, err)
		}
		var got []string
		for _, d := range adj.GetLinux().GetDevices() {
			got = append(got, d.GetPath())
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%v: device nodes %v, want %v", tc.ann, got, tc.want)
		}
	}
}
