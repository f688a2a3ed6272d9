package mps

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// proc is a process known by its pid and its start time (so that a pid
// used again by another process is not taken for it); zero when unknown.
type proc struct {
	pid   int
	start uint64
}

// ErrNotTheDaemon is wrapped by the error for a control socket served
// by a process nri-gpu may not hand MPS clients to: one outside its pid
// namespace (a container's), or, for a daemon nri-gpu started, another
// process than that daemon.
var ErrNotTheDaemon = errors.New("MPS control socket not served by the daemon")

// Ready returns nil when a process of this process's pid namespace (the
// node's daemons, none of a client container's) answers on the daemon's
// control socket, and an error wrapping ErrNotRunning or ErrNotTheDaemon
// otherwise: a daemon run by the operator (mps.daemon: external). One
// nri-gpu runs is ready only as the Manager keeping it says
// (Manager.Ready).
func (d Daemon) Ready(ctx context.Context) error {
	_, err := d.peer(ctx)
	return err
}

// peer returns the process listening on the daemon's control socket,
// checking that it is of this process's pid namespace: the kernel tells
// a listener of another pid namespace nri-gpu cannot see as pid 0 (a
// sibling container's), and one it can see has its own namespace (a
// container's, seen from the host's).
func (d Daemon) peer(ctx context.Context) (proc, error) {
	ctx, cancel := context.WithTimeout(ctx, askTimeout)
	defer cancel()
	pid, err := d.listener(ctx)
	if err != nil {
		return proc{}, fmt.Errorf("%w (pipe directory %s): %w", ErrNotRunning, d.PipeDir(), err)
	}
	if pid == 0 || !samePidNamespace(pid) {
		return proc{}, fmt.Errorf("%w: %s is served by a process outside nri-gpu's pid namespace (a container's)", ErrNotTheDaemon, d.socket())
	}
	_, start, err := stat(pid)
	if err != nil {
		return proc{}, fmt.Errorf("%w (pipe directory %s): %w", ErrNotRunning, d.PipeDir(), err)
	}
	return proc{pid: pid, start: start}, nil
}

// samePidNamespace reports whether process pid is in this process's pid
// namespace.
func samePidNamespace(pid int) bool {
	own, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return false
	}
	its, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid))
	return err == nil && its == own
}

// socket is the daemon's control socket.
func (d Daemon) socket() string { return filepath.Join(d.PipeDir(), ControlSocket) }

// listener returns the pid of the process listening on the daemon's
// control socket, as the kernel tells a client (SO_PEERCRED).
func (d Daemon) listener(ctx context.Context) (int, error) {
	var dialer net.Dialer
	conn, err := dialer.DialContext(ctx, "unix", d.socket())
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	raw, err := conn.(*net.UnixConn).SyscallConn()
	if err != nil {
		return 0, err
	}
	var (
		cred *unix.Ucred
		cerr error
	)
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if cerr != nil {
		return 0, cerr
	}
	return int(cred.Pid), nil
}

// stat returns a process's state and start time (fields 3 and 22 of
// /proc/PID/stat).
func stat(pid int) (byte, uint64, error) {
	fields, err := statFields(pid)
	if err != nil {
		return 0, 0, err
	}
	start, err := strconv.ParseUint(fields[19], 10, 64)
	if err != nil {
		return 0, 0, err
	}
	return fields[0][0], start, nil
}

// parent returns the pid of a process's parent (field 4 of
// /proc/PID/stat), 0 where it cannot be told.
func parent(pid int) int {
	fields, err := statFields(pid)
	if err != nil {
		return 0
	}
	ppid, _ := strconv.Atoi(fields[1])
	return ppid
}

// statFields returns the fields of /proc/PID/stat from the third on.
func statFields(pid int) ([]string, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, err
	}
	// The command, field 2, is in parentheses and may hold anything.
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return nil, errors.New("no command in stat")
	}
	fields := strings.Fields(string(data[i+1:]))
	if len(fields) < 20 {
		return nil, fmt.Errorf("%d fields in stat", len(fields)+2)
	}
	return fields, nil
}

// reap collects p's exit status when p is a child of this process that
// has quit (a zombie), so that it does not stay one; any other process
// is left alone.
func (p proc) reap() bool {
	if p.pid <= 0 {
		return false
	}
	state, start, err := stat(p.pid)
	if err != nil || start != p.start || state != 'Z' {
		return false
	}
	got, _ := unix.Wait4(p.pid, nil, unix.WNOHANG, nil) // -1 on an error
	return got == p.pid
}

// reapWait bounds how long a stopped daemon is waited for.
const reapWait = 2 * time.Second

// awaitAndReap waits, up to reapWait, for p to quit, and reaps it where
// it is this process's child. It returns once p no longer answers: gone
// (or its pid another process's), reaped, or a zombie another parent is
// to reap. A zombie of this process's is waited for until it can be
// reaped: a thread group's leader is one before its other threads are
// gone.
func (p proc) awaitAndReap(ctx context.Context) {
	if p.pid <= 0 {
		return
	}
	for deadline := time.Now().Add(reapWait); time.Now().Before(deadline) && ctx.Err() == nil; time.Sleep(20 * time.Millisecond) {
		state, start, err := stat(p.pid)
		switch {
		case err != nil || start != p.start:
			return // gone, reaped by its own parent
		case state == 'Z' && (p.reap() || parent(p.pid) != os.Getpid()):
			return
		}
	}
}
