// Package mps runs and asks NVIDIA's Multi-Process Service control
// daemons: one per GPU shared with MPS, each with its own directories
// (Layout), through the driver's nvidia-cuda-mps-control, started by a
// launcher (InShm: nri-gpu's mps-shm command, chrooted into the host's
// root where nri-gpu runs in a container). A Daemon puts its GPU in
// Exclusive_Process compute mode when it starts and back in the mode it
// was in when it stops (Modes: NVMLModes), and gives a client
// container's edits (mounts and environment) for the Limits that bound
// it. A Manager keeps the daemons it is told are wanted running, every
// step kept in a Journal before it is taken (nri-gpu's record), so that
// a start a crash cut short is rolled back by the next nri-gpu; it says
// whether a daemon is ready for clients (Ready).
//
// The layout under a root directory, per GPU:
//
//	ROOT/GPU/pipe  the daemon's pipes and sockets, its control socket among them (CUDA_MPS_PIPE_DIRECTORY)
//	ROOT/GPU/log   its control.log and server.log (CUDA_MPS_LOG_DIRECTORY)
//	ROOT/GPU/shm   its /dev/shm, which its clients must share
//
// GPU is the GPU's UUID where known, else its name within its CDI kind.
package mps

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nri-gpu/nri-gpu/internal/perm"
)

// ErrNotRunning is wrapped by Ready's error for a daemon that does not
// answer.
var ErrNotRunning = errors.New("MPS control daemon not running")

// Where a client container finds its GPU's daemon: the paths CUDA looks
// at when the environment names none, so that a client that clears its
// environment still reaches the daemon.
const (
	ClientPipeDir = "/tmp/nvidia-mps"
	ClientLogDir  = "/var/log/nvidia-mps"
	ClientShmDir  = "/dev/shm"
)

// askTimeout bounds one question to a daemon.
const askTimeout = 5 * time.Second

// Daemon is the MPS control daemon of one GPU.
type Daemon struct {
	// Control is the driver's nvidia-cuda-mps-control.
	Control string
	// Dir is the GPU's directory under the root.
	Dir string
	// GPU is what CUDA_VISIBLE_DEVICES names the GPU by for the daemon
	// (its UUID); empty leaves the variable unset.
	GPU string
	// Root, when set, is the host's root directory as the caller sees
	// it: Control runs chrooted there (it is a path of the host's, and
	// finds the host's libraries), and Dir is then the same path on the
	// host and here.
	Root string
	// Modes puts the GPU in Exclusive_Process compute mode when the
	// daemon starts, and back when it stops (NVMLModes: through NVML);
	// nil leaves it as it is. A Manager gives each daemon it keeps its
	// own.
	Modes Modes
}

// command returns Control run with args in the daemon's environment,
// chrooted into Root when set.
func (d Daemon) command(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, d.Control, args...)
	cmd.Env = d.env()
	if d.Root != "" {
		cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: d.Root}
	}
	return cmd
}

// PipeDir, LogDir and ShmDir are the daemon's directories on the host.
func (d Daemon) PipeDir() string { return filepath.Join(d.Dir, "pipe") }

// LogDir is where the daemon logs.
func (d Daemon) LogDir() string { return filepath.Join(d.Dir, "log") }

// ShmDir is the directory that is the daemon's /dev/shm, and its
// clients'.
func (d Daemon) ShmDir() string { return filepath.Join(d.Dir, "shm") }

// env is the environment nvidia-cuda-mps-control runs in for this GPU.
func (d Daemon) env() []string {
	env := []string{
		"PATH=" + os.Getenv("PATH"),
		"CUDA_MPS_PIPE_DIRECTORY=" + d.PipeDir(),
		"CUDA_MPS_LOG_DIRECTORY=" + d.LogDir(),
	}
	if d.GPU != "" {
		env = append(env, "CUDA_VISIBLE_DEVICES="+d.GPU)
	}
	return env
}

// Limits bound each client of a daemon.
type Limits struct {
	// ActiveThreadPercentage is the share of the GPU's multiprocessors a
	// client may use, 1 to 100.
	ActiveThreadPercentage int
	// PinnedMemoryMiB is the device memory a client may pin, in MiB; 0
	// leaves it unbounded (a GPU one claim has whole, whose memory is
	// not known).
	PinnedMemoryMiB int64
}

// Env is the client environment that sets the limits, for the GPU the
// client sees as device 0 (the only one its daemon serves).
func (l Limits) Env() []string {
	env := []string{fmt.Sprintf("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=%d", l.ActiveThreadPercentage)}
	if l.PinnedMemoryMiB > 0 {
		env = append(env, fmt.Sprintf("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=%dM", l.PinnedMemoryMiB))
	}
	return env
}

// Commands are the control daemon commands that make the limits every
// client's default: the daemon applies them to clients that set none.
func (l Limits) Commands() []string {
	cmds := []string{fmt.Sprintf("set_default_active_thread_percentage %d", l.ActiveThreadPercentage)}
	if l.PinnedMemoryMiB > 0 {
		cmds = append(cmds, fmt.Sprintf("set_default_device_pinned_mem_limit 0 %dM", l.PinnedMemoryMiB))
	}
	return cmds
}

// ClientEdits returns what a client container of the daemon needs,
// bound by l: its environment (where the daemon is, and the limits) and
// the daemon's directories mounted where CUDA looks when the
// environment names none. The pipe directory is read-only in the
// client: a client only connects to the daemon's sockets (which works on
// a read-only mount) and creates nothing there, so a tenant cannot
// remove or replace the daemon's sockets, or listen there in their
// place, for its own clients or another pod's.
func (d Daemon) ClientEdits(l Limits) *cdispec.ContainerEdits {
	mount := func(host, ctr string, opts ...string) *cdispec.Mount {
		return &cdispec.Mount{HostPath: host, ContainerPath: ctr, Type: "bind", Options: append([]string{"rbind", "nosuid", "nodev"}, opts...)}
	}
	return &cdispec.ContainerEdits{
		Env: append([]string{
			"CUDA_MPS_PIPE_DIRECTORY=" + ClientPipeDir,
			"CUDA_MPS_LOG_DIRECTORY=" + ClientLogDir,
		}, l.Env()...),
		Mounts: []*cdispec.Mount{
			mount(d.PipeDir(), ClientPipeDir, "ro"),
			mount(d.LogDir(), ClientLogDir, "ro"),
			mount(d.ShmDir(), ClientShmDir, "rw"),
		},
	}
}

// Layout is where the daemons are and what runs them: the configuration's
// start.mps block.
type Layout struct {
	// Control is the driver's nvidia-cuda-mps-control.
	Control string
	// Root is the directory the daemons' directories are under.
	Root string
	// HostRoot, when set, is the host's root as nri-gpu sees it (see
	// Daemon.Root).
	HostRoot string
}

// ErrDaemonDir is wrapped by the error for a GPU whose daemon's
// directory would not be one path element under the root.
var ErrDaemonDir = errors.New("MPS daemon refused")

// Daemon returns the daemon of the GPU of uuid (CUDA_VISIBLE_DEVICES for
// it; "" when not known), its directory named by uuid, else by name
// (the GPU's name within its CDI kind), which must be one path element.
func (l Layout) Daemon(uuid, name string) (Daemon, error) {
	dir := uuid
	if dir == "" {
		dir = name
	}
	if dir == "" || dir == "." || dir == ".." || strings.ContainsAny(dir, "/\x00") {
		return Daemon{}, fmt.Errorf("%w: its MPS daemon's directory would be named %q, which is not one path element under %s", ErrDaemonDir, dir, l.Root)
	}
	return Daemon{Control: l.Control, Dir: filepath.Join(l.Root, dir), GPU: uuid, Root: l.HostRoot}, nil
}

// ControlSocket is the socket, in its pipe directory, that a control
// daemon listens on.
const ControlSocket = "control"

// Ask sends one command to the daemon and returns its answer.
func (d Daemon) Ask(ctx context.Context, command string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, askTimeout)
	defer cancel()
	if _, err := os.Stat(d.PipeDir()); err != nil {
		return "", err
	}
	cmd := d.command(ctx)
	cmd.Stdin = strings.NewReader(command + "\n")
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		if msg := strings.TrimSpace(errOut.String() + out.String()); msg != "" {
			return "", fmt.Errorf("%s %q: %w: %s", d.Control, command, err, msg)
		}
		return "", fmt.Errorf("%s %q: %w", d.Control, command, err)
	}
	return strings.TrimSpace(out.String()), nil
}

// ErrNotExclusive is wrapped by Start's error where the GPU could not be
// put in Exclusive_Process compute mode: nothing else was done.
var ErrNotExclusive = errors.New("not put in Exclusive_Process compute mode, which keeps a client from leaving MPS")

// Start puts the GPU in Exclusive_Process compute mode (through Modes;
// where no mode can be set here, ErrNoModes, it is left as it is), makes
// the daemon's directories and starts it in the background
// (nvidia-cuda-mps-control -d) through start, which runs the command it
// is given (chrooted into Root when its SysProcAttr says so) with ShmDir
// as its /dev/shm, then makes the limits its clients' defaults. A daemon
// of this process's pid namespace already answering is kept as it runs
// (the control program starts no second one): only its limits are set.
func (d Daemon) Start(ctx context.Context, l Limits, start Launcher) error {
	if err := d.setMode(ModeExclusive); err != nil && !errors.Is(err, ErrNoModes) {
		return fmt.Errorf("GPU %s %w: %w", d.GPU, ErrNotExclusive, err)
	}
	_, err := d.peer(ctx)
	switch {
	case errors.Is(err, ErrNotRunning):
		if err := d.launch(ctx, start); err != nil {
			return err
		}
	case err != nil:
		return err
	}
	return d.SetLimits(ctx, l)
}

// launch makes the daemon's directories and runs "-d" through start.
func (d Daemon) launch(ctx context.Context, start Launcher) error {
	for _, dir := range []string{d.PipeDir(), d.LogDir(), d.ShmDir()} {
		if err := perm.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("MPS daemon of %s: %w", d.Dir, err)
		}
	}
	if err := os.Chmod(d.ShmDir(), 0o777|os.ModeSticky); err != nil {
		return fmt.Errorf("MPS daemon of %s: %w", d.Dir, err)
	}
	if err := start.Launch(d.ShmDir(), d.command(ctx, "-d")); err != nil {
		return fmt.Errorf("starting %s -d for %s: %w", d.Control, d.Dir, err)
	}
	return nil
}

// SetLimits makes l the defaults of the clients of the daemon's next
// server (MPS applies defaults when it starts a server).
func (d Daemon) SetLimits(ctx context.Context, l Limits) error {
	for _, c := range l.Commands() {
		if _, err := d.Ask(ctx, c); err != nil {
			return fmt.Errorf("MPS daemon of %s: %w", d.Dir, err)
		}
	}
	return nil
}

// Stop has the daemon quit, where one of this process's pid namespace
// answers, and waits (within ctx) for it to go, reaping it where it is
// this process's child; then it puts the GPU back in compute mode was
// ("" or Exclusive_Process: left as it is). A daemon that cannot be told
// to quit is an error, its GPU left in Exclusive_Process.
func (d Daemon) Stop(ctx context.Context, was string) error {
	if p, err := d.peer(ctx); err == nil {
		if _, err := d.Ask(ctx, "quit"); err != nil {
			return err
		}
		p.awaitAndReap(ctx)
	}
	if was == "" || was == ModeExclusive {
		return nil
	}
	if err := d.setMode(was); err != nil {
		return fmt.Errorf("GPU %s, its daemon stopped, left in Exclusive_Process compute mode: %w", d.GPU, err)
	}
	return nil
}

// setMode puts the GPU in compute mode mode through Modes (none: it is
// left as it is).
func (d Daemon) setMode(mode string) error {
	if d.Modes == nil {
		return nil
	}
	return d.Modes.Set(d.GPU, mode)
}
