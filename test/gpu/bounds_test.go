package gpu

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/nri-gpu/nri-gpu/pkg/memlimit"
	"github.com/nri-gpu/nri-gpu/test/harness"
)

// TestRealMemoryBounds shares GPU 0 two ways by time-slicing with 4 GiB
// of memory counted (2 GiB a pod), on a throwaway containerd: nri-gpu has
// the driver bound each pod's container, on its own cgroup, to its
// 2 GiB. One pod allocates 1.5 GiB and succeeds; the other asks 3 GiB
// and fails near 2 GiB. Where the node cannot bound GPU memory (cgroup
// v1, a driver without per-cgroup limits: what nri-gpu check says), it
// says why and stops, having checked that nri-gpu refuses the pod under
// policy.memoryLimits: enforced.
func TestRealMemoryBounds(t *testing.T) {
	if os.Getenv(RealEnv) != "1" {
		t.Skipf("needs an NVIDIA GPU and root: run test/gpu/run.sh on a GPU node (it sets %s=1)", RealEnv)
	}
	support, err := memlimit.Probe(nvml.New(), memlimit.Host)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	specDir, ctd := realNode(t, dir, program(t, dir, "mpsclient", mpsClient), false)
	config := filepath.Join(dir, "nri-gpu.yaml")
	text := fmt.Sprintf("cdiSpecDirs: [%s]\npolicy:\n  sharing: [{devices: [\"nvidia.com/gpu=0\", \"nvidia.com/gpu=GPU-*\"], replicas: 2, memory: 4Gi}]\n", specDir)
	if err := os.WriteFile(config, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := ctd.StartPlugin("--config", config)
	if err != nil {
		t.Fatal(err)
	}
	run := func(name string) (string, error) {
		t.Helper()
		pod := harness.Pod{Name: name, Namespace: "default", Annotations: map[string]string{"gpus.nri-gpu.io": "0"}}
		podID, err := ctd.RunPod(pod)
		if err != nil {
			t.Fatal(err)
		}
		id, err := ctd.CreateContainer(podID, pod, harness.Container{Name: "cuda"})
		if err != nil {
			return "", err
		}
		if err := ctd.StartContainer(id); err != nil {
			t.Fatalf("pod %s: %v\n%s", name, err, p.Log())
		}
		return id, nil
	}
	if !support.Enforced() {
		_, err := run("refused")
		if err == nil || !strings.Contains(err.Error(), "which the driver cannot bound here") {
			t.Errorf("where the driver cannot bound memory, the pod: %v; want refused, saying why", err)
		}
		t.Skipf("this node cannot bound GPU memory per cgroup (%s); nri-gpu refuses the pod under memoryLimits: enforced", strings.Join(support.Why(), "; "))
	}
	within, err := run("within")
	if err != nil {
		t.Fatal(err)
	}
	past, err := run("past")
	if err != nil {
		t.Fatal(err)
	}
	withinAndPast(t, ctd, within, past, 1536, "a pod's 2 GiB bound")
}

// withinAndPast has container within allocate mib MiB, under a 2 GiB
// bound (what), and past 3 GiB: the first succeeds, the second fails
// near 2 GiB.
func withinAndPast(t *testing.T, ctd *harness.Containerd, within, past string, mib int, what string) {
	t.Helper()
	out, err := ctd.Exec(within, "/mpsclient", "alloc", strconv.Itoa(mib))
	t.Logf("%d MiB under %s: %s", mib, what, out)
	if err != nil || !strings.Contains(out, fmt.Sprintf("allocated %d MiB", mib)) {
		t.Errorf("%d MiB under %s: %v", mib, what, err)
	}
	out, err = ctd.Exec(past, "/mpsclient", "alloc", "3072")
	t.Logf("3 GiB past %s: %s", what, out)
	if err == nil || !regexp.MustCompile(`failed at (1[0-9]{3}|20[0-9]{2}) MiB`).MatchString(out) {
		t.Errorf("3 GiB past %s did not fail near 2 GiB: %v", what, err)
	}
}
