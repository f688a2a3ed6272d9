// Package mps runs and asks NVIDIA's Multi-Process Service control
// daemons: one per GPU shared with the mps strategy, each with its own
// directories, through the driver's nvidia-cuda-mps-control. It says what
// a client container needs to reach a GPU's daemon (mounts and
// environment), and what bounds each client.
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
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// ErrNotRunning is wrapped by Running's error for a daemon that does not
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

// ClientEnv is what a client container's environment gets: where its
// daemon is, and its limits.
func ClientEnv(l Limits) []string {
	return append([]string{
		"CUDA_MPS_PIPE_DIRECTORY=" + ClientPipeDir,
		"CUDA_MPS_LOG_DIRECTORY=" + ClientLogDir,
	}, l.Env()...)
}

// Running returns nil when the daemon answers on its control socket
// (PipeDir/control, where CUDA's clients reach it), and an error wrapping
// ErrNotRunning saying why not otherwise. It needs no control program:
// it works where the driver's cannot run (nri-gpu's image).
func (d Daemon) Running(ctx context.Context) error {
	var dialer net.Dialer
	ctx, cancel := context.WithTimeout(ctx, askTimeout)
	defer cancel()
	conn, err := dialer.DialContext(ctx, "unix", filepath.Join(d.PipeDir(), ControlSocket))
	if err != nil {
		return fmt.Errorf("%w (pipe directory %s): %w", ErrNotRunning, d.PipeDir(), err)
	}
	return conn.Close()
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

// Start makes the daemon's directories and starts it in the background
// (nvidia-cuda-mps-control -d) through start, which runs the command it
// is given (chrooted into Root when its SysProcAttr says so) with ShmDir
// as its /dev/shm, then makes the limits its clients' defaults.
func (d Daemon) Start(ctx context.Context, l Limits, start Start) error {
	for _, dir := range []string{d.PipeDir(), d.LogDir(), d.ShmDir()} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("MPS daemon of %s: %w", d.Dir, err)
		}
	}
	if err := os.Chmod(d.ShmDir(), 0o777|os.ModeSticky); err != nil {
		return fmt.Errorf("MPS daemon of %s: %w", d.Dir, err)
	}
	cmd := d.command(ctx, "-d")
	if err := start(d.ShmDir(), cmd); err != nil {
		return fmt.Errorf("starting %s -d for %s: %w", d.Control, d.Dir, err)
	}
	return d.SetLimits(ctx, l)
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

// Stop has the daemon quit.
func (d Daemon) Stop(ctx context.Context) error {
	_, err := d.Ask(ctx, "quit")
	return err
}
