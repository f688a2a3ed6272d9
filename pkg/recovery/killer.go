package recovery

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/containerd/nri/pkg/api"
	"golang.org/x/sys/unix"

	"github.com/nri-gpu/nri-gpu/pkg/memlimit"
)

// Killer stops a running container as the runtime's own eviction does
// (containerd stops it with no grace period): its process, which the
// runtime reports, is killed; where the runtime reports none (CRI-O tells
// NRI no pid), every process of its cgroup (cgroup v2's cgroup.kill), the
// one its cgroupsPath names under Cgroups. Proc is the proc filesystem
// ("/proc").
type Killer struct {
	Proc    string
	Cgroups memlimit.Cgroups
}

// Stop kills the container's process. The process is first opened (a
// pidfd, so that the signal cannot reach a process that took its pid
// meanwhile) and checked to be the container's: its cgroup names the
// container's ID.
func (k Killer) Stop(ctr *api.Container) error {
	pid := int(ctr.GetPid())
	if pid <= 0 && k.Cgroups.Root != "" {
		dir, err := k.Cgroups.OfContainer(0, ctr.GetId(), ctr.GetLinux().GetCgroupsPath())
		if err != nil {
			return fmt.Errorf("%w: the runtime reports no process of it: %w", ErrNotStopped, err)
		}
		return KillCgroup(dir)
	}
	if pid <= 0 {
		return fmt.Errorf("%w: the runtime reports no process of it", ErrNotStopped)
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return fmt.Errorf("%w: process %d: %w", ErrNotStopped, pid, err)
	}
	defer unix.Close(fd)
	cgroup, err := os.ReadFile(filepath.Join(k.Proc, strconv.Itoa(pid), "cgroup"))
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

// ErrNotStopped is wrapped by the error of a container that could not be
// stopped.
var ErrNotStopped = errors.New("container not stopped")

// KillCgroup kills every process of the cgroup v2 directory dir at once
// (its cgroup.kill).
func KillCgroup(dir string) error {
	if err := os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0); err != nil {
		return fmt.Errorf("%w: %w", ErrNotStopped, err)
	}
	return nil
}
