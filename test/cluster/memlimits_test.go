package cluster

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/test/harness"
)

// boundedValues have nri-gpu read the fake driver under nodeDriverRoot
// and share GPU 0 two ways by time-slicing with 40Gi of memory counted,
// under policy.memoryLimits: enforced (the default).
const boundedValues = `config:
  driverRoot: ` + nodeDriverRoot + `
  policy:
    sharing: [{devices: ["nvidia.com/gpu=0"], replicas: 2, memory: 40Gi}]
`

// TestDriverBoundsClaims: GPU memory the driver bounds, through the DRA
// door, nri-gpu installed by the chart. Each node's containerized driver
// root holds a fake driver (harness.ClusterFakeDriver: its libnvidia-ml
// a real shared object that nri-gpu's NVML dlopens, recording each limit
// it is asked to set), and GPU 0 is time-sliced two ways with 40Gi
// counted. On the cgroup v2 node (systemdShape), a claim asking 10Gi of
// GPU 0's memory, which kube-scheduler allocates from the node's slice,
// runs its pod with its "gpu" container bounded by the driver to 10Gi,
// soft and hard, on that container's own cgroup by the host's path
// (nri-gpu runs in a container of its own cgroup namespace, and reads
// the host's hierarchy the chart mounts), and its "plain" container not
// at all; nri-gpu's pod replaced, the new one sets the bound again and
// the pod runs on; the pod deleted, the bound is lifted. On the cgroup
// v1 nodes, no door offers GPU 0 (the node's slice leaves it out) and a
// pod asking it by annotation is refused, saying why.
func TestDriverBoundsClaims(t *testing.T) {
	needCluster(t)
	// Each node's driver has that node's GPUs: built here, or, where
	// harness.FakeDriverEnv says, built ahead for the first node (the
	// VM's node has no compiler, and its cluster that one node).
	d := env.nodes[0].FakeDriver()
	for _, n := range env.nodes {
		build := filepath.Join(os.Getenv(harness.FakeDriverEnv), harness.ClusterFakeDriverDir)
		if os.Getenv(harness.FakeDriverEnv) == "" || n.FakeDriver() != harness.ClusterFakeDriver(1) {
			build = filepath.Join(env.dir, "fake-driver-bounds", n.Name)
			if err := harness.BuildFakeDriver(n.FakeDriver(), build); err != nil {
				t.Fatal(err)
			}
		}
		root := onNode(n, nodeDriverRoot)
		if err := harness.InstallFakeDriver(build, filepath.Join(root, "usr", "lib64"), filepath.Join(root, "nvidia-module-version"), d.Version, ""); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(onNode(n, d.LimitsFile)); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, n := range env.nodes {
			for _, p := range []string{nodeDriverRoot, d.LimitsFile} {
				if err := os.RemoveAll(onNode(n, p)); err != nil {
					t.Error(err)
				}
			}
		}
	})
	restartWith(t, env.nodes, driverName, env.values, valuesFile(t, "bounds-values.yaml", boundedValues))
	t.Cleanup(func() { restartWith(t, env.nodes, driverName, env.values) })

	if !systemdShape() {
		for _, n := range env.nodes {
			if _, offered := slice(t, n)["gpu-0"]; offered {
				t.Errorf("%s: the slice offers gpu-0, whose holders' memory the driver cannot bound on cgroup v1", n.Name)
			}
			name := "unbounded-" + n.Name
			createPod(t, gpuPod("default", name, 0, map[string]string{"gpus.nri-gpu.io": "0"}, n.Name))
			refusedWith(t, "default", name, "which the driver cannot bound here", "is not cgroup v2")
			deletePod(t, "default", name)
		}
		return
	}

	n := env.a
	t.Cleanup(func() {
		if t.Failed() {
			for _, l := range strings.Split(nriLog(t, n), "\n") {
				if strings.Contains(l, "GPU memory") {
					t.Log(l)
				}
			}
		}
	})
	testutil.Within(t, podWait, n.Name+"'s slice offers gpu-0's memory to claims", func() bool {
		_, ok := slice(t, n)["gpu-0"].Capacity["memory"]
		return ok
	})
	createClass(t, "bounded-gpu-zero", `device.attributes["`+driverName+`"].index == 0`)
	createTemplate(t, "default", "bounded-10gi", memoryClaimSpec("bounded-gpu-zero", "10Gi"))
	createPod(t, claimPod("default", "bounded", n, "bounded-10gi", ""))
	p := waitAllRunning(t, "default", "bounded")
	gpu, plain := containerID(t, p, "gpu"), containerID(t, p, "plain")
	limits := onNode(n, d.LimitsFile)
	// of returns the limits set on container id's cgroup: "SOFT HARD"
	// each, in order, and the cgroup.
	of := func(id string) (sets []string, cgroup string) {
		lines, err := harness.ReadLimits(limits)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range lines {
			f := strings.Fields(l)
			if len(f) == 4 && f[0] == n.UUID(0) && strings.HasSuffix(f[1], id+".scope") {
				sets, cgroup = append(sets, f[2]+" "+f[3]), f[1]
			}
		}
		return sets, cgroup
	}
	const bound, lifted = "10737418240 10737418240", "0 18446744073709551615"
	testutil.Within(t, podWait, "the gpu container bounded to 10Gi", func() bool {
		sets, _ := of(gpu)
		return slices.Equal(sets, []string{bound})
	})
	_, cgroup := of(gpu)
	if fi, err := os.Stat(cgroup); !strings.HasPrefix(cgroup, "/sys/fs/cgroup/kubepods.slice/") || err != nil || !fi.IsDir() {
		t.Errorf("the bound is set on %q (%v), want the gpu container's cgroup by the host's path", cgroup, err)
	}
	if sets, _ := of(plain); len(sets) > 0 {
		t.Errorf("the plain container, which uses no claim, is bounded: %v", sets)
	}

	replaceNRIPod(t, n)
	testutil.Within(t, podWait, "the next nri-gpu sets the bound again", func() bool {
		sets, _ := of(gpu)
		return slices.Equal(sets, []string{bound, bound})
	})
	if id := containerID(t, waitAllRunning(t, "default", "bounded"), "gpu"); id != gpu {
		t.Errorf("the gpu container changed through nri-gpu's restart: %s, was %s", id, gpu)
	}

	deletePod(t, "default", "bounded")
	testutil.Within(t, podWait, "the bound lifted", func() bool {
		sets, _ := of(gpu)
		return len(sets) > 0 && sets[len(sets)-1] == lifted
	})
}
