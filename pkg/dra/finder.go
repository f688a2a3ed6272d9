package dra

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/dynamic-resource-allocation/resourceclaim"

	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
)

var _ link.Finder = (*Finder)(nil)

// Finder tells which of the driver's claims a container uses, from the
// API server: the pod's spec (a container's resources.claims), its status
// (the claims made from templates) and the claims themselves, each of
// which must be reserved for the pod. Nothing a tenant writes into
// annotations decides it.
type Finder struct {
	driver, node string
	client       kubernetes.Interface
	pods         corelisters.PodLister
}

// NewFinder returns the finder of the driver on node; it watches the
// node's pods until ctx is done.
func NewFinder(ctx context.Context, client kubernetes.Interface, driver, node string) *Finder {
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", node).String()
		}))
	f := &Finder{driver: driver, node: node, client: client, pods: factory.Core().V1().Pods().Lister()}
	factory.Start(ctx.Done())
	return f
}

// pod returns the pod, from the node's watched pods or else the API
// server, and checks that it is the runtime's (the same UID).
func (f *Finder) pod(ctx context.Context, ref link.PodRef) (*corev1.Pod, error) {
	pod, err := f.pods.Pods(ref.Namespace).Get(ref.Name)
	if err != nil || (ref.UID != "" && string(pod.UID) != ref.UID) {
		if pod, err = f.client.CoreV1().Pods(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{}); err != nil {
			return nil, fmt.Errorf("pod %s/%s: %w", ref.Namespace, ref.Name, err)
		}
	}
	if ref.UID != "" && string(pod.UID) != ref.UID {
		return nil, fmt.Errorf("pod %s/%s: the API server has UID %s, the runtime's sandbox %s", ref.Namespace, ref.Name, pod.UID, ref.UID)
	}
	return pod, nil
}

// Uses returns the claims of this driver, allocated on this node, that
// the named container of the pod uses.
func (f *Finder) Uses(ctx context.Context, ref link.PodRef, container string) ([]link.ClaimUse, error) {
	pod, err := f.pod(ctx, ref)
	if err != nil {
		return nil, err
	}
	var claims []corev1.ResourceClaim
	for _, c := range append(append([]corev1.Container(nil), pod.Spec.InitContainers...), pod.Spec.Containers...) {
		if c.Name == container {
			claims = c.Resources.Claims
			break
		}
	}
	var uses []link.ClaimUse
	for _, cc := range claims {
		var podClaim *corev1.PodResourceClaim
		for i := range pod.Spec.ResourceClaims {
			if pod.Spec.ResourceClaims[i].Name == cc.Name {
				podClaim = &pod.Spec.ResourceClaims[i]
			}
		}
		if podClaim == nil {
			continue // the API server does not admit such a pod
		}
		name, mustCheckOwner, err := resourceclaim.Name(pod, podClaim)
		if err != nil {
			return nil, fmt.Errorf("pod %s/%s claim %q: %w", pod.Namespace, pod.Name, cc.Name, err)
		}
		if name == nil {
			continue // not needed by this pod
		}
		var requests []string
		if cc.Request != "" {
			requests = []string{cc.Request}
		}
		u, err := f.use(ctx, pod, cc.Name, *name, mustCheckOwner, requests)
		if err != nil {
			return nil, err
		}
		if u != nil {
			uses = append(uses, *u)
		}
	}
	// An extended resource (limits: nvidia.com/gpu: 1) that a DeviceClass
	// maps to DRA: kube-scheduler made the pod a claim of its own, and
	// the pod's status says which of its requests serve which container.
	if ext := pod.Status.ExtendedResourceClaimStatus; ext != nil {
		var requests []string
		for _, m := range ext.RequestMappings {
			if m.ContainerName == container {
				requests = append(requests, m.RequestName)
			}
		}
		if len(requests) > 0 {
			u, err := f.use(ctx, pod, "extended resources", ext.ResourceClaimName, true, requests)
			if err != nil {
				return nil, err
			}
			if u != nil {
				uses = append(uses, *u)
			}
		}
	}
	return uses, nil
}

// use returns the use of claim name by the pod (for requests; none: all
// of them), as the pod knows it (what), or nil when it is not the
// driver's on this node. A claim made for the pod must be owned by it
// (mustCheckOwner); any claim of the driver's must be reserved for it.
func (f *Finder) use(ctx context.Context, pod *corev1.Pod, what, name string, mustCheckOwner bool, requests []string) (*link.ClaimUse, error) {
	claim, err := f.client.ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("pod %s/%s claim %q: %w", pod.Namespace, pod.Name, what, err)
	}
	if mustCheckOwner {
		if err := resourceclaim.IsForPod(pod, claim, false); err != nil {
			return nil, fmt.Errorf("pod %s/%s claim %q: %w", pod.Namespace, pod.Name, what, err)
		}
	}
	if !f.ours(claim) {
		return nil, nil
	}
	if !resourceclaim.IsReservedForPod(pod, claim, false) {
		return nil, fmt.Errorf("claim %s/%s: %w %s/%s", claim.Namespace, claim.Name, link.ErrNotReserved, pod.Namespace, pod.Name)
	}
	return &link.ClaimUse{UID: string(claim.UID), Namespace: claim.Namespace, Name: claim.Name, Requests: requests}, nil
}

// ours reports whether a claim has devices of this driver on this node.
func (f *Finder) ours(c *resourceapi.ResourceClaim) bool {
	if c.Status.Allocation == nil {
		return false
	}
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver == f.driver && r.Pool == f.node {
			return true
		}
	}
	return false
}
