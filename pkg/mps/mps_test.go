package mps_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nri-gpu/nri-gpu/internal/mpsstandin"
	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/mps"
)

// TestLimits: a client's limits as the daemon's defaults and in its
// environment; no memory limit where none is known (a claim's whole GPU).
func TestLimits(t *testing.T) {
	where := []string{"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps", "CUDA_MPS_LOG_DIRECTORY=/var/log/nvidia-mps"}
	for _, tc := range []struct {
		name     string
		limits   mps.Limits
		commands []string
		env      []string
	}{
		{"compute and memory", mps.Limits{ActiveThreadPercentage: 25, PinnedMemoryMiB: 20480},
			[]string{"set_default_active_thread_percentage 25", "set_default_device_pinned_mem_limit 0 20480M"},
			[]string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M"}},
		{"compute only", mps.Limits{ActiveThreadPercentage: 100},
			[]string{"set_default_active_thread_percentage 100"},
			[]string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100"}},
	} {
		if got := tc.limits.Commands(); !slices.Equal(got, tc.commands) {
			t.Errorf("%s: commands %q, want %q", tc.name, got, tc.commands)
		}
		edits := mps.Daemon{Dir: "/run/mps/GPU-1"}.ClientEdits(tc.limits)
		if got, want := edits.Env, append(slices.Clone(where), tc.env...); !slices.Equal(got, want) {
			t.Errorf("%s: client env %q, want %q", tc.name, got, want)
		}
		// The daemon's directories where CUDA looks without the
		// environment; its sockets read-only, its shm shared.
		var mounts []string
		for _, m := range edits.Mounts {
			mounts = append(mounts, m.HostPath+" "+m.ContainerPath+" "+m.Type+" "+strings.Join(m.Options, ","))
		}
		if want := []string{
			"/run/mps/GPU-1/pipe /tmp/nvidia-mps bind rbind,nosuid,nodev,ro",
			"/run/mps/GPU-1/log /var/log/nvidia-mps bind rbind,nosuid,nodev,ro",
			"/run/mps/GPU-1/shm /dev/shm bind rbind,nosuid,nodev,rw",
		}; !slices.Equal(mounts, want) {
			t.Errorf("%s: client mounts %q, want %q", tc.name, mounts, want)
		}
	}
}

func TestDirectories(t *testing.T) {
	d := mps.Daemon{Dir: "/run/mps/GPU-1"}
	if d.PipeDir() != "/run/mps/GPU-1/pipe" || d.LogDir() != "/run/mps/GPU-1/log" || d.ShmDir() != "/run/mps/GPU-1/shm" {
		t.Errorf("directories %s %s %s", d.PipeDir(), d.LogDir(), d.ShmDir())
	}
}

// TestLayout: a GPU's daemon is named by its UUID, else its name, one
// path element under the root, and runs the layout's control program
// in its host root.
func TestLayout(t *testing.T) {
	l := mps.Layout{Control: "/usr/bin/nvidia-cuda-mps-control", Root: "/run/nri-gpu/mps", HostRoot: "/host"}
	for _, tc := range []struct {
		uuid, name string
		want       mps.Daemon
		wantErr    bool
	}{
		{uuid: "GPU-1", name: "0", want: mps.Daemon{Control: l.Control, Dir: "/run/nri-gpu/mps/GPU-1", GPU: "GPU-1", Root: "/host"}},
		{name: "0", want: mps.Daemon{Control: l.Control, Dir: "/run/nri-gpu/mps/0", Root: "/host"}},
		{name: "..", wantErr: true},
		{name: ".", wantErr: true},
		{uuid: "a/b", wantErr: true},
		{name: "a\x00b", wantErr: true},
		{wantErr: true},
	} {
		got, err := l.Daemon(tc.uuid, tc.name)
		if tc.wantErr {
			if !errors.Is(err, mps.ErrDaemonDir) {
				t.Errorf("%q, %q: %v, %v; want ErrDaemonDir", tc.uuid, tc.name, got, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%q, %q: %+v, %v; want %+v", tc.uuid, tc.name, got, err, tc.want)
		}
	}
}

// inShm runs the daemon's command with shm as the stand-in's /dev/shm.
var inShm = mps.Start(func(shm string, cmd *exec.Cmd) error {
	cmd.Env = append(cmd.Env, "STANDIN_SHM="+shm)
	return cmd.Run()
})

// TestDaemon starts, asks and stops a daemon (the stand-in for
// nvidia-cuda-mps-control): its GPU in Exclusive_Process while it runs
// and back in the mode it was in once it is stopped, its directories,
// its environment, its limits as defaults (set again, with no second
// daemon, when it is started again), and the errors of one that does
// not run, at once after its stop.
func TestDaemon(t *testing.T) {
	ctl, err := mpsstandin.Build(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, tc := range []struct{ gpu, root string }{{"GPU-1234", ""}, {"", ""}, {"GPU-5678", "/"}} {
		gpu := tc.gpu
		// Root "/": run chrooted into this machine's root, as into a
		// host's mounted in nri-gpu's container.
		gpus := newModes()
		d := mps.Daemon{Control: ctl, Dir: filepath.Join(testutil.ShortDir(t), "gpu"), GPU: gpu, Root: tc.root, Modes: gpus}
		// Whatever the test finds, no daemon outlives it.
		t.Cleanup(func() { _ = mpsstandin.Kill(d.PipeDir()) })
		err := d.Ready(ctx)
		if !errors.Is(err, mps.ErrNotRunning) {
			t.Fatalf("before it starts: %v, want ErrNotRunning", err)
		}
		testutil.ErrorSays(t, err, "pipe directory "+d.PipeDir())
		if err := d.Start(ctx, mps.Limits{ActiveThreadPercentage: 33, PinnedMemoryMiB: 1024}, inShm); err != nil {
			t.Fatal(err)
		}
		if err := d.Ready(ctx); err != nil {
			t.Errorf("started: %v", err)
		}
		if got := gpus.modeOf(gpu); got != mps.ModeExclusive {
			t.Errorf("started: its GPU in %s, want Exclusive_Process", got)
		}
		if got, err := d.Ask(ctx, "get_default_active_thread_percentage"); err != nil || got != "33" {
			t.Errorf("its default thread percentage: %q, %v; want 33", got, err)
		}
		if err := d.Start(ctx, mps.Limits{ActiveThreadPercentage: 40, PinnedMemoryMiB: 1024}, inShm); err != nil {
			t.Fatal(err)
		}
		if got, err := d.Ask(ctx, "get_default_active_thread_percentage"); err != nil || got != "40" {
			t.Errorf("started again: its default thread percentage %q, %v; want 40", got, err)
		}
		log, _ := os.ReadFile(filepath.Join(d.LogDir(), mpsstandin.Log))
		if want := `run args=["-d"] CUDA_VISIBLE_DEVICES="` + gpu + `"`; strings.Count(string(log), want) != 1 {
			t.Errorf("log:\n%s\nwant %s once", log, want)
		}
		if !strings.Contains(string(log), "command set_default_device_pinned_mem_limit 0 1024M") {
			t.Errorf("the memory limit was not set:\n%s", log)
		}
		if got, _ := os.ReadFile(filepath.Join(d.ShmDir(), mpsstandin.Started)); string(got) != d.PipeDir() {
			t.Errorf("started with /dev/shm other than its shm directory: %q", got)
		}
		if fi, err := os.Stat(d.ShmDir()); err != nil || fi.Mode().Perm() != 0o777 || fi.Mode()&os.ModeSticky == 0 {
			t.Errorf("shm directory mode %v, %v; want sticky and open to every client", fi.Mode(), err)
		}
		for _, dir := range []string{d.PipeDir(), d.LogDir()} {
			if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o755 {
				t.Errorf("%s: mode %v, %v; want 0755 (clients of any user reach it; only root writes it)", dir, fi.Mode(), err)
			}
		}
		if err := d.Stop(ctx, mps.ModeDefault); err != nil {
			t.Fatal(err)
		}
		if err := d.Ready(ctx); !errors.Is(err, mps.ErrNotRunning) {
			t.Errorf("stopped: %v, want ErrNotRunning", err)
		}
		if got := gpus.modeOf(gpu); got != mps.ModeDefault {
			t.Errorf("stopped: its GPU in %s, want Default", got)
		}
		_, err = d.Ask(ctx, "quit")
		testutil.ErrorSays(t, err, `"quit"`, "Cannot find MPS control daemon process")
	}
}

// TestControlChrooted: the control program runs chrooted into Root (a
// host's root, where its path is): under a root that lacks it, it cannot
// run, though this machine has it.
func TestControlChrooted(t *testing.T) {
	ctl, err := mpsstandin.Build(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	d := mps.Daemon{Control: ctl, Dir: t.TempDir(), Root: t.TempDir()}
	if err := os.Mkdir(d.PipeDir(), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err = d.Ask(context.Background(), "get_default_active_thread_percentage")
	testutil.ErrorSays(t, err, ctl, "no such file or directory")
}

// TestStartFails: a daemon that cannot start, or cannot take its limits,
// is an error naming its directory; one whose GPU is not put in
// Exclusive_Process is not started, the error naming the GPU.
func TestStartFails(t *testing.T) {
	ctl, err := mpsstandin.Build(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	d := mps.Daemon{Control: ctl, Dir: filepath.Join(testutil.ShortDir(t), "gpu")}
	t.Cleanup(func() { _ = mpsstandin.Kill(d.PipeDir()) })
	err = d.Start(ctx, mps.Limits{ActiveThreadPercentage: 50, PinnedMemoryMiB: 1}, mps.Start(func(string, *exec.Cmd) error { return errors.New("no namespace") }))
	testutil.ErrorSays(t, err, "starting "+ctl+" -d for "+d.Dir, "no namespace")
	// Started, but gone before its limits are set.
	err = d.Start(ctx, mps.Limits{ActiveThreadPercentage: 50, PinnedMemoryMiB: 1}, mps.Start(func(shm string, cmd *exec.Cmd) error {
		if err := inShm(shm, cmd); err != nil {
			return err
		}
		return mpsstandin.Kill(d.PipeDir())
	}))
	testutil.ErrorSays(t, err, "MPS daemon of "+d.Dir, "set_default_active_thread_percentage 50")
	blocked := mps.Daemon{Control: ctl, Dir: filepath.Join(t.TempDir(), "file")}
	if err := os.WriteFile(blocked.Dir, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	testutil.ErrorSays(t, blocked.Start(ctx, mps.Limits{}, inShm), "MPS daemon of "+blocked.Dir)

	refusing := newModes()
	refusing.err = errors.New("NVML: ERROR_NO_PERMISSION")
	d.GPU, d.Modes = "GPU-1234", refusing
	err = d.Start(ctx, mps.Limits{ActiveThreadPercentage: 50}, inShm)
	if !errors.Is(err, mps.ErrNotExclusive) {
		t.Errorf("its GPU's mode refused: %v, want ErrNotExclusive", err)
	}
	testutil.ErrorSays(t, err, "GPU GPU-1234", "ERROR_NO_PERMISSION")
	if err := d.Ready(ctx); !errors.Is(err, mps.ErrNotRunning) {
		t.Errorf("its GPU's mode refused: the daemon %v, want none running", err)
	}
}

// TestStopCannotQuit: a daemon that cannot be told to quit (its control
// program gone) is an error, and its GPU stays in Exclusive_Process
// while it runs; once it can, it is stopped and the GPU put back.
func TestStopCannotQuit(t *testing.T) {
	ctl, err := mpsstandin.Build(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	gpus := newModes()
	d := mps.Daemon{Control: ctl, Dir: filepath.Join(testutil.ShortDir(t), "gpu"), GPU: "GPU-1234", Modes: gpus}
	t.Cleanup(func() { _ = mpsstandin.Kill(d.PipeDir()) })
	if err := d.Start(ctx, mps.Limits{ActiveThreadPercentage: 50}, inShm); err != nil {
		t.Fatal(err)
	}
	hidden := ctl + ".hidden"
	if err := os.Rename(ctl, hidden); err != nil {
		t.Fatal(err)
	}
	testutil.ErrorSays(t, d.Stop(ctx, mps.ModeDefault), `"quit"`)
	if got := gpus.modeOf("GPU-1234"); got != mps.ModeExclusive || d.Ready(ctx) != nil {
		t.Errorf("not stopped: GPU in %s, daemon %v; want Exclusive_Process and running", got, d.Ready(ctx))
	}
	if err := os.Rename(hidden, ctl); err != nil {
		t.Fatal(err)
	}
	if err := d.Stop(ctx, mps.ModeDefault); err != nil || gpus.modeOf("GPU-1234") != mps.ModeDefault || d.Ready(ctx) == nil {
		t.Errorf("stopped: %v, GPU in %s, daemon %v; want Default and none", err, gpus.modeOf("GPU-1234"), d.Ready(ctx))
	}
}
