package metrics_test

import (
	"slices"
	"testing"

	"github.com/nri-gpu/nri-gpu/pkg/metrics"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
)

// TestHoldersOf: a pod holds as itself, through the door it came by; a
// claim holds once per pod it was prepared for, in its namespace, or
// once with no pod before any; each takes what its user takes.
func TestHoldersOf(t *testing.T) {
	pod := policy.Pod{ID: "id", Namespace: "ns", Name: "p"}
	use := policy.Use{Shares: 2, Memory: 1 << 30}
	claim := &policy.Claim{UID: "u", Namespace: "team", Name: "c", Pods: []policy.PodName{{Namespace: "team", Name: "a"}, {Namespace: "team", Name: "b"}}}
	for _, tc := range []struct {
		name string
		user policy.User
		want []metrics.Holder
	}{
		{"annotation", policy.User{Pod: pod, Use: use},
			[]metrics.Holder{{Door: metrics.DoorAnnotation, Namespace: "ns", Pod: "p", Shares: 2, Memory: 1 << 30}}},
		{"count", policy.User{Pod: pod, Counted: true}, []metrics.Holder{{Door: metrics.DoorCount, Namespace: "ns", Pod: "p"}}},
		{"device plugin", policy.User{Pod: pod, Kubelet: true}, []metrics.Holder{{Door: metrics.DoorDevicePlugin, Namespace: "ns", Pod: "p"}}},
		{"found, though counted", policy.User{Pod: pod, Found: true, Counted: true}, []metrics.Holder{{Door: metrics.DoorFound, Namespace: "ns", Pod: "p"}}},
		{"a claim of two pods", policy.User{Claim: claim, Use: use}, []metrics.Holder{
			{Door: metrics.DoorDRA, Namespace: "team", Pod: "a", Claim: "c", Shares: 2, Memory: 1 << 30},
			{Door: metrics.DoorDRA, Namespace: "team", Pod: "b", Claim: "c", Shares: 2, Memory: 1 << 30}}},
		{"a claim of no pod yet", policy.User{Claim: &policy.Claim{UID: "u", Namespace: "team", Name: "c"}},
			[]metrics.Holder{{Door: metrics.DoorDRA, Namespace: "team", Claim: "c"}}},
	} {
		if got := metrics.HoldersOf(tc.user); !slices.Equal(got, tc.want) {
			t.Errorf("%s: holders %+v, want %+v", tc.name, got, tc.want)
		}
	}
}
