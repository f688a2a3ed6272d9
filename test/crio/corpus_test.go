package crio

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/nri-gpu/nri-gpu/pkg/adjust"
	"github.com/nri-gpu/nri-gpu/test/corpus"
	"github.com/nri-gpu/nri-gpu/test/harness"
)

// nriOfLog is the NRI version nri-gpu says the runtime runs.
var nriOfLog = regexp.MustCompile(`what the runtime can apply: cri-o \S+ \(NRI (v[^)]+)\)`)

// TestCorpusParity injects every device of every published spec of the
// corpus (test/corpus) through nri-gpu on a CRI-O whose own CDI reads no
// spec, and through CRI-O's own CDI (CRI-O injects a container's
// cdi.k8s.io devices itself), and compares what reaches the container
// as the containerd suite does: the device nodes, their effective cgroup
// access, the mounts in order, the env, the hooks per phase and which
// ran, additional groups and RDT, and whether the container starts.
// What CRI-O's NRI cannot apply (1.34's NRI applies no cgroup rule and no
// RDT) is refused by nri-gpu naming the edit; everything else must be
// identical but for what corpus.Compare allows and says (the hook env
// nri-gpu sets; NRI's "rw" for a node where CDI says "rwm").
func TestCorpusParity(t *testing.T) {
	needEnv(t)
	m := nriOfLog.FindStringSubmatch(env.nri.Log())
	if m == nil {
		t.Fatalf("nri-gpu does not say which NRI CRI-O runs:\n%s", env.nri.Log())
	}
	rt := adjust.RuntimeOf("cri-o", env.crio.Version, m[1])
	corpus.Parity(t, "CRI-O "+env.crio.Version, rt, filepath.Join(env.dir, "corpus"), func(t *testing.T, g int, dirs []string, config string) corpus.Pair {
		ref := startCRIO(t, fmt.Sprintf("ref-%d", g), dirs)
		nri := startCRIO(t, fmt.Sprintf("nri-%d", g), nil)
		if err := os.WriteFile(filepath.Join(nri.Dir, "nri-gpu.yaml"), []byte(config), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := nri.StartPlugin("--config", filepath.Join(nri.Dir, "nri-gpu.yaml")); err != nil {
			t.Fatal(err)
		}
		return corpus.Pair{
			Ref: func(t *testing.T, podAnn, ctrAnn map[string]string) (corpus.Run, error) {
				return corpusContainer(t, ref, podAnn, ctrAnn)
			},
			NRI: func(t *testing.T, podAnn, ctrAnn map[string]string) (corpus.Run, error) {
				return corpusContainer(t, nri, podAnn, ctrAnn)
			},
		}
	})
}

// startCRIO starts another CRI-O of the suite, reading CDI specs from
// specDirs (none: its own CDI resolves no device), stopped when the test
// ends.
func startCRIO(t *testing.T, name string, specDirs []string) *harness.Containerd {
	t.Helper()
	c, err := harness.StartCRIO(filepath.Join(env.dir, name), env.tools, env.crio, harness.Options{Image: env.image, CDISpecDirs: specDirs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Errorf("stopping CRI-O %s: %v", name, err)
		}
	})
	return c
}

// corpusContainer runs a container asking for a device in a pod of its
// own on c; it returns the container's ID and spec, or why it did not
// start.
func corpusContainer(t *testing.T, c *harness.Containerd, podAnn, ctrAnn map[string]string) (corpus.Run, error) {
	t.Helper()
	pod := harness.Pod{Name: fmt.Sprintf("pod-%d", pods.Add(1)), Namespace: "e2e", Annotations: podAnn}
	podID, err := c.RunPod(pod)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = c.Crictl("rmp", "--force", podID) })
	id, err := c.CreateContainer(podID, pod, harness.Container{Name: "c", Annotations: ctrAnn})
	if err != nil {
		return corpus.Run{}, err
	}
	// Stopped at once before its pod goes (registered after the pod's
	// removal, it runs first): CRI-O waits out the stop timeout of a
	// sleep that ignores SIGTERM.
	t.Cleanup(func() { _, _ = c.Crictl("stop", "--timeout", "0", id) })
	if err := c.StartContainer(id); err != nil {
		return corpus.Run{}, err
	}
	spec, err := c.ContainerSpec(id)
	if err != nil {
		t.Fatal(err)
	}
	return corpus.Run{ID: id, Spec: spec}, nil
}
