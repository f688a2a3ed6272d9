package e2e

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/test/harness"
)

// TestUnservedStopped: on real containerd, nri-gpu is killed; while it is
// away, containerd creates a container asking for GPU 0 (it starts
// without it), one of a namespace the policy refuses asking for GPU 1
// (without it too), and one asking for nothing. Within seconds of
// nri-gpu's return the first two are stopped (their processes killed, as
// containerd's own eviction does), each with its reason in nri-gpu's log
// (what it lacks: one that had it would be judged by the admission,
// TestUnservedStopped in pkg/plugin); the third runs on. The pod's next container
// (what kubelet creates on a restart) is created through nri-gpu and gets
// GPU 0.
func TestUnservedStopped(t *testing.T) {
	needEnv(t)
	ctd := extraContainerd(t, "ctd-unserved", harness.Options{})
	p := startPlugin(t, ctd, "namespaces: [e2e]")
	p.Kill()

	gpuID, gpuPod := newPod(t, ctd, map[string]string{"gpus.nri-gpu.io": "0"})
	lacking, spec := runContainer(t, ctd, gpuID, gpuPod, harness.Container{Name: "lacking"})
	if got := gpuNodes(spec); len(got) > 0 {
		t.Fatalf("created with no nri-gpu, the container got %v", got)
	}
	refusedPod := harness.Pod{Name: "refused", Namespace: "elsewhere", Annotations: map[string]string{"gpus.nri-gpu.io": "1"}}
	refusedID, err := ctd.RunPod(refusedPod)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = ctd.Crictl("rmp", "--force", refusedID) })
	refused, _ := runContainer(t, ctd, refusedID, refusedPod, harness.Container{Name: "refused"})
	plainID, plainPod := newPod(t, ctd, nil)
	plain, _ := runContainer(t, ctd, plainID, plainPod, harness.Container{Name: "plain"})

	back := time.Now()
	p = startPlugin(t, ctd, "namespaces: [e2e]")
	state := func(id string) string {
		out, err := ctd.Crictl("inspect", "-o", "go-template", "--template", "{{.status.state}}", id)
		if err != nil {
			t.Fatalf("inspect %s: %v: %s", id, err, out)
		}
		return strings.TrimSpace(out)
	}
	testutil.Within(t, 10*time.Second, "the unserved containers stopped", func() bool {
		return state(lacking) == "CONTAINER_EXITED" && state(refused) == "CONTAINER_EXITED"
	})
	t.Logf("stopped %s after nri-gpu came back", time.Since(back).Round(time.Millisecond))
	if got := state(plain); got != "CONTAINER_RUNNING" {
		t.Errorf("the container asking for nothing is %s, want it running", got)
	}
	for _, want := range []string{
		"stopped the container, to be created again through nri-gpu: it was created while nri-gpu was not serving, without nvidia.com/gpu=0",
		"stopped the container, to be created again through nri-gpu: it was created while nri-gpu was not serving, without nvidia.com/gpu=1",
	} {
		if !strings.Contains(p.Log(), want) {
			t.Errorf("nri-gpu's log does not say %q:\n%s", want, p.Log())
		}
	}
	if _, spec := runContainer(t, ctd, gpuID, gpuPod, harness.Container{Name: "again"}); !slices.Equal(gpuNodes(spec), []string{"/dev/nvidia0"}) {
		t.Errorf("the pod's next container got %v, want GPU 0", gpuNodes(spec))
	}
}
