package mps_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"golang.org/x/sys/unix"

	"github.com/nri-gpu/nri-gpu/internal/mpsstandin"
	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/mps"
)

// asPID1 makes the test process what nri-gpu is in its container for
// the daemons it starts: the process they are reparented to when their
// starter exits (PID 1 there; a child subreaper here), which must reap
// them.
func asPID1(t *testing.T) {
	t.Helper()
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Skipf("cannot become a child subreaper: %v", err)
	}
	t.Cleanup(func() { _ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0) })
}

// whats returns what the manager did to daemons (not to compute modes).
func whats(events []mps.Event) []string {
	var out []string
	for _, e := range events {
		if e.What != mps.Exclusive && e.What != mps.Restored {
			out = append(out, e.What+" "+e.Device)
		}
	}
	return out
}

// modesDone returns what the manager did to compute modes.
func modesDone(events []mps.Event) []string {
	var out []string
	for _, e := range events {
		if e.What == mps.Exclusive || e.What == mps.Restored {
			out = append(out, e.What+" "+e.Device+" "+e.Was)
		}
	}
	return out
}

// gpusOf returns NVML (go-nvml's mock) knowing a GPU by each of uuids,
// each in the Default compute mode until set, and those GPUs by UUID.
func gpusOf(uuids ...string) (func() nvml.Interface, map[string]nvml.Device) {
	s := testutil.NVML(len(uuids))
	byUUID := map[string]nvml.Device{}
	for i, u := range uuids {
		byUUID[u] = s.Devices[i]
	}
	s.DeviceGetHandleByUUIDFunc = func(u string) (nvml.Device, nvml.Return) {
		if d, ok := byUUID[u]; ok {
			return d, nvml.SUCCESS
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
	return func() nvml.Interface { return s }, byUUID
}

// mode returns a GPU's compute mode.
func mode(d nvml.Device) nvml.ComputeMode {
	m, _ := d.GetComputeMode()
	return m
}

// gone reports whether process pid has left no trace: neither running
// nor a zombie.
func gone(pid int) bool {
	_, err := os.Stat(fmt.Sprintf("/proc/%d", pid))
	return os.IsNotExist(err)
}

// managed returns a daemon of the stand-in control program for GPU 0,
// wanted with limits, and a manager to keep it, as nri-gpu is (PID 1 of
// its container) for the daemons it starts; the daemon is killed when
// the test ends.
func managed(t *testing.T) (mps.Daemon, mps.Want, *mps.Manager) {
	t.Helper()
	asPID1(t)
	ctl, err := mpsstandin.Build(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	d := mps.Daemon{Control: ctl, Dir: filepath.Join(testutil.ShortDir(t), "gpu"), GPU: "GPU-1234"}
	t.Cleanup(func() { _ = mpsstandin.Kill(d.PipeDir()) })
	want := mps.Want{Device: "nvidia.com/gpu=0", Daemon: d, Limits: mps.Limits{ActiveThreadPercentage: 50, PinnedMemoryMiB: 1024}}
	lib, _ := gpusOf("GPU-1234")
	return d, want, mps.NewManager(inShm, lib)
}

// TestManager: told a daemon is wanted, the manager starts it with its
// limits; a daemon that dies is started again, the dead one reaped (not
// left a zombie of the process it was reparented to, as nri-gpu is PID 1
// in its container); found running with other limits, they are set
// again; no longer wanted, it is stopped and reaped.
func TestManager(t *testing.T) {
	ctx := context.Background()
	d, want, m := managed(t)

	events, errs := m.Sync(ctx, []mps.Want{want})
	if len(errs) > 0 || !slices.Equal(whats(events), []string{"started nvidia.com/gpu=0"}) {
		t.Fatalf("first sync: %v, %v; want started", whats(events), errs)
	}
	if got := modesDone(events); !slices.Equal(got, []string{"exclusive nvidia.com/gpu=0 Default"}) {
		t.Errorf("first sync's compute modes: %v, want the GPU put in Exclusive_Process from Default", got)
	}
	first, err := mpsstandin.Pid(d.PipeDir())
	if err != nil {
		t.Fatal(err)
	}
	if events, errs := m.Sync(ctx, []mps.Want{want}); len(events) > 0 || len(errs) > 0 {
		t.Errorf("a sync with nothing to do: %v, %v", whats(events), errs)
	}

	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testutil.Within(t, 5*time.Second, "the killed daemon a zombie of this process, its socket closed", func() bool {
		return mpsstandin.Zombie(first) && d.Running(ctx) != nil
	})
	events, errs = m.Sync(ctx, []mps.Want{want})
	if len(errs) > 0 || !slices.Equal(whats(events), []string{"started nvidia.com/gpu=0"}) {
		t.Fatalf("after the daemon died: %v, %v; want started again", whats(events), errs)
	}
	if !gone(first) {
		t.Errorf("the dead daemon (pid %d) was not reaped", first)
	}
	second, err := mpsstandin.Pid(d.PipeDir())
	if err != nil || second == first {
		t.Fatalf("the new daemon's pid %d, %v", second, err)
	}

	want.Limits.ActiveThreadPercentage = 25
	events, errs = m.Sync(ctx, []mps.Want{want})
	if len(errs) > 0 || !slices.Equal(whats(events), []string{"limits set nvidia.com/gpu=0"}) {
		t.Errorf("new limits: %v, %v; want them set", whats(events), errs)
	}
	if got, err := d.Ask(ctx, "get_default_active_thread_percentage"); err != nil || got != "25" {
		t.Errorf("the daemon's default thread percentage %q, %v; want 25", got, err)
	}

	events, errs = m.Sync(ctx, nil)
	if len(errs) > 0 || !slices.Equal(whats(events), []string{"stopped nvidia.com/gpu=0"}) {
		t.Fatalf("no longer wanted: %v, %v; want stopped", whats(events), errs)
	}
	if got := modesDone(events); !slices.Equal(got, []string{"restored nvidia.com/gpu=0 "}) {
		t.Errorf("stopped: compute modes %v, want the GPU back in Default", got)
	}
	if !gone(second) {
		t.Errorf("the stopped daemon (pid %d) was not reaped", second)
	}
	if err := d.Running(ctx); err == nil {
		t.Error("the stopped daemon still answers")
	}
}

// TestManagerCannotStart: a daemon whose GPU has no UUID, or that fails
// to start, is an error naming its device, and nothing is kept (there is
// nothing to stop once it is no longer wanted).
func TestManagerCannotStart(t *testing.T) {
	ctx := context.Background()
	lib, _ := gpusOf("GPU-1")
	m := mps.NewManager(inShm, lib)
	noUUID := mps.Want{Device: "nvidia.com/gpu=1", Daemon: mps.Daemon{Control: "/nonexistent", Dir: filepath.Join(t.TempDir(), "x")}}
	events, errs := m.Sync(ctx, []mps.Want{noUUID})
	if len(events) > 0 || len(errs) != 1 {
		t.Fatalf("%v, %v; want one error", whats(events), errs)
	}
	testutil.ErrorSays(t, errs[0], "MPS daemon of nvidia.com/gpu=1 not started", "its UUID is not known")
	noUUID.Daemon.GPU = "GPU-1"
	events, errs = m.Sync(ctx, []mps.Want{noUUID})
	if len(whats(events)) > 0 || len(errs) != 1 {
		t.Fatalf("%v, %v; want one error", whats(events), errs)
	}
	testutil.ErrorSays(t, errs[0], "MPS daemon of nvidia.com/gpu=1 not started", "/nonexistent")
	// Kept, it would be stopped now that it is no longer wanted; its GPU,
	// put in Exclusive_Process for it, goes back to Default.
	events, errs = m.Sync(ctx, nil)
	if len(whats(events)) > 0 || len(errs) > 0 {
		t.Errorf("a daemon that did not start is kept: %v, %v", whats(events), errs)
	}
	if got := modesDone(events); !slices.Equal(got, []string{"restored nvidia.com/gpu=1 "}) {
		t.Errorf("no longer wanted: compute modes %v, want its GPU back in Default", got)
	}
}

// TestManagerManyDaemons: one daemon's trouble (no UUID, limits that
// cannot be set) is an error of its own, and the daemons wanted after it
// are seen to all the same: started, or kept as they run.
func TestManagerManyDaemons(t *testing.T) {
	asPID1(t)
	ctl, err := mpsstandin.Build(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	root := testutil.ShortDir(t)
	daemon := func(name string) mps.Want {
		d := mps.Daemon{Control: ctl, Dir: filepath.Join(root, name), GPU: "GPU-" + name}
		t.Cleanup(func() { _ = mpsstandin.Kill(d.PipeDir()) })
		return mps.Want{Device: "nvidia.com/gpu=" + name, Daemon: d, Limits: mps.Limits{ActiveThreadPercentage: 50, PinnedMemoryMiB: 1024}}
	}
	a, c, d := daemon("a"), daemon("c"), daemon("d")
	noUUID := mps.Want{Device: "nvidia.com/gpu=b", Daemon: mps.Daemon{Control: ctl, Dir: filepath.Join(root, "b")}}
	cannotStart := mps.Want{Device: "nvidia.com/gpu=e", Daemon: mps.Daemon{Control: "/nonexistent", Dir: filepath.Join(root, "e"), GPU: "GPU-e"}}
	lib, _ := gpusOf("GPU-a", "GPU-c", "GPU-d", "GPU-e")
	m := mps.NewManager(inShm, lib)
	events, errs := m.Sync(ctx, []mps.Want{noUUID, cannotStart, a})
	if len(errs) != 2 || !slices.Equal(whats(events), []string{"started nvidia.com/gpu=a"}) {
		t.Fatalf("no UUID, cannot start, then a: %v, %v; want two errors and a started", whats(events), errs)
	}
	// a runs and is kept as it is; d after it is started.
	events, errs = m.Sync(ctx, []mps.Want{a, d})
	if len(errs) > 0 || !slices.Equal(whats(events), []string{"started nvidia.com/gpu=d"}) {
		t.Errorf("a kept, then d: %v, %v; want d started", whats(events), errs)
	}
	// d no longer wanted, though a (before it) is: d is stopped.
	events, errs = m.Sync(ctx, []mps.Want{a})
	if len(errs) > 0 || !slices.Equal(whats(events), []string{"stopped nvidia.com/gpu=d"}) {
		t.Errorf("a kept, d no longer wanted: %v, %v; want d stopped", whats(events), errs)
	}
	// Another manager finds a running, and cannot set its limits (its
	// control program is gone); c after it is started.
	broken := a
	broken.Daemon.Control = "/nonexistent"
	events, errs = mps.NewManager(inShm, lib).Sync(ctx, []mps.Want{broken, c})
	if len(errs) != 1 || !slices.Equal(whats(events), []string{"started nvidia.com/gpu=c"}) {
		t.Errorf("a's limits not set, then c: %v, %v; want one error and c started", whats(events), errs)
	}
	if len(errs) == 1 {
		testutil.ErrorSays(t, errs[0], "MPS daemon of nvidia.com/gpu=a", "/nonexistent")
	}
}

// TestManagerComputeMode: a daemon's GPU is in Exclusive_Process while
// the manager keeps it, and back in Default once it is stopped; a GPU
// NVML does not put in Exclusive_Process gets no daemon; where NVML
// cannot be loaded the daemon is started all the same, the error saying
// to set the mode.
func TestManagerComputeMode(t *testing.T) {
	ctx := context.Background()
	d, want, _ := managed(t)
	lib, gpus := gpusOf("GPU-1234")
	gpu := gpus["GPU-1234"]
	m := mps.NewManager(inShm, lib)
	if _, errs := m.Sync(ctx, []mps.Want{want}); len(errs) > 0 {
		t.Fatal(errs)
	}
	if mode(gpu) != nvml.COMPUTEMODE_EXCLUSIVE_PROCESS {
		t.Errorf("kept: GPU in mode %d, want Exclusive_Process", mode(gpu))
	}
	if _, errs := m.Sync(ctx, nil); len(errs) > 0 {
		t.Fatal(errs)
	}
	if mode(gpu) != nvml.COMPUTEMODE_DEFAULT {
		t.Errorf("stopped: GPU in mode %d, want Default", mode(gpu))
	}

	// NVML refuses the mode: no daemon.
	refusing, byUUID := gpusOf("GPU-1234")
	byUUID["GPU-1234"].(*dgxa100.Device).SetComputeModeFunc = func(nvml.ComputeMode) nvml.Return { return nvml.ERROR_NO_PERMISSION }
	events, errs := mps.NewManager(inShm, refusing).Sync(ctx, []mps.Want{want})
	if len(events) > 0 || len(errs) != 1 {
		t.Fatalf("mode refused: %v, %v; want one error and nothing done", whats(events), errs)
	}
	testutil.ErrorSays(t, errs[0], "MPS daemon of nvidia.com/gpu=0 not started", "Exclusive_Process", "ERROR_NO_PERMISSION")
	if d.Running(ctx) == nil {
		t.Error("a daemon runs on a GPU not in Exclusive_Process")
	}

	// NVML cannot be loaded: started, and told.
	absent := &dgxa100.Server{}
	absent.InitFunc = func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }
	m = mps.NewManager(inShm, func() nvml.Interface { return absent })
	events, errs = m.Sync(ctx, []mps.Want{want})
	if len(errs) != 1 || !slices.Equal(whats(events), []string{"started nvidia.com/gpu=0"}) {
		t.Fatalf("without NVML: %v, %v; want started and one error", whats(events), errs)
	}
	testutil.ErrorSays(t, errs[0], "compute mode is left as it is", "nvidia-smi -i GPU-1234 -c EXCLUSIVE_PROCESS")
	if _, errs := m.Sync(ctx, nil); len(errs) > 0 {
		t.Errorf("stopping without NVML: %v (the manager did not set the mode, and leaves it)", errs)
	}
}
