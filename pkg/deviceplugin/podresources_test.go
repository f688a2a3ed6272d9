package deviceplugin_test

import (
	"context"
	"path/filepath"
	"slices"
	"testing"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/deviceplugin"
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
