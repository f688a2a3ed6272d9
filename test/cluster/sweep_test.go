package cluster

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/test/harness"
)

// TestDRASweep: with a sweep every 3 s, a claim pod on node-b is deleted
// (at once) while the node's kubelet is away, and its claim goes with it:
// kubelet will never unprepare the claim. While the pod's containers
// still run on the node, nri-gpu keeps the claim and says why; once the
// pod's sandbox is gone (removed on the node, kubelet still away), a
// sweep releases the claim, and the record no longer holds it.
func TestDRASweep(t *testing.T) {
	needCluster(t)
	n := env.b
	restartWith(t, []*harness.Node{n}, driverName, env.values, valuesFile(t, "sweep.yaml", "config:\n  dra:\n    sweepInterval: 3s\n"))
	t.Cleanup(func() { restartWith(t, []*harness.Node{n}, driverName, env.values) })
	createTemplate(t, "default", "sweep-gpu", harness.ClaimSpec(driverName, 1))
	createPod(t, claimPod("default", "sweep-claim", n, "sweep-gpu", ""))
	claim := allocatedClaim(t, waitAllRunning(t, "default", "sweep-claim"))
	record := filepath.Join(n.Dir, "run", "nri-gpu", "allocations.json")
	holds := func() bool {
		data, err := os.ReadFile(record)
		return err != nil || strings.Contains(string(data), string(claim.UID))
	}
	if !holds() {
		t.Fatalf("the record does not hold claim %s", claim.UID)
	}

	n.StopKubelet()
	t.Cleanup(func() {
		if err := n.StartKubelet(); err != nil {
			t.Error(err)
		}
		if err := n.WaitReady(podWait); err != nil {
			t.Error(err)
		}
	})
	ctx := context.Background()
	if err := env.client.CoreV1().Pods("default").Delete(ctx, "sweep-claim", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	testutil.Within(t, podWait, "the pod's claim deleted", func() bool {
		_, err := env.client.ResourceV1().ResourceClaims("default").Get(ctx, claim.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	testutil.Within(t, 30*time.Second, "nri-gpu keeping the claim its pod's containers use", func() bool {
		return strings.Contains(nriLog(t, n), "kept a prepared claim that the API server no longer has: claim default/"+claim.Name)
	})
	if !holds() {
		t.Fatal("the claim was released while its pod's containers run")
	}

	out, err := n.Ctd.Crictl("pods", "-q", "--namespace", "default", "--name", "^sweep-claim$")
	if err != nil || strings.TrimSpace(out) == "" {
		t.Fatalf("the pod's sandbox on %s: %v: %q", n.Name, err, out)
	}
	for _, id := range strings.Fields(out) {
		if out, err := n.Ctd.Crictl("stopp", id); err != nil {
			t.Fatalf("stopping sandbox %s: %v: %s", id, err, out)
		}
		if out, err := n.Ctd.Crictl("rmp", id); err != nil {
			t.Fatalf("removing sandbox %s: %v: %s", id, err, out)
		}
	}
	testutil.Within(t, 30*time.Second, "a sweep releasing the claim", func() bool {
		return !holds() && strings.Contains(nriLog(t, n), "released a prepared claim that the API server no longer has")
	})
}
