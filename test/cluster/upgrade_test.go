package cluster

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/test/harness"
)

// TestUpgradeStream: `helm upgrade` to another image (nri-gpu's, under
// another tag on each node) while, on each node, pods of every door (a
// count annotation, the device plugin's resource, a DRA claim) are created
// one after another throughout. The chart's surge hands each node over
// from the old nri-gpu to the new one: every pod ends Running with
// exactly one GPU, seen the first time it is seen Running, none GPU-less;
// no GPU is seen by two pods.
func TestUpgradeStream(t *testing.T) {
	needCluster(t)
	createTemplate(t, "default", "stream-gpu", harness.ClaimSpec(driverName, 1))
	nodes := []*harness.Node{env.a, env.b}
	for _, n := range nodes {
		out, err := n.Ctd.Ctr("images", "ls", "-q")
		if err != nil {
			t.Fatalf("%s: %v: %s", n.Name, err, out)
		}
		var ref string
		for _, line := range strings.Fields(out) {
			if strings.HasSuffix(line, "/nri-gpu:latest") || line == "nri-gpu:latest" {
				ref = line
			}
		}
		if ref == "" {
			t.Fatalf("%s: no nri-gpu:latest among %s", n.Name, out)
		}
		if out, err := n.Ctd.Ctr("images", "tag", "--force", ref, strings.TrimSuffix(ref, ":latest")+":next"); err != nil {
			t.Fatalf("%s: tagging nri-gpu: %v: %s", n.Name, err, out)
		}
	}
	next := valuesFile(t, "next-image.yaml", "image:\n  tag: next\n")
	t.Cleanup(func() { helmUpgrade(t, env.values) })
	before := nriPods(t)

	var (
		upgraded = make(chan struct{})
		mu       sync.Mutex
		report   []string
	)
	upgradeErr := make(chan error, 1)
	go func() {
		// Not a subtest: the streams, parallel subtests, take as many
		// of the test binary's parallel slots as the machine has cores.
		defer close(upgraded)
		time.Sleep(3 * time.Second) // the streams under way
		start := time.Now()
		args := []string{"upgrade", releaseName, chartDir, "--namespace", nriNamespace, "--wait", "--timeout", "3m", "--values", env.values, "--values", next}
		_, err := env.cluster.Helm(env.helm, args...)
		mu.Lock()
		report = append(report, fmt.Sprintf("helm upgrade took %s", time.Since(start).Round(time.Second)))
		mu.Unlock()
		upgradeErr <- err
	}()
	t.Run("during", func(t *testing.T) {
		for _, n := range nodes {
			t.Run("stream on "+n.Name, func(t *testing.T) {
				t.Parallel()
				doors := map[string]int{}
				after := 0 // pods begun once the upgrade was done
				for i := 0; after < 3; i++ {
					select {
					case <-upgraded:
						after++
					default:
					}
					name := fmt.Sprintf("stream-%s-%d", n.Name, i)
					var door string
					var seen []string
					switch i % 3 {
					case 0:
						door = "annotation"
						createPod(t, gpuPod("default", name, 0, map[string]string{"gpu-count.nri-gpu.io": "1"}, n.Name))
						seen = gpusSeen(t, waitRunning(t, "default", name))
					case 1:
						door = "device plugin"
						createPod(t, gpuPod("default", name, 1, nil, n.Name))
						seen = gpusSeen(t, waitRunning(t, "default", name))
					case 2:
						door = "DRA"
						createPod(t, claimPod("default", name, n, "stream-gpu", ""))
						seen = seenBy(t, waitAllRunning(t, "default", name), "gpu")
					}
					if len(seen) != 1 {
						t.Errorf("%s (%s): Running with %v, want one GPU", name, door, seen)
					}
					doors[door]++
					deletePod(t, "default", name)
				}
				mu.Lock()
				report = append(report, fmt.Sprintf("%s: %v pods, each Running with its GPU", n.Name, doors))
				mu.Unlock()
			})
		}
	})
	if err := <-upgradeErr; err != nil {
		t.Fatalf("helm upgrade: %v", err)
	}
	for _, r := range report {
		t.Log(r)
	}
	for name, p := range nriPods(t) {
		if p.UID == before[name].UID || !strings.HasSuffix(p.Spec.Containers[0].Image, ":next") {
			t.Errorf("%s: nri-gpu's pod %s (%s) not replaced by the upgrade", name, p.Name, p.Spec.Containers[0].Image)
		}
	}
	for _, n := range nodes {
		if log := nriLog(t, n); !strings.Contains(log, "took over the state file") {
			t.Errorf("%s: the new nri-gpu does not say it took over:\n%s", n.Name, log)
		}
		noGPUTwice(t, n)
	}
	testutil.Within(t, podWait, "the claims of the stream released", func() bool {
		return allocatable(t, env.a) == int64(env.a.GPUs) && allocatable(t, env.b) == int64(env.b.GPUs)
	})
}
