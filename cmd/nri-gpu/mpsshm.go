package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/nri-gpu/nri-gpu/pkg/mps"
)

// runMPSShm mounts a directory on /dev/shm and runs a program in nri-gpu's
// place (nri-gpu mps-shm [--root ROOT] DIR PROGRAM [ARG...]): how nri-gpu
// starts an MPS control daemon whose /dev/shm its clients share. With
// --root, DIR is mounted on ROOT/dev/shm and PROGRAM runs chrooted into
// ROOT (the host's root, for nri-gpu in a container). nri-gpu runs it
// in a mount namespace of its own; it refuses to run in its parent's, so
// that it never covers the /dev/shm of anything else.
func runMPSShm(args []string, stderr io.Writer) int {
	if len(args) == 1 && (args[0] == "--help" || args[0] == "-h") {
		fmt.Fprintf(stderr, "usage: nri-gpu %s [--root ROOT] DIR PROGRAM [ARG...] (nri-gpu runs it itself, in a mount namespace of its own)\n", mps.ShmCommand)
		return exitOK
	}
	root := ""
	if len(args) > 1 && args[0] == "--root" {
		root, args = args[1], args[2:]
	}
	if len(args) < 2 {
		fmt.Fprintf(stderr, "usage: nri-gpu %s [--root ROOT] DIR PROGRAM [ARG...]\n", mps.ShmCommand)
		return exitUsage
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "nri-gpu %s: %v\n", mps.ShmCommand, err)
		return exitError
	}
	own, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return fail(err)
	}
	if parent, err := os.Readlink("/proc/" + strconv.Itoa(os.Getppid()) + "/ns/mnt"); err != nil || parent == own {
		return fail(fmt.Errorf("not in a mount namespace of its own (%s); nri-gpu runs it in one", own))
	}
	shm := filepath.Join("/", root, "dev/shm")
	if err := unix.Mount(args[0], shm, "", unix.MS_BIND, ""); err != nil {
		return fail(fmt.Errorf("mounting %s on %s: %w", args[0], shm, err))
	}
	if root != "" {
		if err := unix.Chroot(root); err != nil {
			return fail(fmt.Errorf("chroot %s: %w", root, err))
		}
		if err := unix.Chdir("/"); err != nil {
			return fail(err)
		}
	}
	return fail(unix.Exec(args[1], args[1:], os.Environ()))
}
