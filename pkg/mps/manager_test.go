package mps_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

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

// modes is a fake mps.Modes: each GPU's compute mode by UUID (none
// set: Default), and the error Set returns where err is set (for the GPU
// of UUID only, where it is set too); with noModes, no mode can be read
// or set (ErrNoModes).
type modes struct {
	mu      sync.Mutex
	mode    map[string]string
	err     error
	only    string
	noModes bool
}

var _ mps.Modes = (*modes)(nil)

func newModes() *modes { return &modes{mode: map[string]string{}} }

func (m *modes) Mode(uuid string) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.noModes {
		return "", fmt.Errorf("%w: NVML: ERROR_LIBRARY_NOT_FOUND", mps.ErrNoModes)
	}
	return m.of(uuid), nil
}

func (m *modes) Set(uuid, mode string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.noModes {
		return fmt.Errorf("%w: NVML: ERROR_LIBRARY_NOT_FOUND", mps.ErrNoModes)
	}
	if m.err != nil && (m.only == "" || m.only == uuid) {
		return m.err
	}
	m.mode[uuid] = mode
	return nil
}

// of returns the GPU's mode, under m.mu.
func (m *modes) of(uuid string) string {
	if mode, ok := m.mode[uuid]; ok {
		return mode
	}
	return "Default"
}

// modeOf returns the GPU's mode.
func (m *modes) modeOf(uuid string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.of(uuid)
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
	return d, want, mps.NewManager(inShm, newModes(), nil)
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
		return mpsstandin.Zombie(first) && d.Ready(ctx) != nil
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
	if got := modesDone(events); !slices.Equal(got, []string{"restored nvidia.com/gpu=0 Default"}) {
		t.Errorf("stopped: compute modes %v, want the GPU back in Default", got)
	}
	if !gone(second) {
		t.Errorf("the stopped daemon (pid %d) was not reaped", second)
	}
	if err := d.Ready(ctx); err == nil {
		t.Error("the stopped daemon still answers")
	}
}

// TestManagerCannotStart: a daemon whose GPU has no UUID, or that fails
// to start, is an error naming its device; a start that failed is
// rolled back at once (its GPU, put in Exclusive_Process for it, back in
// Default), and nothing is kept.
func TestManagerCannotStart(t *testing.T) {
	ctx := context.Background()
	gpus := newModes()
	m := mps.NewManager(inShm, gpus, nil)
	noUUID := mps.Want{Device: "nvidia.com/gpu=1", Daemon: mps.Daemon{Control: "/nonexistent", Dir: filepath.Join(t.TempDir(), "x")}}
	events, errs := m.Sync(ctx, []mps.Want{noUUID})
	if len(events) > 0 || len(errs) != 1 {
		t.Fatalf("%v, %v; want one error", whats(events), errs)
	}
	testutil.ErrorSays(t, errs[0], "MPS daemon of nvidia.com/gpu=1 not started", "its UUID is not known")
	noUUID.Daemon.GPU = "GPU-1"
	events, errs = m.Sync(ctx, []mps.Want{noUUID})
	if !slices.Equal(whats(events), []string{"rolled back nvidia.com/gpu=1"}) || len(errs) != 1 {
		t.Fatalf("%v, %v; want one error, and the start rolled back", whats(events), errs)
	}
	testutil.ErrorSays(t, errs[0], "MPS daemon of nvidia.com/gpu=1 not started", "/nonexistent")
	if got := gpus.modeOf("GPU-1"); got != "Default" {
		t.Errorf("after the failed start, its GPU in %s, want Default", got)
	}
	if got := modesDone(events); len(got) > 0 {
		t.Errorf("a start rolled back is told as %v besides: want its rollback alone", got)
	}
	events, errs = m.Sync(ctx, nil)
	if len(events) > 0 || len(errs) > 0 {
		t.Errorf("a daemon that did not start is kept: %v, %v", whats(events), errs)
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
	gpus := newModes()
	m := mps.NewManager(inShm, gpus, nil)
	events, errs := m.Sync(ctx, []mps.Want{noUUID, cannotStart, a})
	if len(errs) != 2 || !slices.Equal(whats(events), []string{"rolled back nvidia.com/gpu=e", "started nvidia.com/gpu=a"}) {
		t.Fatalf("no UUID, cannot start, then a: %v, %v; want two errors, e's start rolled back and a started", whats(events), errs)
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
	events, errs = mps.NewManager(inShm, gpus, nil).Sync(ctx, []mps.Want{broken, c})
	if len(errs) != 1 || !slices.Equal(whats(events), []string{"started nvidia.com/gpu=c"}) {
		t.Errorf("a's limits not set, then c: %v, %v; want one error and c started", whats(events), errs)
	}
	if len(errs) == 1 {
		testutil.ErrorSays(t, errs[0], "MPS daemon of nvidia.com/gpu=a", "/nonexistent")
	}
	// One GPU's mode refused: its daemon is not started, the next one's
	// is.
	f, g := daemon("f"), daemon("g")
	refusing := newModes()
	refusing.err, refusing.only = errors.New("NVML: ERROR_NO_PERMISSION"), "GPU-f"
	events, errs = mps.NewManager(inShm, refusing, nil).Sync(ctx, []mps.Want{f, g})
	if len(errs) != 1 || !slices.Equal(whats(events), []string{"started nvidia.com/gpu=g"}) {
		t.Errorf("f's mode refused, then g: %v, %v; want one error and g started", whats(events), errs)
	}
}

// TestManagerComputeMode: a daemon's GPU is in Exclusive_Process while
// the manager keeps it, and back in Default once it is stopped; a GPU
// not put in Exclusive_Process gets no daemon; where no mode can be set
// (no NVML) the daemon is started all the same, the error saying to set
// the mode. A daemon found running that no manager kept has its GPU put
// in Exclusive_Process, or is stopped where it cannot be.
func TestManagerComputeMode(t *testing.T) {
	ctx := context.Background()
	d, want, _ := managed(t)
	gpus := newModes()
	m := mps.NewManager(inShm, gpus, nil)
	if _, errs := m.Sync(ctx, []mps.Want{want}); len(errs) > 0 {
		t.Fatal(errs)
	}
	if got := gpus.modeOf("GPU-1234"); got != "Exclusive_Process" {
		t.Errorf("kept: GPU in %s, want Exclusive_Process", got)
	}
	if _, errs := m.Sync(ctx, nil); len(errs) > 0 {
		t.Fatal(errs)
	}
	if got := gpus.modeOf("GPU-1234"); got != "Default" {
		t.Errorf("stopped: GPU in %s, want Default", got)
	}

	// The mode refused: no daemon.
	refusing := newModes()
	refusing.err = errors.New("NVML: ERROR_NO_PERMISSION")
	events, errs := mps.NewManager(inShm, refusing, nil).Sync(ctx, []mps.Want{want})
	if len(events) > 0 || len(errs) != 1 {
		t.Fatalf("mode refused: %v, %v; want one error and nothing done", whats(events), errs)
	}
	testutil.ErrorSays(t, errs[0], "MPS daemon of nvidia.com/gpu=0 not started", "Exclusive_Process", "ERROR_NO_PERMISSION")
	if d.Ready(ctx) == nil {
		t.Error("a daemon runs on a GPU not in Exclusive_Process")
	}

	// No mode can be read or set here: started, and told.
	absent := newModes()
	absent.noModes = true
	m = mps.NewManager(inShm, absent, nil)
	events, errs = m.Sync(ctx, []mps.Want{want})
	if len(errs) != 1 || !slices.Equal(whats(events), []string{"started nvidia.com/gpu=0"}) {
		t.Fatalf("without NVML: %v, %v; want started and one error", whats(events), errs)
	}
	testutil.ErrorSays(t, errs[0], "compute mode is left as it is", "nvidia-smi -i GPU-1234 -c EXCLUSIVE_PROCESS")
	events, errs = m.Sync(ctx, nil)
	if len(errs) > 0 || absent.modeOf("GPU-1234") != "Default" || len(modesDone(events)) > 0 {
		t.Errorf("stopping without NVML: %v, mode %s, modes %v (the manager did not set it, and leaves it, saying nothing of it)", errs, absent.modeOf("GPU-1234"), modesDone(events))
	}

	// Found running, kept by no manager: its GPU put in Exclusive_Process.
	if err := d.Start(ctx, want.Limits, inShm); err != nil {
		t.Fatal(err)
	}
	found := newModes()
	events, errs = mps.NewManager(inShm, found, nil).Sync(ctx, []mps.Want{want})
	if len(errs) > 0 || !slices.Equal(whats(events), []string{"limits set nvidia.com/gpu=0"}) || !slices.Equal(modesDone(events), []string{"exclusive nvidia.com/gpu=0 Default"}) {
		t.Errorf("found running: %v, %v, modes %v; want its limits set and its GPU put in Exclusive_Process", whats(events), errs, modesDone(events))
	}
	if found.modeOf("GPU-1234") != mps.ModeExclusive || d.Ready(ctx) != nil {
		t.Errorf("found running: GPU in %s, daemon %v; want Exclusive_Process and kept", found.modeOf("GPU-1234"), d.Ready(ctx))
	}
	// ... where its GPU's mode is refused: stopped.
	events, errs = mps.NewManager(inShm, refusing, nil).Sync(ctx, []mps.Want{want})
	if len(errs) != 1 || !slices.Equal(whats(events), []string{"stopped nvidia.com/gpu=0"}) {
		t.Fatalf("found running, its mode refused: %v, %v; want one error and it stopped", whats(events), errs)
	}
	testutil.ErrorSays(t, errs[0], "MPS daemon of nvidia.com/gpu=0", "Exclusive_Process", "ERROR_NO_PERMISSION")
	if d.Ready(ctx) == nil {
		t.Error("a daemon found running on a GPU not put in Exclusive_Process still runs")
	}
}
