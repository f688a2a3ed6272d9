package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/test/harness"
)

// TestUpgradeStream: `helm upgrade` to another image (nri-gpu's, under
// another tag on each node) while, on each node, pods of every door (a
// count annotation, the device plugin's resource, a DRA claim) are created
// one after another throughout. The chart's surge hands each node over
// from the old nri-gpu to the new one: every pod ends Running with
// exactly one GPU, seen the first time it is seen Running; no GPU is seen
// by two pods.
func TestUpgradeStream(t *testing.T) {
	needCluster(t)
	nodes := env.nodes
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
	started := time.Now().Add(-time.Second) // events' times are in seconds
	streamThrough(t, "helm upgrade", func() error {
		_, err := env.cluster.Helm(env.helm, "upgrade", releaseName, chartDir, "--namespace", nriNamespace, "--wait", "--timeout", "3m", "--values", env.values, "--values", next)
		return err
	})
	for name, p := range nriPods(t) {
		if p.UID == before[name].UID || !strings.HasSuffix(p.Spec.Containers[0].Image, ":next") {
			t.Errorf("%s: nri-gpu's pod %s (%s) not replaced by the upgrade", name, p.Name, p.Spec.Containers[0].Image)
		}
	}
	for _, n := range nodes {
		log := nriLog(t, n)
		if !strings.Contains(log, "took over the state file") {
			t.Errorf("%s: the new nri-gpu does not say it took over:\n%s", n.Name, log)
		}
		// The new DRA driver registered beside the old one, before the
		// take-over: kubelet's rolling update of a DRA driver.
		if !strings.Contains(log, "for a rolling update (pod "+string(nriPods(t)[n.Name].UID)+")") {
			t.Errorf("%s: the new DRA driver does not say it registered for a rolling update", n.Name)
		}
	}
	// Claims were prepared throughout: kubelet never failed to prepare one.
	events, err := env.client.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{FieldSelector: "reason=FailedPrepareDynamicResources"})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range events.Items {
		if !e.LastTimestamp.Time.Before(started) {
			t.Errorf("kubelet failed to prepare a claim of %s during the upgrade: %s", e.InvolvedObject.Name, e.Message)
		}
	}
}

// TestCrashStream: nri-gpu's process killed (SIGKILL) on both nodes,
// kubelet starting its container again, while pods of every door are
// created on each node one after another: every pod ends Running with
// exactly one GPU, seen the first time it is seen Running (one whose
// container was created while nri-gpu was away is stopped and created
// again through it first); no GPU is seen by two pods. A device-plugin
// pod is admitted by kubelet throughout: the chart's relay container keeps
// kubelet's endpoint while nri-gpu is away (without it, kubelet rejects
// one admitted meanwhile for good: UnexpectedAdmissionError, no healthy
// devices).
func TestCrashStream(t *testing.T) {
	needCluster(t)
	// kubelet logs when a resource's last endpoint goes (and it marks all
	// its devices unhealthy): with the relay, never through the kills.
	const lastGone = `"Last device plugin for this resource disconnected" resource="nvidia.com/gpu"`
	gone := map[string]int{}
	for _, n := range env.nodes {
		gone[n.Name] = strings.Count(readFile(t, filepath.Join(n.Dir, "kubelet.log")), lastGone)
	}
	defer func() {
		for _, n := range env.nodes {
			if got := strings.Count(readFile(t, filepath.Join(n.Dir, "kubelet.log")), lastGone); got != gone[n.Name] {
				t.Errorf("%s: kubelet lost every endpoint of nvidia.com/gpu %d times through the kills", n.Name, got-gone[n.Name])
			}
		}
	}()
	streamThrough(t, "kill -9 of nri-gpu", func() error {
		for _, n := range env.nodes {
			restarts, err := nriRestarts(n)
			if err != nil {
				return err
			}
			pid, err := nriPidOf(n)
			if err != nil {
				return err
			}
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				return err
			}
			deadline := time.Now().Add(podWait)
			for {
				pods, err := listNRIPods()
				if err != nil {
					return err
				}
				if s := pods[n.Name].Status.ContainerStatuses; len(s) > 0 && s[0].RestartCount > restarts && s[0].Ready {
					break
				}
				if time.Now().After(deadline) {
					return fmt.Errorf("%s: nri-gpu not Ready again after its kill", n.Name)
				}
				time.Sleep(200 * time.Millisecond)
			}
		}
		return nil
	})
}

// TestContainerdRestartStream: each node's containerd restarted while
// pods of every door are created on it one after another: every pod ends
// Running with exactly one GPU, seen the first time it is seen Running; no
// GPU is seen by two pods.
func TestContainerdRestartStream(t *testing.T) {
	needCluster(t)
	streamThrough(t, "containerd restart", func() error {
		for _, n := range env.nodes {
			if err := n.Ctd.Restart(); err != nil {
				return err
			}
			if err := n.WaitReady(podWait); err != nil {
				return err
			}
		}
		return waitDaemonSetReady(2)
	})
}

// TestRestartedBetweenCrashes: a pod holding a GPU by count whose
// container exits, again and again (kubelet waiting longer each time to
// start it again), is deleted after containerd restarted while it had no
// container: containerd tells nri-gpu of neither its sandbox's stop nor
// its removal, and reported no container of it; nri-gpu releases the GPU
// when the pod's sandbox process ends, on each node (1.7.35 and 2.3.7).
func TestRestartedBetweenCrashes(t *testing.T) {
	needCluster(t)
	for _, n := range env.nodes {
		t.Run(n.Name, func(t *testing.T) {
			p := gpuPod("default", "between-crashes", 0, map[string]string{"gpu-count.nri-gpu.io": "1"}, n.Name)
			p.Spec.Containers[0].Command = []string{"/bin/sleep", "1"}
			createPod(t, p)
			testutil.Within(t, podWait, "the pod's container exited twice, waiting to be started again", func() bool {
				got, err := env.client.CoreV1().Pods("default").Get(context.Background(), p.Name, metav1.GetOptions{})
				if err != nil || len(got.Status.ContainerStatuses) == 0 {
					return false
				}
				s := got.Status.ContainerStatuses[0]
				return s.RestartCount >= 2 && s.State.Waiting != nil
			})
			if got := allocatable(t, n); got != int64(n.GPUs-1) {
				t.Fatalf("%s offers %d GPUs while the pod waits, want %d: the pod's GPU held", n.Name, got, n.GPUs-1)
			}
			synced := strings.Count(nriLog(t, n), "restored devices held by pod")
			if err := n.Ctd.Restart(); err != nil {
				t.Fatal(err)
			}
			testutil.Within(t, podWait, "nri-gpu synchronized with the restarted containerd", func() bool {
				return strings.Count(nriLog(t, n), "restored devices held by pod") > synced
			})
			deletePod(t, "default", p.Name)
			testutil.Within(t, 20*time.Second, n.Name+" offering all its GPUs once the pod is gone", func() bool {
				return allocatable(t, n) == int64(n.GPUs)
			})
			if log := nriLog(t, n); !strings.Contains(log, "the pod's sandbox ended with no container") {
				t.Errorf("nri-gpu does not say the pod's sandbox ended:\n%s", log)
			}
		})
	}
}

// nriPid is the pid of node n's nri-gpu process, as its containerd tells.
func nriPid(t *testing.T, n *harness.Node) int {
	t.Helper()
	pid, err := nriPidOf(n)
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// nriPidOf is nriPid for a goroutine other than the test's.
func nriPidOf(n *harness.Node) (int, error) {
	pods, err := listNRIPods()
	if err != nil {
		return 0, err
	}
	p, ok := pods[n.Name]
	if !ok || len(p.Status.ContainerStatuses) == 0 {
		return 0, fmt.Errorf("no nri-gpu container on %s", n.Name)
	}
	id := runtimeID(p.Status.ContainerStatuses[0].ContainerID)
	out, err := n.Ctd.Crictl("inspect", "-o", "go-template", "--template", "{{.info.pid}}", id)
	if err != nil {
		return 0, fmt.Errorf("nri-gpu's pid on %s: %w: %s", n.Name, err, out)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("nri-gpu's pid on %s: %q", n.Name, out)
	}
	return pid, nil
}

// nriRestarts is how often kubelet has restarted node n's nri-gpu.
func nriRestarts(n *harness.Node) (int32, error) {
	pods, err := listNRIPods()
	if err != nil {
		return 0, err
	}
	if s := pods[n.Name].Status.ContainerStatuses; len(s) > 0 {
		return s[0].RestartCount, nil
	}
	return 0, fmt.Errorf("no nri-gpu container on %s", n.Name)
}

// streamThrough creates, on each node, pods of every door one after
// another (a count annotation, the device plugin's resource, a DRA
// claim), each waited for until Running, checked to see exactly one GPU
// and deleted, while disrupt runs (begun once the streams are under
// way), and three more pods after it; then checks that no GPU is seen by
// two pods and every claim was released.
func streamThrough(t *testing.T, what string, disrupt func() error) {
	t.Helper()
	createTemplate(t, "default", "stream-gpu", harness.ClaimSpec(driverName, 1))
	nodes := env.nodes
	var (
		done   = make(chan struct{})
		mu     sync.Mutex
		report []string
		errc   = make(chan error, 1)
	)
	go func() {
		// Not a subtest: the streams, parallel subtests, take as many
		// of the test binary's parallel slots as the machine has cores.
		defer close(done)
		time.Sleep(3 * time.Second) // the streams under way
		start := time.Now()
		err := disrupt()
		mu.Lock()
		report = append(report, fmt.Sprintf("%s took %s", what, time.Since(start).Round(100*time.Millisecond)))
		mu.Unlock()
		errc <- err
	}()
	t.Run("during "+what, func(t *testing.T) {
		for _, n := range nodes {
			t.Run("stream on "+n.Name, func(t *testing.T) {
				t.Parallel()
				doors := map[string]int{}
				createdAgainCount := 0 // containers created while nri-gpu was away, stopped by it
				after := 0             // pods begun once the disruption was over
				for i := 0; after < 3; i++ {
					select {
					case <-done:
						after++
					default:
					}
					name := fmt.Sprintf("stream-%s-%d", n.Name, i)
					var door string
					var seen []string
					var again bool
					switch i % 3 {
					case 0:
						door = "annotation"
						createPod(t, scheduledOn(n, gpuPod("default", name, 0, map[string]string{"gpu-count.nri-gpu.io": "1"}, "")))
						p := waitRunning(t, "default", name)
						seen, again = servedGPUs(t, n, p, p.Spec.Containers[0].Name)
					case 1:
						door = "device plugin"
						createPod(t, scheduledOn(n, gpuPod("default", name, 1, nil, "")))
						p := waitRunning(t, "default", name)
						seen, again = servedGPUs(t, n, p, p.Spec.Containers[0].Name)
					case 2:
						door = "DRA"
						createPod(t, claimPod("default", name, n, "stream-gpu", ""))
						seen, again = servedGPUs(t, n, waitAllRunning(t, "default", name), "gpu")
					}
					if len(seen) != 1 {
						t.Errorf("%s (%s): Running with %v, want one GPU", name, door, seen)
					}
					if again {
						createdAgainCount++
					}
					doors[door]++
					deletePod(t, "default", name)
				}
				mu.Lock()
				report = append(report, fmt.Sprintf("%s: %v pods, each Running with its GPU; %d of them first run GPU-less while nri-gpu was away, stopped by it and created again", n.Name, doors, createdAgainCount))
				mu.Unlock()
			})
		}
	})
	if err := <-errc; err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	for _, r := range report {
		t.Log(r)
	}
	for _, n := range nodes {
		noGPUTwice(t, n)
	}
	waitAllReleased(t, nodes)
}

// servedGPUs returns the GPU device nodes container ctr of pod p on node
// n sees once nri-gpu has served it, and whether it was created again for
// that. On node-a, whose containerd 1.7 creates containers while nri-gpu
// is away (nothing can require it there: docs/operations.md), a container
// found without its GPU, or already stopped, must be one nri-gpu stopped
// once back (the pod's StoppedByNRIGPU event) and kubelet created again
// with it. On node-b (containerd 2.3.7, nri-gpu required for these pods)
// the first container must have its GPU.
func servedGPUs(t *testing.T, n *harness.Node, p *corev1.Pod, ctr string) ([]string, bool) {
	t.Helper()
	out, err := n.Ctd.Exec(containerID(t, p, ctr), "ls", "/dev")
	gpus := gpuNodes(out)
	if err == nil && len(gpus) > 0 {
		return gpus, false
	}
	if n != env.a {
		t.Fatalf("pod %s on %s: its first container sees GPUs %v (%v), and nri-gpu is required there", p.Name, n.Name, gpus, err)
	}
	t.Logf("pod %s: its first container sees GPUs %v (%v): created while nri-gpu was away", p.Name, gpus, err)
	stoppedEvents(t, n, p)
	again := createdAgain(t, p, ctr)
	return gpusIn(t, n, containerID(t, again, ctr), p.Name), true
}

// scheduledOn has the scheduler place pod p on node n (a node selector),
// as a workload's pods are placed: a pod bound to a node by name skips
// the scheduler, and kubelet fails it at once if it asks for a resource
// the node does not offer at that moment (a device plugin restarting).
func scheduledOn(n *harness.Node, p *corev1.Pod) *corev1.Pod {
	p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": n.Name}
	return p
}

// waitAllReleased waits until every node offers all its GPUs again (no
// pod and no claim holds one); if not, it says what each node offers and
// what its nri-gpu records.
func waitAllReleased(t *testing.T, nodes []*harness.Node) {
	t.Helper()
	deadline := time.Now().Add(podWait)
	for {
		var held []string
		for _, n := range nodes {
			if got := allocatable(t, n); got != int64(n.GPUs) {
				state, _ := os.ReadFile(filepath.Join(n.Dir, "run", "nri-gpu", "allocations.json"))
				held = append(held, fmt.Sprintf("%s offers %d of %d GPUs; its record: %s", n.Name, got, n.GPUs, state))
				if time.Now().After(deadline) {
					held = append(held, "its nri-gpu's log:\n"+nriLog(t, n))
				}
			}
		}
		if len(held) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("GPUs still held %s after the streams:\n%s", podWait, strings.Join(held, "\n"))
		}
		time.Sleep(200 * time.Millisecond)
	}
}
