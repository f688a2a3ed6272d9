package mps

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Want is a daemon a Manager is told to keep running.
type Want struct {
	// Device names the GPU, for the manager's events and errors.
	Device string
	// Daemon is the GPU's daemon.
	Daemon Daemon
	// Limits are its clients' defaults.
	Limits Limits
}

// Event is something a Manager did, for the caller to log.
type Event struct {
	// What is one of Started, LimitsSet, Stopped, Exclusive and
	// Restored.
	What string
	Want
	// Was is the compute mode the GPU was in (Exclusive).
	Was string
}

// What a Manager did to a daemon, or to its GPU's compute mode.
const (
	Started   = "started"
	LimitsSet = "limits set"
	Stopped   = "stopped"
	// Exclusive: the GPU put in Exclusive_Process compute mode before
	// its daemon is kept, from the mode Was.
	Exclusive = "exclusive"
	// Restored: the GPU of a daemon stopped put back in Default.
	Restored = "restored"
)

// Start runs a daemon's "nvidia-cuda-mps-control -d" command with shm
// as its /dev/shm, and returns once that command has exited.
type Start func(shm string, cmd *exec.Cmd) error

// Manager keeps the MPS control daemons it is told are wanted running
// (mps.daemon: managed): it starts one that does not answer, sets the
// limits again on one whose limits changed or that it finds running,
// and stops those it kept that are no longer wanted. It reaps the
// daemons it knows that have quit: nri-gpu in its container is PID 1
// there, and a daemon started through "-d" is reparented to it.
type Manager struct {
	start Start
	// modes sets the GPUs' compute modes.
	modes Modes

	mu sync.Mutex
	// kept are the daemons started or found answering, by directory.
	kept map[string]*kept
	// exclusive are the GPUs the manager put in Exclusive_Process
	// compute mode, by UUID, with the daemon they were put in it for.
	exclusive map[string]Want
}

// kept is a daemon a Manager keeps: what it was told, and its process.
type kept struct {
	Want
	proc proc
}

// Modes sets a GPU's compute mode (nri-gpu's, through NVML).
type Modes interface {
	// Exclusive puts the GPU of uuid in Exclusive_Process compute mode,
	// and returns the mode it was in ("" when it was in it already).
	Exclusive(uuid string) (was string, err error)
	// Default puts the GPU of uuid in the Default compute mode.
	Default(uuid string) error
}

// ErrNoModes is wrapped by the error of a Modes that cannot set any
// GPU's mode here (NVML cannot be loaded): a daemon is kept all the
// same, since where NVML cannot be loaded neither can the daemon's own
// driver libraries on a real node.
var ErrNoModes = errors.New("compute modes cannot be set here")

// NewManager returns a manager that starts daemons through start and
// sets their GPUs' compute mode through modes.
func NewManager(start Start, modes Modes) *Manager {
	return &Manager{start: start, modes: modes, kept: map[string]*kept{}, exclusive: map[string]Want{}}
}

// Sync makes the daemons running those of want, as above, and returns
// what it did and what it could not (one error per daemon). Before a
// daemon is kept its GPU is put in Exclusive_Process compute mode (once
// while the manager runs; the mode stays across restarts of nri-gpu),
// so that a client that leaves MPS cannot have a context of its own
// beside the server, unbounded: a GPU modes does not put in it gets no
// daemon. Where no mode can be set here (ErrNoModes) the daemon is kept
// all the same, and the error says to set the mode. A GPU no daemon is wanted for any
// more (stopped, or never started) is put back in Default.
func (m *Manager) Sync(ctx context.Context, want []Want) ([]Event, []error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var (
		events []Event
		errs   []error
	)
	wanted := map[string]bool{}
	for _, w := range want {
		wanted[w.Daemon.Dir] = true
		if e, err := m.exclusiveMode(w); err != nil {
			errs = append(errs, err)
			if !errors.Is(err, ErrNoModes) {
				continue
			}
		} else if e != nil {
			events = append(events, *e)
		}
		had, known := m.kept[w.Daemon.Dir]
		// Whoever answers must be the daemon before it is sent limits: a
		// process of nri-gpu's pid namespace (no client container's), and
		// the one kept if one is.
		p, err := w.Daemon.peer(ctx)
		if !errors.Is(err, ErrNotRunning) {
			if err == nil && known && had.proc.pid != 0 && p != had.proc {
				err = fmt.Errorf("%w: %s is served by pid %d, not by the daemon nri-gpu started (pid %d)", ErrNotTheDaemon, w.Daemon.socket(), p.pid, had.proc.pid)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("MPS daemon of %s: %w", w.Device, err))
				continue
			}
			// Found answering (started by an nri-gpu before this one),
			// or with other limits since a reload: its defaults are set
			// again, for its next server (MPS applies them to a server
			// it starts, not to one running).
			if !known || had.Limits != w.Limits {
				if err := w.Daemon.SetLimits(ctx, w.Limits); err != nil {
					errs = append(errs, fmt.Errorf("MPS daemon of %s: %w", w.Device, err))
					continue
				}
				events = append(events, Event{What: LimitsSet, Want: w})
			}
			m.kept[w.Daemon.Dir] = &kept{Want: w, proc: p}
			continue
		}
		if known {
			had.proc.reap() // it died: not left a zombie
			delete(m.kept, w.Daemon.Dir)
		}
		if w.Daemon.GPU == "" {
			errs = append(errs, fmt.Errorf("MPS daemon of %s not started: its UUID is not known (name the GPU by UUID in its spec, or give nri-gpu NVML)", w.Device))
			continue
		}
		if err := w.Daemon.Start(ctx, w.Limits, m.start); err != nil {
			errs = append(errs, fmt.Errorf("MPS daemon of %s not started: %w", w.Device, err))
			continue
		}
		p, _ = w.Daemon.peer(ctx) // zero when it cannot be told: the next Sync keeps whoever answers then
		m.kept[w.Daemon.Dir] = &kept{Want: w, proc: p}
		events = append(events, Event{What: Started, Want: w})
	}
	for _, dir := range slices.Sorted(maps.Keys(m.kept)) {
		if wanted[dir] {
			continue
		}
		k := m.kept[dir]
		if err := k.Daemon.Stop(ctx); err != nil {
			errs = append(errs, fmt.Errorf("stopping the MPS daemon of %s, no longer shared with MPS: %w", dir, err))
		} else {
			k.proc.awaitAndReap(ctx)
			events = append(events, Event{What: Stopped, Want: k.Want})
		}
		delete(m.kept, dir)
	}
	// The GPUs of daemons no longer wanted (stopped, or never started)
	// go back to Default.
	gpus := map[string]bool{}
	for _, w := range want {
		gpus[w.Daemon.GPU] = true
	}
	for _, uuid := range slices.Sorted(maps.Keys(m.exclusive)) {
		if gpus[uuid] {
			continue
		}
		w := m.exclusive[uuid]
		delete(m.exclusive, uuid)
		if err := m.modes.Default(uuid); err != nil {
			errs = append(errs, fmt.Errorf("GPU %s of %s, no longer shared with MPS, left in Exclusive_Process compute mode: %w", uuid, w.Device, err))
			continue
		}
		events = append(events, Event{What: Restored, Want: w})
	}
	return events, errs
}

// exclusiveMode puts w's GPU in Exclusive_Process compute mode, unless
// the manager did already, and returns the event of the change (nil
// when there was none to make). An error wrapping ErrNoModes says no
// mode can be set here: the mode is left as it is.
func (m *Manager) exclusiveMode(w Want) (*Event, error) {
	uuid := w.Daemon.GPU
	if _, done := m.exclusive[uuid]; uuid == "" || done {
		return nil, nil // without a UUID no daemon is started, and Sync says why
	}
	was, err := m.modes.Exclusive(uuid)
	if errors.Is(err, ErrNoModes) {
		return nil, fmt.Errorf("device %q: its GPU's compute mode is left as it is (%w): put it in Exclusive_Process (nvidia-smi -i %s -c EXCLUSIVE_PROCESS), which keeps a client from leaving MPS", w.Device, err, uuid)
	}
	if err != nil {
		return nil, fmt.Errorf("MPS daemon of %s not started: its GPU is not put in Exclusive_Process compute mode, which keeps a client from leaving MPS: %w", w.Device, err)
	}
	m.exclusive[uuid] = w
	if was == "" {
		return nil, nil
	}
	return &Event{What: Exclusive, Want: w, Was: was}, nil
}

// proc is a process known by its pid and its start time (so that a pid
// used again by another process is not taken for it); zero when unknown.
type proc struct {
	pid   int
	start uint64
}

// Serves returns nil when the process listening on d's control socket
// is the daemon the manager keeps for d (the one it started, or found
// answering), and an error wrapping ErrNotRunning or ErrNotTheDaemon
// otherwise: clients are not handed to a socket a client container's
// process took the place of.
func (m *Manager) Serves(ctx context.Context, d Daemon) error {
	m.mu.Lock()
	k := m.kept[d.Dir]
	m.mu.Unlock()
	p, err := d.peer(ctx)
	switch {
	case err != nil:
		return err
	case k == nil || k.proc.pid == 0:
		return fmt.Errorf("%w: nri-gpu has not started %s's daemon yet (it looks every start.mps.checkInterval)", ErrNotRunning, d.Dir)
	case p != k.proc:
		return fmt.Errorf("%w: %s is served by pid %d, not by the daemon nri-gpu started (pid %d)", ErrNotTheDaemon, d.socket(), p.pid, k.proc.pid)
	}
	return nil
}

// ErrNotTheDaemon is wrapped by the error for a control socket served
// by a process nri-gpu may not hand MPS clients to: one outside its pid
// namespace (a container's), or, for a daemon nri-gpu started, another
// process than that daemon.
var ErrNotTheDaemon = errors.New("MPS control socket not served by the daemon")

// Serving returns nil when a process of this process's pid namespace
// (the node's daemons, none of a client container's) answers on the
// daemon's control socket, and an error wrapping ErrNotRunning or
// ErrNotTheDaemon otherwise.
func (d Daemon) Serving(ctx context.Context) error {
	_, err := d.peer(ctx)
	return err
}

// peer returns the process listening on the daemon's control socket,
// checking that it is of this process's pid namespace: the kernel tells
// a listener of another pid namespace nri-gpu cannot see as pid 0 (a
// sibling container's), and one it can see has its own namespace (a
// container's, seen from the host's).
func (d Daemon) peer(ctx context.Context) (proc, error) {
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
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	// The command, field 2, is in parentheses and may hold anything.
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return 0, 0, errors.New("no command in stat")
	}
	fields := strings.Fields(string(data[i+1:]))
	if len(fields) < 20 {
		return 0, 0, fmt.Errorf("%d fields in stat", len(fields)+2)
	}
	start, err := strconv.ParseUint(fields[19], 10, 64)
	if err != nil {
		return 0, 0, err
	}
	return fields[0][0], start, nil
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

// awaitAndReap waits, up to reapWait, for p to quit and reaps it.
func (p proc) awaitAndReap(ctx context.Context) {
	if p.pid <= 0 {
		return
	}
	for deadline := time.Now().Add(reapWait); time.Now().Before(deadline) && ctx.Err() == nil; time.Sleep(20 * time.Millisecond) {
		if p.reap() {
			return
		}
		if _, start, err := stat(p.pid); err != nil || start != p.start {
			return // gone, reaped by its own parent
		}
	}
}
