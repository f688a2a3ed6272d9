package record

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// The steps of a save, in order: killed before "rename", the old record
// stays; killed at "renamed" (after the rename), the new one is in place.
var saveSteps = []struct {
	step    string
	renamed bool
}{{"create", false}, {"write", false}, {"sync", false}, {"rename", false}, {"renamed", true}}

const killedSaveEnv = "NRI_GPU_TEST_KILL_AT"

// held returns a record in which pod name holds GPU gpu by name.
func held(name, gpu string) policy.Holding {
	return policy.Holding{Pod: policy.Pod{ID: "id-" + name, Namespace: "tenant", Name: name},
		Named: []specs.Device{{Name: "nvidia.com/gpu=" + gpu, Nodes: []string{"c 195:" + gpu}}}}
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
	f := Open(os.Getenv("NRI_GPU_TEST_PATH"))
	if err := f.Lock(); err != nil {
		t.Fatal(err)
	}
	old := Content{Pods: []policy.Holding{held("old", "1")}}
	if err := f.Save(func() Content { return old }); err != nil {
		t.Fatal(err)
	}
	f.step = func(step string) {
		if step == at {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
	}
	err := f.Save(func() Content { return Content{Pods: append(old.Pods, held("new", "0"))} })
	t.Fatalf("not killed at %q: %v", at, err)
}

// TestKilledMidSave: nri-gpu killed at each step of saving a grant (the
// new file made, written, flushed, about to be renamed, renamed). The
// next nri-gpu locks the record (the dead one's lock is no obstacle),
// which removes what the killed save left, and reads the old record
// whole or the new one whole: pod old's GPU 1 in both, pod new's GPU 0
// only once the new one was renamed into place. (Moved here from
// pkg/plugin, where the same kill went through a whole grant: the plugin
// restores what Load returns.)
func TestKilledMidSave(t *testing.T) {
	for _, s := range saveSteps {
		t.Run(s.step, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "state", "allocations.json")
			cmd := exec.Command(os.Args[0], "-test.run=^TestKilledSave$")
			cmd.Env = append(os.Environ(), killedSaveEnv+"="+s.step, "NRI_GPU_TEST_PATH="+path)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("the saving process: %v, want killed:\n%s", err, out)
			}
			left, _ := filepath.Glob(filepath.Join(dir, "state", ".allocations.json.tmp-*"))
			if want := s.step != "create" && !s.renamed; (len(left) > 0) != want {
				t.Errorf("half-done saves left: %v, want some: %v", left, want)
			}

			f := Open(path)
			if err := f.Lock(); err != nil {
				t.Fatalf("the next nri-gpu: %v", err)
			}
			defer f.Unlock()
			if left, _ := filepath.Glob(filepath.Join(dir, "state", ".allocations.json.tmp-*")); len(left) > 0 {
				t.Errorf("left after the next start: %v", left)
			}
			got, err := f.Load()
			if err != nil {
				t.Fatalf("the record after the kill: %v", err)
			}
			var pods []string
			for _, h := range got.Pods {
				pods = append(pods, h.Pod.Name+":"+h.Named[0].Name)
			}
			want := []string{"old:nvidia.com/gpu=1"}
			if s.renamed {
				want = append(want, "new:nvidia.com/gpu=0")
			}
			if len(pods) != len(want) || pods[0] != want[0] || (s.renamed && pods[1] != want[1]) {
				t.Errorf("the record holds %v, want %v", pods, want)
			}
		})
	}
}
