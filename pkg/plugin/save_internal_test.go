package plugin

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/containerd/nri/pkg/api"
	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/pkg/config"
)

// The steps of a save, in order: killed before "rename", the old record
// stays; killed at "renamed" (after the rename), the new one is in place.
var saveSteps = []struct {
	step    string
	renamed bool
}{{"create", false}, {"write", false}, {"sync", false}, {"rename", false}, {"renamed", true}}

const killedSaveEnv = "NRI_GPU_TEST_KILL_AT"

// twoGPUs is a spec of GPUs 0 and 1 (/dev/null and /dev/zero as nodes).
const twoGPUs = `cdiVersion: "0.6.0"
kind: nvidia.com/gpu
devices:
  - {name: "0", containerEdits: {deviceNodes: [{path: /dev/nvidia0, hostPath: /dev/null}]}}
  - {name: "1", containerEdits: {deviceNodes: [{path: /dev/nvidia1, hostPath: /dev/zero}]}}
`

func savePlugin(t *testing.T, specDir, state string) *Plugin {
	t.Helper()
	cfg, err := config.Parse([]byte("policy: {exclusive: false}"))
	if err != nil {
		t.Fatal(err)
	}
	log := logrus.New()
	log.SetOutput(io.Discard)
	p, err := New(cfg, log, WithSpecDirs([]string{specDir}), WithStateFile(state))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func pod(name string, ann map[string]string) *api.PodSandbox {
	return &api.PodSandbox{Id: "id-" + name, Name: name, Namespace: "tenant", Annotations: ann}
}

func container(p *api.PodSandbox, devs ...*api.LinuxDevice) *api.Container {
	return &api.Container{Id: p.Name + "-c", PodSandboxId: p.Id, Name: "c", State: api.ContainerState_CONTAINER_RUNNING,
		Annotations: map[string]string{DevicesAnnotation: "x"}, Linux: &api.LinuxContainer{Devices: devs}}
}

// TestKilledSave is not a test by itself: run by TestKilledMidSave as a
// process of its own, it records pod old's GPU 1 and then dies (SIGKILL,
// as the OOM killer or a node's crash would) at the step of the save of
// pod new's GPU 0 named by NRI_GPU_TEST_KILL_AT.
func TestKilledSave(t *testing.T) {
	at := os.Getenv(killedSaveEnv)
	if at == "" {
		t.Skip("run by TestKilledMidSave")
	}
	dir := os.Getenv("NRI_GPU_TEST_DIR")
	p := savePlugin(t, filepath.Join(dir, "cdi"), filepath.Join(dir, "state", "allocations.json"))
	if _, err := p.Synchronize(context.Background(), nil, nil); err != nil {
		t.Fatal(err)
	}
	old := pod("old", map[string]string{"gpus.nri-gpu.io": "1"})
	if _, _, err := p.CreateContainer(context.Background(), old, container(old)); err != nil {
		t.Fatal(err)
	}
	saveStep = func(step string) {
		if step == at {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
	}
	newPod := pod("new", map[string]string{"gpu-count.nri-gpu.io": "1"})
	_, _, err := p.CreateContainer(context.Background(), newPod, container(newPod))
	t.Fatalf("not killed at %q: %v", at, err)
}

// TestKilledMidSave: nri-gpu killed at each step of saving a grant (the
// new file made, written, flushed, about to be renamed, renamed). The
// next nri-gpu starts (the dead one's lock is no obstacle), finds the
// old record whole or the new one whole, removes what the killed save
// left, and never gives a GPU to two pods: pod old keeps GPU 1; GPU 0,
// whose grant the killed nri-gpu never answered, is free if the new
// record was not in place, else held by pod new until it is removed.
func TestKilledMidSave(t *testing.T) {
	for _, s := range saveSteps {
		t.Run(s.step, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.MkdirAll(filepath.Join(dir, "cdi"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "cdi", "gpu.yaml"), []byte(twoGPUs), 0o644); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(os.Args[0], "-test.run=^TestKilledSave$")
			cmd.Env = append(os.Environ(), killedSaveEnv+"="+s.step, "NRI_GPU_TEST_DIR="+dir)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("the saving process: %v, want killed:\n%s", err, out)
			}
			state := filepath.Join(dir, "state", "allocations.json")
			left, _ := filepath.Glob(filepath.Join(dir, "state", ".allocations.json.tmp-*"))
			if want := s.step != "create" && !s.renamed; (len(left) > 0) != want {
				t.Errorf("half-done saves left: %v, want some: %v", left, want)
			}

			p := savePlugin(t, filepath.Join(dir, "cdi"), state)
			if left, _ := filepath.Glob(filepath.Join(dir, "state", ".allocations.json.tmp-*")); len(left) > 0 {
				t.Errorf("left after the next start: %v", left)
			}
			old, newPod := pod("old", nil), pod("new", nil)
			_, err = p.Synchronize(context.Background(), []*api.PodSandbox{old, newPod},
				[]*api.Container{container(old, &api.LinuxDevice{Path: "/dev/nvidia1", Type: "c", Major: 1, Minor: 5})})
			if err != nil {
				t.Fatal(err)
			}
			if p.lost.Load() {
				t.Error("the record was found unusable")
			}
			ask := func(name, gpu string) error {
				other := pod(name, map[string]string{"gpus.nri-gpu.io": gpu})
				_, _, err := p.CreateContainer(context.Background(), other, container(other))
				return err
			}
			// Pod old's GPU 1 is named, so shared (exclusive: false), as
			// the record says: a by-name request for it is given.
			if err := ask("sharer", "1"); err != nil {
				t.Errorf("GPU 1, shared by name: %v", err)
			}
			err = ask("taker", "0")
			if s.renamed {
				if err == nil || !strings.Contains(err.Error(), "held by pod tenant/new") {
					t.Errorf("GPU 0 with the new record in place: %v, want held by pod new", err)
				}
				_ = p.RemovePodSandbox(context.Background(), newPod)
				err = ask("taker", "0")
			}
			if err != nil {
				t.Errorf("GPU 0: %v", err)
			}
		})
	}
}
