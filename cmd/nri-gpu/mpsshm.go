package main

import (
	"fmt"
	"io"
	"os"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/nri-gpu/nri-gpu/pkg/plugin"
)

// runMPSShm mounts a directory on /dev/shm and runs a program in nri-gpu's
// place (nri-gpu mps-shm DIR PROGRAM [ARG...]): how nri-gpu starts an MPS
// control daemon whose /dev/shm its clients share. nri-gpu runs it in a
// mount namespace of its own; it refuses to run in its parent's, so that
// it never covers the /dev/shm of anything else.
func runMPSShm(args []string, stderr io.Writer) int {
	if len(args) < 2 {
		fmt.Fprintf(stderr, "usage: nri-gpu %s DIR PROGRAM [ARG...]\n", plugin.MPSShmCommand)
		return exitUsage
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "nri-gpu %s: %v\n", plugin.MPSShmCommand, err)
		return exitError
	}
	own, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return fail(err)
	}
	if parent, err := os.Readlink("/proc/" + strconv.Itoa(os.Getppid()) + "/ns/mnt"); err != nil || parent == own {
		return fail(fmt.Errorf("not in a mount namespace of its own (%s); nri-gpu runs it in one", own))
	}
	if err := unix.Mount(args[0], "/dev/shm", "", unix.MS_BIND, ""); err != nil {
		return fail(fmt.Errorf("mounting %s on /dev/shm: %w", args[0], err))
	}
	return fail(unix.Exec(args[1], args[1:], os.Environ()))
}
