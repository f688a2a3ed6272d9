package mps_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nri-gpu/nri-gpu/internal/mpsstandin"
	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/mps"
)

// fileJournal is an mps.Journal in a JSON file, as nri-gpu's record
// keeps it: what one process keeps, another reads. refuse, when it
// returns an error for the entries, has Keep refuse them; block, when it
// returns true, has Keep write them and then never return (the process
// is killed there).
type fileJournal struct {
	path   string
	mu     sync.Mutex
	refuse func([]mps.Entry) error
	block  func([]mps.Entry) bool
}

func (j *fileJournal) Entries() []mps.Entry {
	data, err := os.ReadFile(j.path)
	if err != nil {
		return nil
	}
	var out []mps.Entry
	_ = json.Unmarshal(data, &out)
	return out
}

func (j *fileJournal) Keep(entries []mps.Entry) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.refuse != nil {
		if err := j.refuse(entries); err != nil {
			return err
		}
	}
	data, err := json.Marshal(entries)
	if err != nil {
		return err
	}
	if err := os.WriteFile(j.path, data, 0o600); err != nil {
		return err
	}
	if j.block != nil && j.block(entries) {
		reached()
		select {}
	}
	return nil
}

// fileModes is an mps.Modes whose GPUs' modes are files in a directory
// (none: Default), so that what one process set another reads; block,
// when it returns true for a mode set, has Set set it and never return.
type fileModes struct {
	dir   string
	block func(mode string) bool
}

func (m fileModes) Mode(uuid string) (string, error) {
	b, err := os.ReadFile(filepath.Join(m.dir, uuid))
	if os.IsNotExist(err) {
		return mps.ModeDefault, nil
	}
	return string(b), err
}

func (m fileModes) Set(uuid, mode string) error {
	if err := os.WriteFile(filepath.Join(m.dir, uuid), []byte(mode), 0o600); err != nil {
		return err
	}
	if m.block != nil && m.block(mode) {
		reached()
		select {}
	}
	return nil
}

// The environment of a child process of TestKilledBetweenSteps: the
// step to be killed at, and where its journal, modes and daemon are.
const (
	childStep    = "MPS_TEST_KILLED_AT"
	childJournal = "MPS_TEST_JOURNAL"
	childModes   = "MPS_TEST_MODES"
	childControl = "MPS_TEST_CONTROL"
	childDir     = "MPS_TEST_DIR"
	childReached = "MPS_TEST_REACHED"
)

// reached tells the parent process that the child is at its step.
func reached() { _ = os.WriteFile(os.Getenv(childReached), nil, 0o600) }

// wantOf is the daemon of GPU-1234 in dir, run by the control program.
func wantOf(control, dir string) mps.Want {
	return mps.Want{Device: "nvidia.com/gpu=0", Daemon: mps.Daemon{Control: control, Dir: dir, GPU: "GPU-1234"},
		Limits: mps.Limits{ActiveThreadPercentage: 50, PinnedMemoryMiB: 1024}}
}

// runChild is the child of TestKilledBetweenSteps: a manager that
// starts the daemon (or, at "stopping", stops the one its journal says
// is running) and is stopped at its step, never to return.
func runChild() {
	step := os.Getenv(childStep)
	j := &fileJournal{path: os.Getenv(childJournal), block: func(es []mps.Entry) bool {
		return slices.ContainsFunc(es, func(e mps.Entry) bool { return e.State == step })
	}}
	modes := fileModes{dir: os.Getenv(childModes), block: func(mode string) bool { return step == "mode set" && mode == mps.ModeExclusive }}
	start := inShm
	if step == "daemon started" {
		start = func(shm string, cmd *exec.Cmd) error {
			if err := inShm(shm, cmd); err != nil {
				return err
			}
			reached()
			select {}
		}
	}
	want := []mps.Want{wantOf(os.Getenv(childControl), os.Getenv(childDir))}
	if step == mps.Stopping {
		want = nil
	}
	_, errs := mps.NewManager(start, modes, j).Sync(context.Background(), want)
	fmt.Fprintln(os.Stderr, "the child was not stopped at its step:", errs)
	os.Exit(2)
}

// TestKilledBetweenSteps: nri-gpu killed at each step of a daemon's
// start or stop (its entry kept as starting; its GPU put in
// Exclusive_Process; the daemon started, not yet kept as running; kept
// as stopping): the next manager, in another process, reading the same
// journal, leaves no daemon running that it does not keep and no GPU in
// a mode no daemon needs, and keeps nothing.
func TestKilledBetweenSteps(t *testing.T) {
	asPID1(t)
	ctl, err := mpsstandin.Build(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []string{mps.Starting, "mode set", "daemon started", mps.Stopping} {
		t.Run(step, func(t *testing.T) {
			state := t.TempDir()
			dir := filepath.Join(testutil.ShortDir(t), "gpu")
			d := wantOf(ctl, dir).Daemon
			t.Cleanup(func() { _ = mpsstandin.Kill(d.PipeDir()) })
			j := &fileJournal{path: filepath.Join(state, "journal.json")}
			modes := fileModes{dir: state}
			if step == mps.Stopping {
				// Running, kept by a manager before the child.
				if _, errs := mps.NewManager(inShm, modes, j).Sync(context.Background(), []mps.Want{wantOf(ctl, dir)}); len(errs) > 0 {
					t.Fatal(errs)
				}
			}
			marker := filepath.Join(state, "reached")
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), childStep+"="+step, childJournal+"="+j.path, childModes+"="+state,
				childControl+"="+ctl, childDir+"="+dir, childReached+"="+marker)
			var out strings.Builder
			cmd.Stderr = &out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			testutil.Within(t, 10*time.Second, "the child at "+step, func() bool {
				select {
				case err := <-done:
					t.Fatalf("the child ended (%v): %s", err, out.String())
				default:
				}
				_, err := os.Stat(marker)
				return err == nil
			})
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			<-done

			// The next nri-gpu: the daemon is no longer wanted.
			events, errs := mps.NewManager(inShm, modes, j).Sync(context.Background(), nil)
			if len(errs) > 0 {
				t.Errorf("the next manager: %v", errs)
			}
			if err := d.Ready(context.Background()); !errors.Is(err, mps.ErrNotRunning) {
				t.Errorf("after %v, the daemon: %v, want none running", whats(events), err)
			}
			if mode, _ := modes.Mode("GPU-1234"); mode != mps.ModeDefault {
				t.Errorf("the GPU left in %s, want Default", mode)
			}
			if kept := j.Entries(); len(kept) > 0 {
				t.Errorf("still kept: %+v", kept)
			}
		})
	}
}

// TestJournalEachStepFails: each step of a start failing in turn (the
// starting entry not kept; the daemon not started; the running entry
// not kept), and a start with an expired context, leave no daemon, the
// GPU in Default and nothing kept; a stop that fails (the control
// program gone) keeps the daemon as stopping, its GPU in
// Exclusive_Process, and the next sync, once it can, stops it and puts
// the GPU back.
func TestJournalEachStepFails(t *testing.T) {
	asPID1(t)
	ctl, err := mpsstandin.Build(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	refused := errors.New("the disk is full")
	inState := func(state string) func([]mps.Entry) error {
		return func(es []mps.Entry) error {
			if slices.ContainsFunc(es, func(e mps.Entry) bool { return e.State == state }) {
				return refused
			}
			return nil
		}
	}
	for _, tc := range []struct {
		name    string
		refuse  func([]mps.Entry) error
		start   mps.Start
		expired bool
		want    string
	}{
		{name: "the starting entry not kept", refuse: inState(mps.Starting), want: "could not be recorded: the disk is full"},
		{name: "the daemon does not start", start: func(string, *exec.Cmd) error { return errors.New("exec refused") }, want: "exec refused"},
		{name: "the running entry not kept", refuse: inState(mps.Running), want: "started, but its start or stop could not be recorded"},
		{name: "an expired context", expired: true, want: "context canceled"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			state := t.TempDir()
			w := wantOf(ctl, filepath.Join(testutil.ShortDir(t), "gpu"))
			t.Cleanup(func() { _ = mpsstandin.Kill(w.Daemon.PipeDir()) })
			j := &fileJournal{path: filepath.Join(state, "journal.json"), refuse: tc.refuse}
			modes := fileModes{dir: state}
			start := inShm
			if tc.start != nil {
				start = tc.start
			}
			ctx := context.Background()
			if tc.expired {
				c, cancel := context.WithCancel(ctx)
				cancel()
				ctx = c
			}
			_, errs := mps.NewManager(start, modes, j).Sync(ctx, []mps.Want{w})
			testutil.ErrorSays(t, errors.Join(errs...), tc.want)
			if err := w.Daemon.Ready(context.Background()); !errors.Is(err, mps.ErrNotRunning) {
				t.Errorf("the daemon: %v, want none running", err)
			}
			if mode, _ := modes.Mode("GPU-1234"); mode != mps.ModeDefault {
				t.Errorf("the GPU left in %s, want Default", mode)
			}
			if kept := j.Entries(); len(kept) > 0 {
				t.Errorf("still kept: %+v", kept)
			}
		})
	}

	t.Run("a stop that fails", func(t *testing.T) {
		state := t.TempDir()
		w := wantOf(ctl, filepath.Join(testutil.ShortDir(t), "gpu"))
		t.Cleanup(func() { _ = mpsstandin.Kill(w.Daemon.PipeDir()) })
		j := &fileJournal{path: filepath.Join(state, "journal.json")}
		modes := fileModes{dir: state}
		m := mps.NewManager(inShm, modes, j)
		if _, errs := m.Sync(context.Background(), []mps.Want{w}); len(errs) > 0 {
			t.Fatal(errs)
		}
		// The control program is gone: the daemon cannot be told to quit.
		hidden := ctl + ".hidden"
		if err := os.Rename(ctl, hidden); err != nil {
			t.Fatal(err)
		}
		_, errs := m.Sync(context.Background(), nil)
		testutil.ErrorSays(t, errors.Join(errs...), "stopping the MPS daemon of nvidia.com/gpu=0", "tried again")
		kept := j.Entries()
		if len(kept) != 1 || kept[0].State != mps.Stopping {
			t.Errorf("kept %+v, want the daemon stopping", kept)
		}
		if mode, _ := modes.Mode("GPU-1234"); mode != mps.ModeExclusive {
			t.Errorf("the GPU in %s while its daemon runs, want Exclusive_Process", mode)
		}
		if err := os.Rename(hidden, ctl); err != nil {
			t.Fatal(err)
		}
		events, errs := m.Sync(context.Background(), nil)
		if len(errs) > 0 || !slices.Equal(whats(events), []string{"stopped nvidia.com/gpu=0"}) {
			t.Errorf("tried again: %v, %v; want it stopped", whats(events), errs)
		}
		if mode, _ := modes.Mode("GPU-1234"); mode != mps.ModeDefault || len(j.Entries()) > 0 || w.Daemon.Ready(context.Background()) == nil {
			t.Errorf("after the stop: GPU in %s, kept %+v; want Default, nothing", mode, j.Entries())
		}
	})
}

// TestNextManagerKeepsRunning: a daemon the journal says is running,
// still wanted, is kept by the next manager as it runs (not rolled back,
// not started again), its limits set again; one that died since, no
// longer wanted, is not said to be stopped, and its GPU is put back.
func TestNextManagerKeepsRunning(t *testing.T) {
	asPID1(t)
	ctl, err := mpsstandin.Build(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	state := t.TempDir()
	w := wantOf(ctl, filepath.Join(testutil.ShortDir(t), "gpu"))
	t.Cleanup(func() { _ = mpsstandin.Kill(w.Daemon.PipeDir()) })
	j := &fileJournal{path: filepath.Join(state, "journal.json")}
	modes := fileModes{dir: state}
	if _, errs := mps.NewManager(inShm, modes, j).Sync(ctx, []mps.Want{w}); len(errs) > 0 {
		t.Fatal(errs)
	}
	first, err := mpsstandin.Pid(w.Daemon.PipeDir())
	if err != nil {
		t.Fatal(err)
	}

	next := mps.NewManager(inShm, modes, j)
	events, errs := next.Sync(ctx, []mps.Want{w})
	if len(errs) > 0 || !slices.Equal(whats(events), []string{"limits set nvidia.com/gpu=0"}) {
		t.Errorf("the next manager: %v, %v; want the daemon kept, its limits set again", whats(events), errs)
	}
	if pid, err := mpsstandin.Pid(w.Daemon.PipeDir()); err != nil || pid != first {
		t.Errorf("the daemon's pid %d, %v; want %d, kept as it runs", pid, err, first)
	}

	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testutil.Within(t, 5*time.Second, "the killed daemon's socket closed", func() bool { return w.Daemon.Ready(ctx) != nil })
	events, errs = next.Sync(ctx, nil)
	if len(errs) > 0 || len(whats(events)) > 0 || !slices.Equal(modesDone(events), []string{"restored nvidia.com/gpu=0 Default"}) {
		t.Errorf("died, then no longer wanted: %v, %v, modes %v; want nothing said of the daemon, its GPU put back", whats(events), errs, modesDone(events))
	}
	if mode, _ := modes.Mode("GPU-1234"); mode != mps.ModeDefault || len(j.Entries()) > 0 {
		t.Errorf("GPU in %s, kept %+v; want Default, nothing", mode, j.Entries())
	}
}
