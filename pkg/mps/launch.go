package mps

import (
	"fmt"
	"os/exec"
	"strings"
	"syscall"
)

// InShm returns the launcher that runs a daemon's command
// (nvidia-cuda-mps-control -d) through nri-gpu's own command (self
// command, nri-gpu's "mps-shm") in a mount namespace of its own, where
// shm is mounted on /dev/shm (of the root the command chroots into,
// which mps-shm then does): the daemon, the server it starts and the
// clients (which get shm as their /dev/shm) then share it.
func InShm(self, command string) Start {
	return func(shm string, cmd *exec.Cmd) error {
		args := []string{self, command}
		if cmd.SysProcAttr != nil && cmd.SysProcAttr.Chroot != "" {
			args = append(args, "--root", cmd.SysProcAttr.Chroot)
		}
		cmd.Args = append(append(args, shm, cmd.Path), cmd.Args[1:]...)
		cmd.Path = self
		cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
		out, err := cmd.CombinedOutput()
		if err != nil && len(out) > 0 {
			return fmt.Errorf("%w: %s", err, strings.TrimSpace(string(out)))
		}
		return err
	}
}
