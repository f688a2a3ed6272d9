package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/nri-gpu/nri-gpu/pkg/adjust"
	"github.com/nri-gpu/nri-gpu/test/corpus"
	"github.com/nri-gpu/nri-gpu/test/harness"
)

// ReferenceEnv names the directory of the containerd whose own CDI
// injection the corpus is compared with (2.x; make test sets it).
const ReferenceEnv = "NRI_GPU_REFERENCE_CONTAINERD"

// TestCorpusParity injects every device of every published spec of the
// corpus (test/corpus) through nri-gpu on this suite's containerd, with
// its own CDI off, and through the reference containerd's own CDI, and
// compares what reaches the container, field by field: the device nodes
// (owner and mode), their effective cgroup access, the spec's mounts in
// order, its env, the hooks per phase and which of them ran, additional
// groups and RDT, and whether the container starts. On containerd 2.x
// the two must be identical but for the hook env nri-gpu always sets; on
// 1.7 each difference must be one adjust allows, asserted as exactly it.
func TestCorpusParity(t *testing.T) {
	needEnv(t)
	refDir := os.Getenv(ReferenceEnv)
	if refDir == "" {
		t.Fatalf("%s is not set (make test sets it)", ReferenceEnv)
	}
	refTools, err := env.tools.WithContainerd(refDir)
	if err != nil {
		t.Fatal(err)
	}
	// What the suite's containerd applies of an adjustment (2.x: cgroup
	// rules and RDT; 1.7: neither).
	rt := adjust.Runtime{Name: "containerd", Version: env.tools.ContainerdVersion, CgroupRules: env.tools.Containerd2(), RDT: env.tools.Containerd2()}
	corpus.Parity(t, "containerd "+env.tools.ContainerdVersion, rt, filepath.Join(env.dir, "corpus"), func(t *testing.T, g int, dirs []string, config string) corpus.Pair {
		ref := extraContainerdWith(t, refTools, fmt.Sprintf("corpus-ref-%d", g), harness.Options{EnableCDI: true, CDISpecDirs: dirs})
		ctd := extraContainerd(t, fmt.Sprintf("corpus-nri-%d", g), harness.Options{})
		if err := os.WriteFile(filepath.Join(ctd.Dir, "nri-gpu.yaml"), []byte(config), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := ctd.StartPlugin("--config", filepath.Join(ctd.Dir, "nri-gpu.yaml")); err != nil {
			t.Fatal(err)
		}
		return corpus.Pair{
			Ref: func(t *testing.T, podAnn, ctrAnn map[string]string) (corpus.Run, error) {
				return corpusContainer(t, ref, podAnn, ctrAnn)
			},
			NRI: func(t *testing.T, podAnn, ctrAnn map[string]string) (corpus.Run, error) {
				return corpusContainer(t, ctd, podAnn, ctrAnn)
			},
		}
	})
}

// corpusContainer runs a container asking for a device; it returns the
// container's id and spec, or why it did not start.
func corpusContainer(t *testing.T, ctd *harness.Containerd, podAnn, ctrAnn map[string]string) (corpus.Run, error) {
	t.Helper()
	podID, pod := newPod(t, ctd, podAnn)
	id, err := ctd.CreateContainer(podID, pod, harness.Container{Name: "c", Annotations: ctrAnn})
	if err != nil {
		return corpus.Run{}, err
	}
	if err := ctd.StartContainer(id); err != nil {
		return corpus.Run{}, err
	}
	spec, err := ctd.ContainerSpec(id)
	if err != nil {
		t.Fatal(err)
	}
	return corpus.Run{ID: id, Spec: spec}, nil
}
