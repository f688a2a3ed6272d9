package plugin_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/deviceplugin"
	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
	"github.com/nri-gpu/nri-gpu/pkg/plugin"

	dpapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresources "k8s.io/kubelet/pkg/apis/podresources/v1"
)

type noDoor struct{}

func (noDoor) Notify() {}

// TestKubeletAllocations: kubelet allocates a device-plugin pod's GPUs
// when it admits the pod, before its container is created; a count
// request meanwhile takes another GPU (not the one that pod's container
// would then be refused), and a request by name for it is denied naming
// that pod. The pod itself gets it; a GPU kubelet allocated a pod through
// another resource, or a replica of a shared one, is not passed over;
// with kubelet not answering, the count request is served as before.
func TestKubeletAllocations(t *testing.T) {
	specDir := gpuSpecDir(t, 3)
	kubeletGot := func(ids ...string) []*podresources.PodResources {
		return []*podresources.PodResources{testutil.AllocatedPod("default", "k", "nvidia.com/gpu", ids...)}
	}
	count := func(n int) map[string]string { return map[string]string{"gpu-count.nri-gpu.io": fmt.Sprint(n)} }
	for _, tc := range []struct {
		name     string
		serve    bool
		pods     []*podresources.PodResources
		podAnn   map[string]string
		wantGPU  string
		wantErrs []string
	}{
		{name: "count", serve: true, pods: kubeletGot("0"), podAnn: count(1), wantGPU: "1"},
		{name: "count of two taken by kubelet", serve: true, pods: kubeletGot("0", "2"), podAnn: count(2), wantErrs: []string{"1 are free and 2 held by other pods"}},
		{name: "by name", serve: true, pods: kubeletGot("0"), podAnn: map[string]string{"gpus.nri-gpu.io": "0"},
			wantErrs: []string{`device "nvidia.com/gpu=0" is allocated by kubelet to pod default/k`}},
		{name: "its own", serve: true, pods: []*podresources.PodResources{testutil.AllocatedPod("tenant", "p", "nvidia.com/gpu", "0")},
			podAnn: map[string]string{"gpus.nri-gpu.io": "0"}, wantGPU: "0"},
		{name: "another resource", serve: true, pods: []*podresources.PodResources{testutil.AllocatedPod("default", "k", "example.com/other", "0")},
			podAnn: count(1), wantGPU: "0"},
		{name: "a replica", serve: true, pods: kubeletGot("0::1"), podAnn: count(1), wantGPU: "0"},
		{name: "kubelet not answering", podAnn: count(1), wantGPU: "0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			socket := filepath.Join(testutil.ShortDir(t), "pod-resources", "kubelet.sock")
			if tc.serve {
				testutil.ServePodResources(t, socket, tc.pods...)
			}
			cfg, err := config.Parse(fmt.Appendf(nil, "version: v1\npolicy: {exclusive: true}\nstart:\n  devicePlugin:\n    podResources: %s\n    resources: [{name: nvidia.com/gpu}]\n", socket))
			if err != nil {
				t.Fatal(err)
			}
			p, err := plugin.New(cfg, quiet(), plugin.WithSpecDirs([]string{specDir}),
				plugin.WithDevicePlugin(noDoor{}))
			if err != nil {
				t.Fatal(err)
			}
			synchronized(t, p)
			t.Cleanup(p.Close)
			pod := &api.PodSandbox{Id: "id-p", Name: "p", Namespace: "tenant", Annotations: tc.podAnn}
			ctr := &api.Container{Id: "c", PodSandboxId: pod.Id, Name: "main", Linux: &api.LinuxContainer{}}
			adj, _, err := p.CreateContainer(context.Background(), pod, ctr)
			if len(tc.wantErrs) > 0 {
				testutil.ErrorSays(t, err, tc.wantErrs...)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := adj.GetAnnotations()[plugin.DevicesAnnotation]; got != "nvidia.com/gpu="+tc.wantGPU {
				t.Errorf("given %q, want GPU %s", got, tc.wantGPU)
			}
		})
	}
}

// TestKubeletAllocationsForClaims: the DRA door meets kubelet's
// allocations too: a GPU kubelet allocated a device-plugin pod, whose
// container is not created yet, is not offered in the ResourceSlice and
// a claim allocated it is refused naming that pod; the others are
// offered and prepared.
func TestKubeletAllocationsForClaims(t *testing.T) {
	socket := filepath.Join(testutil.ShortDir(t), "pod-resources", "kubelet.sock")
	testutil.ServePodResources(t, socket, testutil.AllocatedPod("default", "k", "nvidia.com/gpu", "0"))
	cfg, err := config.Parse(fmt.Appendf(nil, "version: v1\npolicy: {namespaces: [tenant]}\nstart:\n  devicePlugin:\n    podResources: %s\n    resources: [{name: nvidia.com/gpu}]\n", socket))
	if err != nil {
		t.Fatal(err)
	}
	p, err := plugin.New(cfg, quiet(), plugin.WithSpecDirs([]string{gpuSpecDir(t, 2)}),
		plugin.WithDevicePlugin(noDoor{}))
	if err != nil {
		t.Fatal(err)
	}
	synchronized(t, p)
	t.Cleanup(p.Close)
	view := p.DRAView(config.Default().Start.DRA)
	var names []string
	for _, d := range offer(t, view, nil) {
		names = append(names, d.CDI)
	}
	if !slices.Equal(names, []string{"nvidia.com/gpu=1"}) {
		t.Errorf("offered %v, want GPU 1 only (kubelet allocated GPU 0)", names)
	}
	err = view.Prepare(context.Background(), claimC, []link.Allocated{{CDI: "nvidia.com/gpu=0", Requests: []string{"gpus"}}})
	testutil.ErrorSays(t, err, `claim tenant/c of pod tenant/a: denied by policy: device "nvidia.com/gpu=0" is allocated by kubelet to pod default/k`)
	if err := view.Prepare(context.Background(), claimC, []link.Allocated{{CDI: "nvidia.com/gpu=1", Requests: []string{"gpus"}}}); err != nil {
		t.Errorf("GPU 1: %v", err)
	}
}

// TestAllocateAgreesWithPool: kubelet's Allocate through nri-gpu's
// device plugin waits for the restore (bounded, then ErrRestoring); it
// is refused a GPU a count request took since kubelet was told it
// healthy (both at once, as after a reboot), naming that pod, so that
// kubelet fails the pod's admission instead of leaving its container
// refused; a GPU it is given is kubelet's from then on, though kubelet's
// pod-resources API does not list it yet: a count request takes another,
// and the pod's container gets it.
func TestAllocateAgreesWithPool(t *testing.T) {
	socket := filepath.Join(testutil.ShortDir(t), "pod-resources", "kubelet.sock")
	testutil.ServePodResources(t, socket)
	cfg, err := config.Parse(fmt.Appendf(nil, "version: v1\npolicy: {exclusive: true}\nstart:\n  devicePlugin:\n    podResources: %s\n    resources: [{name: nvidia.com/gpu}]\n", socket))
	if err != nil {
		t.Fatal(err)
	}
	p, err := plugin.New(cfg, quiet(), plugin.WithSpecDirs([]string{gpuSpecDir(t, 3)}), plugin.WithDevicePlugin(noDoor{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	res := config.Resource{Name: "nvidia.com/gpu", Kind: "nvidia.com/gpu", Devices: []string{"*"}}
	dp := deviceplugin.New(res, testutil.ShortDir(t), config.CDIAnnotations, p.Resource(res), quiet())
	allocate := func(ctx context.Context, id string) (*dpapi.AllocateResponse, error) {
		return dp.Allocate(ctx, &dpapi.AllocateRequest{ContainerRequests: []*dpapi.ContainerAllocateRequest{{DevicesIds: []string{id}}}})
	}
	create := func(name string, podAnn, ctrAnn map[string]string) (string, error) {
		pod := &api.PodSandbox{Id: "id-" + name, Name: name, Namespace: "tenant", Annotations: podAnn}
		ctr := &api.Container{Id: name + "-c", PodSandboxId: pod.Id, Name: "main", Annotations: ctrAnn, Linux: &api.LinuxContainer{}}
		adj, _, err := p.CreateContainer(context.Background(), pod, ctr)
		return adj.GetAnnotations()[plugin.DevicesAnnotation], err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := allocate(ctx, "1"); !errors.Is(err, plugin.ErrRestoring) {
		t.Fatalf("Allocate before the restore: %v, want ErrRestoring", err)
	}
	synchronized(t, p)
	count := map[string]string{"gpu-count.nri-gpu.io": "1"}
	if got, err := create("counted", count, nil); err != nil || got != "nvidia.com/gpu=0" {
		t.Fatalf("count pod: %q, %v; want GPU 0", got, err)
	}
	_, err = allocate(context.Background(), "0")
	testutil.ErrorSays(t, err, "nvidia.com/gpu: kubelet chose 0", `device "nvidia.com/gpu=0"`, "tenant/counted")
	if _, err := allocate(context.Background(), "1"); err != nil {
		t.Fatalf("Allocate of a free GPU: %v", err)
	}
	if got, err := create("next", count, nil); err != nil || got != "nvidia.com/gpu=2" {
		t.Errorf("count pod after kubelet allocated GPU 1: %q, %v; want GPU 2", got, err)
	}
	if got, err := create("kube", nil, map[string]string{"cdi.k8s.io/nri-gpu_nvidia.com_gpu": "nvidia.com/gpu=1"}); err != nil || got != "nvidia.com/gpu=1" {
		t.Errorf("the device-plugin pod: %q, %v; want GPU 1", got, err)
	}
}
