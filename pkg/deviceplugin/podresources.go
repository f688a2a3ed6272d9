package deviceplugin

import (
	"context"
	"fmt"
	"slices"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"tags.cncf.io/container-device-interface/pkg/parser"

	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"

	podresources "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// Allocation is a device kubelet allocated a container of a pod.
type Allocation struct {
	Namespace, Pod string
	// Resource is the extended resource, ID the device's ID in it.
	Resource, ID string
}

// maxPodResources bounds the size of kubelet's answer.
const maxPodResources = 16 << 20

// Allocated asks kubelet, through its pod-resources API at socket, which
// devices of resources it has allocated to the containers of the pods it
// runs: kubelet allocates a pod's devices when it admits the pod, before
// any of its containers is created, and keeps them until the pod ends.
func Allocated(ctx context.Context, socket string, resources []string) ([]Allocation, error) {
	conn, err := grpc.NewClient("unix://"+socket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxPodResources)))
	if err != nil {
		return nil, fmt.Errorf("kubelet's pod-resources API at %s: %w", socket, err)
	}
	defer conn.Close()
	resp, err := podresources.NewPodResourcesListerClient(conn).List(ctx, &podresources.ListPodResourcesRequest{})
	if err != nil {
		return nil, fmt.Errorf("kubelet's pod-resources API at %s: %w", socket, err)
	}
	var out []Allocation
	for _, pod := range resp.GetPodResources() {
		for _, c := range pod.GetContainers() {
			for _, d := range c.GetDevices() {
				if !slices.Contains(resources, d.GetResourceName()) {
					continue
				}
				for _, id := range d.GetDeviceIds() {
					out = append(out, Allocation{Namespace: pod.GetNamespace(), Pod: pod.GetName(), Resource: d.GetResourceName(), ID: id})
				}
			}
		}
	}
	return out, nil
}

// KubeletAllocations asks kubelet (Allocated) which devices of resources
// it allocated pods but except (the zero PodName for none), and returns
// them by their names in snap, each once per pod. A shared device's
// replicas are left out: kubelet counts them itself.
func KubeletAllocations(ctx context.Context, socket string, resources []config.Resource, snap *specs.Snapshot, except policy.PodName) ([]policy.KubeletAllocation, error) {
	kinds := map[string]string{}
	var names []string
	for _, res := range resources {
		kinds[res.Name] = res.Kind
		names = append(names, res.Name)
	}
	got, err := Allocated(ctx, socket, names)
	if err != nil {
		return nil, err
	}
	var out []policy.KubeletAllocation
	for _, a := range got {
		holder := policy.PodName{Namespace: a.Namespace, Name: a.Pod}
		if holder == except || DeviceOf(a.ID) != a.ID {
			continue
		}
		vendor, class := parser.ParseQualifier(kinds[a.Resource])
		dev := snap.Footprints([]string{parser.QualifiedName(vendor, class, a.ID)})[0]
		if !slices.ContainsFunc(out, func(k policy.KubeletAllocation) bool { return k.Device.Name == dev.Name && k.Pod == holder }) {
			out = append(out, policy.KubeletAllocation{Device: dev, Pod: holder})
		}
	}
	return out, nil
}
