package cluster

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
)

// TestDRAConsumableCapacity: with GPU 0 shared 4 ways with 80Gi
// (policy.sharing, reloaded through helm upgrade), node a's slice offers
// it to several claims with "shares" and "memory", as the API server
// accepts them; kube-scheduler allocates a 50Gi and a 20Gi claim on it
// together, both pods run and see GPU 0, and a third claim of 20Gi stays
// Pending with the scheduler's reason; once one is gone, it runs.
func TestDRAConsumableCapacity(t *testing.T) {
	needCluster(t)
	shared := filepath.Join(env.dir, "capacity-values.yaml")
	if err := os.WriteFile(shared, []byte(`config:
  policy:
    sharing: [{devices: ["nvidia.com/gpu=0"], replicas: 4, memory: 80Gi, memoryQuota: true, memoryRequest: {step: 1Gi}}]
`), 0o644); err != nil {
		t.Fatal(err)
	}
	upgrade(t, env.values, shared)
	t.Cleanup(func() { upgrade(t, env.values) })

	n := env.a
	var gpu0 resourceapi.Device
	testutil.Within(t, podWait, n.Name+"'s gpu-0 offered for several claims", func() bool {
		gpu0 = slice(t, n)["gpu-0"]
		return gpu0.AllowMultipleAllocations != nil && *gpu0.AllowMultipleAllocations
	})
	mem, shares := gpu0.Capacity["memory"], gpu0.Capacity["shares"]
	if mem.Value.String() != "80Gi" || mem.RequestPolicy == nil || mem.RequestPolicy.Default.String() != "20Gi" || shares.Value.String() != "4" {
		t.Errorf("gpu-0's capacity: memory %+v, shares %+v", mem, shares)
	}
	createClass(t, "gpu-zero", `device.attributes["`+driverName+`"].index == 0`)
	asking := func(memory string) resourceapi.ResourceClaimSpec {
		spec := claimSpec("gpu-zero", 1)
		spec.Devices.Requests[0].Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
			"memory": resource.MustParse(memory)}}
		return spec
	}
	createTemplate(t, "default", "gpu0-50gi", asking("50Gi"))
	createTemplate(t, "default", "gpu0-20gi", asking("20Gi"))
	createPod(t, claimPod("default", "big", n, "gpu0-50gi", ""))
	createPod(t, claimPod("default", "small", n, "gpu0-20gi", ""))
	for _, name := range []string{"big", "small"} {
		p := waitAllRunning(t, "default", name)
		if seen := seenBy(t, p, "gpu"); !slices.Equal(seen, []string{"nvidia0"}) {
			t.Errorf("pod %s sees %v, want nvidia0", name, seen)
		}
		c := allocatedClaim(t, p)
		if r := c.Status.Allocation.Devices.Results[0]; r.Device != "gpu-0" || r.ShareID == nil {
			t.Errorf("pod %s's claim allocated %s (share %v), want a share of gpu-0", name, r.Device, r.ShareID)
		}
	}
	createPod(t, claimPod("default", "past", n, "gpu0-20gi", ""))
	testutil.Within(t, podWait, "pod past unschedulable", func() bool {
		p, err := env.client.CoreV1().Pods("default").Get(context.Background(), "past", metav1.GetOptions{})
		if err != nil {
			return false
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				t.Logf("pod past: %s", c.Message)
				return strings.Contains(c.Message, "cannot allocate all claims") || strings.Contains(c.Message, "resourceclaim")
			}
		}
		return false
	})
	deletePod(t, "default", "big")
	waitAllRunning(t, "default", "past")
	for _, name := range []string{"small", "past"} {
		deletePod(t, "default", name)
	}
}
