package deviceplugin_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/deviceplugin"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// TestAllocated: what kubelet says it allocated, of the resources asked
// about only; an error naming the socket when kubelet is not there.
func TestAllocated(t *testing.T) {
	socket := filepath.Join(testutil.ShortDir(t), "kubelet.sock")
	testutil.ServePodResources(t, socket,
		testutil.AllocatedPod("a", "one", "nvidia.com/gpu", "0", "1::2"),
		testutil.AllocatedPod("b", "two", "example.com/other", "0"),
		testutil.AllocatedPod("c", "three", "nvidia.com/gpu.shared", "3"))
	got, err := deviceplugin.Allocated(context.Background(), socket, []string{"nvidia.com/gpu", "nvidia.com/gpu.shared"})
	want := []deviceplugin.Allocation{
		{Namespace: "a", Pod: "one", Resource: "nvidia.com/gpu", ID: "0"},
		{Namespace: "a", Pod: "one", Resource: "nvidia.com/gpu", ID: "1::2"},
		{Namespace: "c", Pod: "three", Resource: "nvidia.com/gpu.shared", ID: "3"},
	}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("got %v, %v; want %v", got, err, want)
	}
	missing := filepath.Join(filepath.Dir(socket), "none.sock")
	_, err = deviceplugin.Allocated(context.Background(), missing, []string{"nvidia.com/gpu"})
	testutil.ErrorSays(t, err, "kubelet's pod-resources API at "+missing)
}

// TestKubeletAllocations: kubelet's allocations of nri-gpu's resources,
// named as the specs name them (a resource's kind, else its name), each
// device once per pod, the pod asking left out and a shared device's
// replicas left to kubelet.
func TestKubeletAllocations(t *testing.T) {
	dir := t.TempDir()
	spec := "cdiVersion: \"0.6.0\"\nkind: example.com/gpu\ndevices:\n- name: \"0\"\n  containerEdits:\n    deviceNodes: [{path: /dev/example0, hostPath: /dev/null}]\n"
	if err := os.WriteFile(filepath.Join(dir, "gpu.yaml"), []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	reg, err := specs.Open([]string{dir})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	socket := filepath.Join(testutil.ShortDir(t), "kubelet.sock")
	testutil.ServePodResources(t, socket,
		testutil.AllocatedPod("a", "one", "gpus", "0", "0"),
		testutil.AllocatedPod("a", "two", "gpus", "0", "1"),
		testutil.AllocatedPod("b", "asking", "gpus", "1"),
		testutil.AllocatedPod("c", "shared", "example.com/gpu", deviceplugin.ReplicaID("0", 2)),
		testutil.AllocatedPod("d", "other", "example.com/other", "0"))
	resources := []config.Resource{{Name: "gpus", Kind: "example.com/gpu"}, {Name: "example.com/gpu", Kind: "example.com/gpu"}}
	got, err := deviceplugin.KubeletAllocations(context.Background(), socket, resources, reg.Snapshot(), policy.PodName{Namespace: "b", Name: "asking"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"example.com/gpu=0 a/one [c 1:3]", "example.com/gpu=0 a/two [c 1:3]", "example.com/gpu=1 a/two []"}
	var says []string
	for _, a := range got {
		says = append(says, fmt.Sprintf("%s %s %v", a.Device.Name, a.Pod, a.Device.Nodes))
	}
	if !slices.Equal(says, want) {
		t.Errorf("got %q, want %q", says, want)
	}
	_, err = deviceplugin.KubeletAllocations(context.Background(), filepath.Join(filepath.Dir(socket), "none.sock"), resources, reg.Snapshot(), policy.PodName{})
	testutil.ErrorSays(t, err, "kubelet's pod-resources API")
}
