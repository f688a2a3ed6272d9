package testutil

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/grpc"

	podresources "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// podResources is kubelet's pod-resources API as a test serves it: the
// pods kubelet admitted and the devices it allocated them.
type podResources struct {
	podresources.UnimplementedPodResourcesListerServer
	pods []*podresources.PodResources
}

func (s *podResources) List(context.Context, *podresources.ListPodResourcesRequest) (*podresources.ListPodResourcesResponse, error) {
	return &podresources.ListPodResourcesResponse{PodResources: s.pods}, nil
}

// AllocatedPod is a pod one of whose containers, main, kubelet allocated
// ids of resource.
func AllocatedPod(namespace, name, resource string, ids ...string) *podresources.PodResources {
	return &podresources.PodResources{Namespace: namespace, Name: name, Containers: []*podresources.ContainerResources{
		{Name: "main", Devices: []*podresources.ContainerDevices{{ResourceName: resource, DeviceIds: ids}}},
	}}
}

// ServePodResources serves pods as kubelet's pod-resources API on socket
// until the test ends.
func ServePodResources(t testing.TB, socket string, pods ...*podresources.PodResources) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(socket), 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	podresources.RegisterPodResourcesListerServer(srv, &podResources{pods: pods})
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
}
