package e2e

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/nri-gpu/nri-gpu/test/harness"
)

// TestRebuiltRecord: on real containerd with policy.exclusive off, pod a
// gets GPU 0 for a count request; nri-gpu is killed and its state file
// cut short, as a crash mid-write on a disk without ordering would. The
// next nri-gpu keeps the damaged file beside a new record and judges pod
// a's running container as a new one: it asks for a count and has GPU 0,
// so GPU 0 stays pod a's alone (a count grant): a pod asking it by name is
// refused, pod a's next container gets it.
func TestRebuiltRecord(t *testing.T) {
	needEnv(t)
	ctd := extraContainerd(t, "ctd-rebuilt", harness.Options{})
	p := startPlugin(t, ctd, "exclusive: false")
	podID, pod := newPod(t, ctd, map[string]string{"gpu-count.nri-gpu.io": "1"})
	if _, spec := runContainer(t, ctd, podID, pod, harness.Container{Name: "first"}); !slices.Equal(gpuNodes(spec), []string{"/dev/nvidia0"}) {
		t.Fatalf("pod a got %v, want GPU 0", gpuNodes(spec))
	}
	p.Kill()
	state := harness.StateFile(ctd.Dir, "nri-gpu")
	before, _ := filepath.Glob(state + ".damaged-*")
	good, err := os.ReadFile(state)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(state, good[:len(good)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	p = startPlugin(t, ctd, "exclusive: false")

	otherID, other := newPod(t, ctd, map[string]string{"gpus.nri-gpu.io": "0"})
	createFailsOn(t, ctd, otherID, other, harness.Container{Name: "c"}, "held by pod e2e/"+pod.Name, "count request")
	if _, spec := runContainer(t, ctd, podID, pod, harness.Container{Name: "second"}); !slices.Equal(gpuNodes(spec), []string{"/dev/nvidia0"}) {
		t.Errorf("pod a's next container got %v, want GPU 0", gpuNodes(spec))
	}
	aside, _ := filepath.Glob(state + ".damaged-*")
	if len(aside) != len(before)+1 {
		t.Errorf("damaged records kept: %v, want one more than %v", aside, before)
	}
	if !strings.Contains(p.Log(), "the record of what pods hold is unusable") {
		t.Errorf("the log does not say the record was unusable:\n%s", p.Log())
	}
}

// TestFullDisk: nri-gpu's state file on a filesystem that is full (a 64
// KiB tmpfs filled by another file). A GPU pod's creation fails naming
// the state file and "no space left on device", nothing is injected and
// nothing held (a second pod is refused for the same reason, not as
// held); a pod asking for no GPU runs. Emptied, the next grant is given.
func TestFullDisk(t *testing.T) {
	needEnv(t)
	ctd := extraContainerd(t, "ctd-full", harness.Options{})
	disk, err := os.MkdirTemp(ctd.Dir, "small-")
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", disk, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, "size=64k,mode=0700"); err != nil {
		t.Fatalf("a small tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(disk, syscall.MNT_DETACH) })
	config := filepath.Join(ctd.Dir, "nri-gpu.yaml")
	if err := os.WriteFile(config, []byte(env.host.PluginConfig(nil, "exclusive: true")), 0o644); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(disk, "allocations.json")
	if _, err := ctd.StartPlugin("--config", config, "--state-file", state); err != nil {
		t.Fatal(err)
	}
	filler := filepath.Join(disk, "filler")
	fill(t, filler)

	for range 2 {
		podID, pod := newPod(t, ctd, map[string]string{"gpus.nri-gpu.io": "1"})
		createFailsOn(t, ctd, podID, pod, harness.Container{Name: "c"}, "devices not given", "could not be recorded", "state file "+state, "no space left on device")
	}
	plainID, plain := newPod(t, ctd, nil)
	if _, spec := runContainer(t, ctd, plainID, plain, harness.Container{Name: "plain"}); len(gpuNodes(spec)) != 0 {
		t.Errorf("a pod asking for nothing got %v", gpuNodes(spec))
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	podID, pod := newPod(t, ctd, map[string]string{"gpus.nri-gpu.io": "1"})
	if _, spec := runContainer(t, ctd, podID, pod, harness.Container{Name: "c"}); !slices.Equal(gpuNodes(spec), []string{"/dev/nvidia1"}) {
		t.Errorf("once the disk has room: %v, want GPU 1", gpuNodes(spec))
	}
	if data, err := os.ReadFile(state); err != nil || !strings.Contains(string(data), pod.Name) {
		t.Errorf("the record once the disk has room: %s, %v; want pod %s", data, err, pod.Name)
	}
}

// fill writes a file until its filesystem is full.
func fill(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	block := make([]byte, 4096)
	for {
		if _, err := f.Write(block); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			return
		}
	}
}

// TestSecondPluginOnOneStateFile: a second nri-gpu given the state file
// of the one serving exits non-zero naming the file and the first's pid;
// the first keeps serving.
func TestSecondPluginOnOneStateFile(t *testing.T) {
	needEnv(t)
	_, err := env.ctd.StartPlugin("--config", env.config, "--idx", "91")
	if err == nil {
		t.Fatal("a second nri-gpu on the first's state file started")
	}
	for _, want := range []string{"nri-gpu exited: exit status", harness.StateFile(env.ctd.Dir, "nri-gpu"), "in use by another nri-gpu", "pid " + strconv.Itoa(env.nri.Pid())} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the second nri-gpu's failure does not say %q:\n%v", want, err)
		}
	}
	podID, pod := newPod(t, env.ctd, map[string]string{"gpus.nri-gpu.io": "2"})
	if _, spec := runContainer(t, env.ctd, podID, pod, harness.Container{Name: "c"}); !slices.Equal(gpuNodes(spec), []string{"/dev/nvidia2"}) {
		t.Errorf("the first nri-gpu, after the second was refused: %v, want GPU 2", gpuNodes(spec))
	}
}
