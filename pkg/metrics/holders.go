package metrics

import "github.com/nri-gpu/nri-gpu/pkg/policy"

// HoldersOf returns a user of a device (policy.Usage's) as the metrics
// name its holders: a pod, or a claim with each pod it was prepared for
// (none yet: one holder, no pod), each with the door it came through and
// what it takes of the device.
func HoldersOf(u policy.User) []Holder {
	h := Holder{Door: DoorOf(u), Namespace: u.Pod.Namespace, Pod: u.Pod.Name, Shares: u.Use.Shares, Memory: u.Use.Memory}
	if u.Claim == nil {
		return []Holder{h}
	}
	h.Namespace, h.Claim = u.Claim.Namespace, u.Claim.Name
	if len(u.Claim.Pods) == 0 {
		return []Holder{h}
	}
	out := make([]Holder, 0, len(u.Claim.Pods))
	for _, pod := range u.Claim.Pods {
		h.Namespace, h.Pod = pod.Namespace, pod.Name
		out = append(out, h)
	}
	return out
}

// DoorOf names the door a user got its device through.
func DoorOf(u policy.User) string {
	switch {
	case u.Claim != nil:
		return DoorDRA
	case u.Found:
		return DoorFound
	case u.Kubelet:
		return DoorDevicePlugin
	case u.Counted:
		return DoorCount
	}
	return DoorAnnotation
}
