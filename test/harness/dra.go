package harness

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
)

// ClaimSpec asks for count devices of the DeviceClass class, in one
// request named "gpus".
func ClaimSpec(class string, count int64) resourceapi.ResourceClaimSpec {
	return resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
		Name:    "gpus",
		Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count},
	}}}}
}

// UseClaimTemplate has pod p's first container use a claim named "gpu"
// made from the ResourceClaimTemplate template, and returns p.
func UseClaimTemplate(p *corev1.Pod, template string) *corev1.Pod {
	p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
	p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: &template}}
	return p
}

// SliceDevices returns the devices of the ResourceSlices of driver for
// node, by name.
func (c *Cluster) SliceDevices(node, driver string) (map[string]resourceapi.Device, error) {
	slices, err := c.Client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{
		FieldSelector: fields.Set{"spec.nodeName": node, "spec.driver": driver}.String(),
	})
	if err != nil {
		return nil, err
	}
	out := map[string]resourceapi.Device{}
	for _, s := range slices.Items {
		for _, d := range s.Spec.Devices {
			out[d.Name] = d
		}
	}
	return out, nil
}
