package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nri-gpu/nri-gpu/internal/mpsstandin"
	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/test/harness"
)

// TestSharedReplicasPlaced: a helm upgrade shares every GPU two ways with
// MPS (nri-gpu reloads; its pods are not replaced). nri-gpu, in its pod,
// starts a control daemon per GPU (a stand-in for nvidia-cuda-mps-control
// at a path of the node's that only the node's root mounted in the pod
// has, run chrooted there as the chart's mps.hostRoot says; it records
// how it was started: the GPU's UUID, the limits as its defaults, the
// GPU's shm directory as its /dev/shm), and its device
// plugin offers two replicas per GPU: allocatable 4 and 8. A Deployment
// of 12 one-GPU pods is placed by the scheduler 4 and 8, each pod sees
// one GPU with its MPS client environment and daemon directories, every
// GPU is seen by two pods; a 13th is Unschedulable. The upgrade undone,
// the daemons are stopped and allocatable is 2 and 4 again.
func TestSharedReplicasPlaced(t *testing.T) {
	needCluster(t)
	nodes := env.nodes
	mpsStandIn(t, nodes)
	mpsDir := func(n *harness.Node, gpu int) string {
		return filepath.Join(n.Dir, "run", "nri-gpu", "mps", n.UUID(gpu))
	}
	before := nriPods(t)
	shared := valuesFile(t, "shared-values.yaml", `config:
  policy:
    sharing: [{devices: ["nvidia.com/gpu=*"], replicas: 2, strategy: mps, pinnedMemoryLimit: 2Gi}]
`)
	upgrade(t, env.values, shared)
	undone := false
	undo := func() {
		if !undone {
			undone = true
			upgrade(t, env.values)
		}
	}
	t.Cleanup(undo)
	for node, p := range nriPods(t) {
		if before[node].UID != p.UID {
			t.Errorf("%s: the upgrade replaced nri-gpu's pod; want it reloaded", node)
		}
	}
	for _, n := range nodes {
		waitAllocatable(t, n, 2*n.GPUs)
		for i := range n.GPUs {
			testutil.Within(t, podWait, fmt.Sprintf("%s: GPU %d's daemon started with its limits", n.Name, i), func() bool {
				data, _ := os.ReadFile(filepath.Join(mpsDir(n, i), "pipe", mpsstandin.Defaults))
				return string(data) == "set_default_active_thread_percentage 50\nset_default_device_pinned_mem_limit 0 2048M\n"
			})
			log, _ := os.ReadFile(filepath.Join(mpsDir(n, i), "log", mpsstandin.Log))
			if want := fmt.Sprintf(`run args=["-d"] CUDA_VISIBLE_DEVICES=%q`, n.UUID(i)); !strings.Contains(string(log), want) {
				t.Errorf("%s GPU %d's daemon:\n%s\nwant %s", n.Name, i, log, want)
			}
			// Written to the daemon's /dev/shm, from inside nri-gpu's pod.
			if _, err := os.Stat(filepath.Join(mpsDir(n, i), "shm", mpsstandin.Started)); err != nil {
				t.Errorf("%s GPU %d's daemon did not have its shm directory as /dev/shm: %v", n.Name, i, err)
			}
		}
	}

	labels := map[string]string{"app": "shared-gpus"}
	dep := createDeployment(t, "shared-gpus", labels, 12)
	pods := runningPods(t, labels, 12)
	seen := map[string][]string{} // node -> GPUs its pods see
	for i := range pods {
		p := &pods[i]
		gpus := gpusSeen(t, p)
		if len(gpus) != 1 {
			t.Errorf("pod %s on %s sees %v, want one GPU", p.Name, p.Spec.NodeName, gpus)
			continue
		}
		seen[p.Spec.NodeName] = append(seen[p.Spec.NodeName], gpus[0])
		gpu := int(gpus[0][len("nvidia")] - '0')
		if pipe, limits := mpsClient(t, p, p.Spec.Containers[0].Name); !slices.Contains(limits, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2048M") ||
			pipe != "/run/nri-gpu/mps/"+nodeOf(t, p).UUID(gpu)+"/pipe" {
			t.Errorf("pod %s (%s) has no MPS client of GPU %d: pipe %q, limits %v", p.Name, gpus[0], gpu, pipe, limits)
		}
	}
	for _, n := range nodes {
		got := seen[n.Name]
		slices.Sort(got)
		var want []string
		for i := range n.GPUs {
			want = append(want, fmt.Sprintf("nvidia%d", i), fmt.Sprintf("nvidia%d", i))
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: its pods see %v, want each GPU twice %v", n.Name, got, want)
		}
	}
	scaleUnschedulable(t, dep.Name, labels, 13, "nvidia.com/gpu")

	deleteDeployment(t, dep.Name, labels)
	undo()
	for _, n := range nodes {
		waitAllocatable(t, n, n.GPUs)
		for i := range n.GPUs {
			testutil.Within(t, podWait, fmt.Sprintf("%s: GPU %d's daemon stopped", n.Name, i), func() bool {
				log, _ := os.ReadFile(filepath.Join(mpsDir(n, i), "log", mpsstandin.Log))
				return strings.HasSuffix(string(log), "command quit\n")
			})
		}
	}
}

// TestDRAConsumableCapacity (after the tests that count the device
// plugin's GPUs: its replicas of GPU 0 stay known to kubelet): with GPU 0
// shared 4 ways with 80Gi
// (policy.sharing, reloaded through helm upgrade), node a's slice offers
// it to several claims with "shares" and "memory", as the API server
// accepts them; kube-scheduler allocates a 50Gi and a 20Gi claim on it
// together, both pods run and see GPU 0, and a third claim of 20Gi stays
// Pending with the scheduler's reason; through nri-gpu's pod deleted and
// kubelet and containerd restarted, both claims stay held with their
// amounts (a pod asking for what is not left is refused); once one is
// gone, the third runs.
func TestDRAConsumableCapacity(t *testing.T) {
	needCluster(t)
	shared := valuesFile(t, "capacity-values.yaml", `config:
  policy:
    sharing: [{devices: ["nvidia.com/gpu=0"], replicas: 4, memory: 80Gi, memoryQuota: true, memoryRequest: {step: 1Gi}}]
`)
	upgrade(t, env.values, shared)
	t.Cleanup(func() {
		upgrade(t, env.values)
		testutil.Within(t, podWait, env.a.Name+"'s gpu-0 offered to one claim again", func() bool {
			d := slice(t, env.a)["gpu-0"]
			return d.AllowMultipleAllocations == nil && len(d.Capacity) == 0
		})
	})

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
	createTemplate(t, "default", "gpu0-50gi", memoryClaimSpec("gpu-zero", "50Gi"))
	createTemplate(t, "default", "gpu0-20gi", memoryClaimSpec("gpu-zero", "20Gi"))
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
		return err == nil && (unschedulable(*p, "cannot allocate all claims") || unschedulable(*p, "resourceclaim"))
	})
	// Through each fault on node-a (nri-gpu's pod deleted, kubelet and
	// containerd restarted), both claims stay held with their amounts:
	// their containers run on, and a pod asking for GPU 0 by annotation
	// (a share and the default 20Gi) is refused, as only 10Gi is left.
	ids := map[string]string{}
	for _, name := range []string{"big", "small"} {
		ids[name] = containerID(t, waitAllRunning(t, "default", name), "gpu")
	}
	for _, f := range nodeFaults() {
		f.fault(t, n)
		if err := n.WaitReady(podWait); err != nil {
			t.Fatal(err)
		}
		if err := waitDaemonSetReady(2); err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"big", "small"} {
			if id := containerID(t, waitAllRunning(t, "default", name), "gpu"); id != ids[name] {
				t.Errorf("after %s: pod %s's container changed", f.name, name)
			}
		}
		createPod(t, gpuPod("default", "by-name", 0, map[string]string{"gpus.nri-gpu.io": "0"}, n.Name))
		refusedWith(t, "default", "by-name", "10Gi of memory left")
		deletePod(t, "default", "by-name")
		if p, err := env.client.CoreV1().Pods("default").Get(context.Background(), "past", metav1.GetOptions{}); err != nil || p.Spec.NodeName != "" {
			t.Errorf("after %s: pod past placed (%v): the capacity was given twice", f.name, err)
		}
		t.Logf("after %s: claims of 50Gi and 20Gi still held on gpu-0, a 20Gi pod refused", f.name)
	}
	deletePod(t, "default", "big")
	waitAllRunning(t, "default", "past")
	for _, name := range []string{"small", "past"} {
		deletePod(t, "default", name)
	}
}

// mpsStandIn puts the stand-in MPS control program on nodes, where the
// suite's values have nri-gpu run it for GPUs shared with MPS: the node's
// /var/lib/mps-standin, which nri-gpu's container reaches only through
// the node's root (mps.hostRoot). It is removed, with the daemons'
// directories, when the test ends.
func mpsStandIn(t *testing.T, nodes []*harness.Node) {
	t.Helper()
	standin, err := os.ReadFile(env.tools.Path("mps-control"))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		bin := filepath.Join(n.Dir, "var-lib", "mps-standin", "nvidia-cuda-mps-control")
		if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(bin, standin, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = os.RemoveAll(filepath.Dir(bin))
			_ = os.RemoveAll(filepath.Join(n.Dir, "run", "nri-gpu", "mps"))
		})
	}
}
