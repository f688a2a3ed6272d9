package plugin

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/containerd/nri/pkg/api"
	"golang.org/x/sys/unix"
)

// stopper stops a running container.
type stopper interface{ Stop(*api.Container) error }

// killer stops a container by killing its process, as killContainer
// does; proc is the proc filesystem ("/proc").
type killer struct{ proc string }

// Stop kills the container's process.
func (k killer) Stop(c *api.Container) error { return killContainer(k.proc, c) }

// ErrNotStopped is wrapped by the error of a container that could not be
// stopped.
var ErrNotStopped = errors.New("container not stopped")

// killContainer stops a running container as the runtime's own eviction
// does (containerd stops it with no grace period): its process, which
// the runtime reports, is killed. The process is first opened (a pidfd,
// so that the signal cannot reach a process that took its pid
// meanwhile) and checked to be the container's: its cgroup names the
// container's ID. proc is the proc filesystem ("/proc").
func killContainer(proc string, ctr *api.Container) error {
	pid := int(ctr.GetPid())
	if pid <= 0 {
		return fmt.Errorf("%w: the runtime reports no process of it", ErrNotStopped)
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return fmt.Errorf("%w: process %d: %w", ErrNotStopped, pid, err)
	}
	defer unix.Close(fd)
	cgroup, err := os.ReadFile(filepath.Join(proc, strconv.Itoa(pid), "cgroup"))
	if err != nil {
		return fmt.Errorf("%w: process %d: %w", ErrNotStopped, pid, err)
	}
	if ctr.GetId() == "" || !strings.Contains(string(cgroup), ctr.GetId()) {
		return fmt.Errorf("%w: process %d is not in the container's cgroup (another PID namespace, or the container is gone)", ErrNotStopped, pid)
	}
	if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil {
		return fmt.Errorf("%w: process %d: %w", ErrNotStopped, pid, err)
	}
	return nil
}
