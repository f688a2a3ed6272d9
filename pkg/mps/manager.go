package mps

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os/exec"
	"slices"
	"sync"
	"time"
)

// Want is a daemon a Manager is told to keep running.
type Want struct {
	// Device names the GPU, for the manager's events and errors.
	Device string
	// By says who shares the GPU with MPS, for errors.
	By string `json:"-"`
	// Daemon is the GPU's daemon.
	Daemon Daemon
	// Limits are its clients' defaults.
	Limits Limits
}

// Event is something a Manager did, for the caller to log.
type Event struct {
	// What is one of Started, LimitsSet, Stopped, Exclusive, Restored
	// and RolledBack.
	What string
	Want
	// Was is the compute mode the GPU was in (Exclusive), or is put back
	// in (Restored).
	Was string
}

// Message says what the event was, in words for the log; Warn says it
// is to be logged as a warning.
func (e Event) Message() (msg string, warn bool) {
	switch e.What {
	case Started:
		return "started MPS control daemon", false
	case LimitsSet:
		return "set the MPS control daemon's limits, for its next server", false
	case Stopped:
		return "stopped MPS control daemon: its GPU is no longer shared with MPS", false
	case Exclusive:
		return "put the GPU in Exclusive_Process compute mode (it was in " + e.Was + ") while it is shared with MPS", false
	case Restored:
		return "put the GPU back in " + e.Was + " compute mode: it is no longer shared with MPS", false
	}
	return "rolled back the start of an MPS control daemon that did not finish: stopped, its GPU back in its compute mode", true
}

// What a Manager did to a daemon, or to its GPU's compute mode.
const (
	Started   = "started"
	LimitsSet = "limits set"
	Stopped   = "stopped"
	// Exclusive: the GPU put in Exclusive_Process compute mode before
	// its daemon is started, from the mode Was.
	Exclusive = "exclusive"
	// Restored: the GPU of a daemon stopped put back in the mode Was.
	Restored = "restored"
	// RolledBack: a start that did not finish (it failed, or the nri-gpu
	// making it died) undone: its daemon stopped, its GPU's mode back.
	RolledBack = "rolled back"
)

// A Launcher runs a daemon's "nvidia-cuda-mps-control -d" command with
// shm as its /dev/shm, and returns once that command has exited.
type Launcher interface {
	Launch(shm string, cmd *exec.Cmd) error
}

// Start is a function that is a Launcher.
type Start func(shm string, cmd *exec.Cmd) error

// Launch runs cmd with shm as its /dev/shm: f(shm, cmd).
func (f Start) Launch(shm string, cmd *exec.Cmd) error { return f(shm, cmd) }

// Entry is what a Manager keeps in its Journal of a daemon it starts,
// runs or stops, written before it acts: so that whatever process reads
// the journal next (this one after a failure, another after a crash)
// finds every daemon and compute mode nri-gpu set, and undoes what is
// not wanted.
type Entry struct {
	// Device names the GPU, for messages.
	Device string `json:"device"`
	// Control, Dir, GPU and Root are its Daemon's.
	Control string `json:"control"`
	Dir     string `json:"dir"`
	GPU     string `json:"gpu"`
	Root    string `json:"root,omitempty"`
	// Was is the GPU's compute mode before the manager set
	// Exclusive_Process, which it puts back ("" where it could not
	// tell: it is left as it is).
	Was string `json:"was,omitempty"`
	// State is Starting, Running or Stopping.
	State string `json:"state"`
}

// The states of an Entry.
const (
	// Starting: the GPU's mode may be set and the daemon started, not
	// yet seen answering: a start found so is rolled back.
	Starting = "starting"
	// Running: started and answering.
	Running = "running"
	// Stopping: no longer wanted; quit, and the mode put back, once it
	// succeeds (retried until then).
	Stopping = "stopping"
)

// daemon returns the entry's daemon.
func (e Entry) daemon() Daemon {
	return Daemon{Control: e.Control, Dir: e.Dir, GPU: e.GPU, Root: e.Root}
}

// Journal keeps a Manager's entries where they outlive the process
// (nri-gpu's record).
type Journal interface {
	// Entries returns the entries last kept, by this process or one
	// before it.
	Entries() []Entry
	// Keep keeps entries, the whole list, before the manager acts on
	// what they say: it returns an error, and the manager does not act,
	// when they cannot be kept.
	Keep(entries []Entry) error
}

// undoWait bounds an undo (a daemon's quit, its compute mode put back),
// whatever is left of the caller's context: an undo is never
// cut short because the request that asked for the start gave up.
const undoWait = 10 * time.Second

// Manager keeps the MPS control daemons it is told are wanted running
// (mps.daemon: managed): it starts one that does not answer
// (Daemon.Start, which puts its GPU in Exclusive_Process first), sets
// the limits again on one whose limits changed or that it finds running,
// and stops those it kept that are no longer wanted (Daemon.Stop, which
// puts their GPUs back in the mode they were in). It gives each daemon
// its Modes. Each step is kept in its Journal before it is taken (the
// mode a GPU was in before its daemon's start sets another among them),
// so that a start that did not finish is rolled back by whoever reads
// the journal next, and a stop that failed is tried again. It reaps the
// daemons it knows that have quit: nri-gpu in its container is PID 1
// there, and a daemon started through "-d" is reparented to it.
//
// A Manager made with no Start (mps.daemon: external) starts nothing:
// it only says whether the operator's daemons are ready.
type Manager struct {
	start   Launcher
	modes   Modes
	journal Journal

	mu sync.Mutex
	// entries are the daemons started, running or stopping, by
	// directory; loaded says the journal's were read.
	entries map[string]*entry
	loaded  bool
}

// entry is a daemon a Manager keeps: its journal entry, what it was
// told, and its process.
type entry struct {
	Entry
	limits Limits
	proc   proc
}

// NewManager returns a manager that starts daemons through start, sets
// their GPUs' compute mode through modes and keeps its entries in
// journal (nil: nowhere but in memory).
func NewManager(start Launcher, modes Modes, journal Journal) *Manager {
	return &Manager{start: start, modes: modes, journal: journal, entries: map[string]*entry{}}
}

// Sync makes the daemons running those of want, as above, and returns
// what it did and what it could not (one error per daemon). A GPU modes
// does not put in Exclusive_Process gets no daemon, so that a client
// cannot leave MPS for a context of its own beside the server,
// unbounded; where no mode can be read or set here (ErrNoModes) the
// daemon is started all the same, and the error says to set the mode.
// What ctx no longer allows is undone on deadlines of its own.
func (m *Manager) Sync(ctx context.Context, want []Want) ([]Event, []error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var r report
	m.load(&r)
	wanted := map[string]bool{}
	for _, w := range want {
		wanted[w.Daemon.Dir] = true
		m.ensureRunning(ctx, w, &r)
	}
	for _, dir := range slices.Sorted(maps.Keys(m.entries)) {
		if !wanted[dir] {
			m.stop(m.entries[dir], &r)
		}
	}
	return r.events, r.errs
}

// report is what a Sync did and could not do.
type report struct {
	events []Event
	errs   []error
}

func (r *report) did(what string, e *entry, was string) {
	r.events = append(r.events, Event{What: what, Want: e.want(), Was: was})
}

func (r *report) failed(err error) { r.errs = append(r.errs, err) }

// want is what the entry's daemon was told.
func (e *entry) want() Want { return Want{Device: e.Device, Daemon: e.daemon(), Limits: e.limits} }

// load reads the journal's entries, once: those of a process before
// this one. A start that did not finish is rolled back.
func (m *Manager) load(r *report) {
	if m.loaded || m.journal == nil {
		m.loaded = true
		return
	}
	m.loaded = true
	for _, e := range m.journal.Entries() {
		m.entries[e.Dir] = &entry{Entry: e}
	}
	for _, dir := range slices.Sorted(maps.Keys(m.entries)) {
		if e := m.entries[dir]; e.State == Starting {
			m.rollBack(e, r)
		}
	}
}

// ensureRunning keeps w's daemon running with w's limits, starting it
// where it does not answer.
func (m *Manager) ensureRunning(ctx context.Context, w Want, r *report) {
	e := m.entries[w.Daemon.Dir]
	if e != nil && e.State == Stopping {
		// Wanted again before its stop went through: stopped first, so
		// that it starts from what the journal says.
		if !m.stop(e, r) {
			return
		}
		e = nil
	}
	// Whoever answers must be the daemon before it is sent limits: a
	// process of nri-gpu's pid namespace (no client container's), and
	// the one kept if one is.
	p, err := w.Daemon.peer(ctx)
	if !errors.Is(err, ErrNotRunning) {
		if err == nil && e != nil && e.proc.pid != 0 && p != e.proc {
			err = fmt.Errorf("%w: %s is served by pid %d, not by the daemon nri-gpu started (pid %d)", ErrNotTheDaemon, w.Daemon.socket(), p.pid, e.proc.pid)
		}
		if err != nil {
			r.failed(fmt.Errorf("MPS daemon of %s: %w", w.Device, err))
			return
		}
		m.adopt(ctx, w, e, p, r)
		return
	}
	if e != nil {
		e.proc.reap() // it died: not left a zombie
		e.proc = proc{}
	}
	m.launch(ctx, w, e, r)
}

// adopt keeps a daemon found answering: started by this manager, or by
// an nri-gpu before it (whose journal said so, or which kept none: see
// adoptUnknown), with other limits since a reload: its defaults are set
// again, for its next server (MPS applies them to a server it starts,
// not to one running).
func (m *Manager) adopt(ctx context.Context, w Want, e *entry, p proc, r *report) {
	if e == nil {
		m.adoptUnknown(ctx, w, p, r)
		return
	}
	e.proc = p
	if e.limits == w.Limits {
		return // as set: none are known of one found in the journal
	}
	if err := w.Daemon.SetLimits(ctx, w.Limits); err != nil {
		r.failed(fmt.Errorf("MPS daemon of %s: %w", w.Device, err))
		return
	}
	e.limits = w.Limits
	r.did(LimitsSet, e, "")
}

// adoptUnknown keeps a daemon found answering that no entry tells of,
// kept as Running with the mode its GPU is in: Start keeps it as it
// runs, its GPU put in Exclusive_Process and its limits set, as for a
// start; where the GPU cannot be put in that mode, it is stopped.
func (m *Manager) adoptUnknown(ctx context.Context, w Want, p proc, r *report) {
	e := m.claim(w, Running, r)
	if e == nil {
		m.undo(&entry{Entry: entryOf(w, "", Stopping)}, r)
		return
	}
	if err := m.daemon(e).Start(ctx, w.Limits, m.start); err != nil {
		r.failed(fmt.Errorf("MPS daemon of %s: %w", w.Device, err))
		if errors.Is(err, ErrNotExclusive) {
			e.Was = "" // not changed: nothing to put back
			m.undo(e, r)
		}
		return
	}
	m.exclusive(e, r)
	e.proc, e.limits = p, w.Limits
	r.did(LimitsSet, e, "")
}

// claim keeps w's daemon as state, with the compute mode its GPU is in
// (put back when it stops), before its start puts the GPU in
// Exclusive_Process; it returns the entry, or nil (said in r) where the
// mode cannot be read or the entry kept. Where no mode can be read or
// set here (ErrNoModes) the GPU is left as it is, and r says to set it.
func (m *Manager) claim(w Want, state string, r *report) *entry {
	was, err := m.modes.Mode(w.Daemon.GPU)
	switch {
	case errors.Is(err, ErrNoModes):
		r.failed(fmt.Errorf("device %q: its GPU's compute mode is left as it is (%w): put it in Exclusive_Process (nvidia-smi -i %s -c EXCLUSIVE_PROCESS), which keeps a client from leaving MPS", w.Device, err, w.Daemon.GPU))
		was = ""
	case err != nil:
		r.failed(fmt.Errorf("MPS daemon of %s not started: its GPU's compute mode cannot be read: %w", w.Device, err))
		return nil
	}
	e := &entry{Entry: entryOf(w, was, state)}
	if err := m.keep(e); err != nil {
		delete(m.entries, e.Dir)
		r.failed(fmt.Errorf("MPS daemon of %s not started: %w", w.Device, err))
		return nil
	}
	return e
}

// exclusive reports that e's GPU, claimed, was put in Exclusive_Process
// from another mode.
func (m *Manager) exclusive(e *entry, r *report) {
	if e.Was != "" && e.Was != ModeExclusive {
		r.did(Exclusive, e, e.Was)
	}
}

// daemon is e's daemon, its GPU's mode set through the manager's Modes.
func (m *Manager) daemon(e *entry) Daemon {
	d := e.daemon()
	d.Modes = m.modes
	return d
}

// entryOf is the journal entry of w's daemon.
func entryOf(w Want, was, state string) Entry {
	d := w.Daemon
	return Entry{Device: w.Device, Control: d.Control, Dir: d.Dir, GPU: d.GPU, Root: d.Root, Was: was, State: state}
}

// launch starts w's daemon, kept as Starting first (with the mode its
// GPU was in), then started (Daemon.Start: its GPU in Exclusive_Process
// first), then kept as Running. A start that fails is rolled back; one
// whose GPU's mode was refused changed nothing, and is forgotten.
func (m *Manager) launch(ctx context.Context, w Want, e *entry, r *report) {
	if w.Daemon.GPU == "" {
		r.failed(fmt.Errorf("MPS daemon of %s not started: its UUID is not known (name the GPU by UUID in its spec, or give nri-gpu NVML)", w.Device))
		return
	}
	claimed := e == nil
	if claimed {
		if e = m.claim(w, Starting, r); e == nil {
			return
		}
	}
	d := m.daemon(e)
	if err := d.Start(ctx, w.Limits, m.start); err != nil {
		r.failed(fmt.Errorf("MPS daemon of %s not started: %w", w.Device, err))
		switch {
		case e.State != Starting:
		case errors.Is(err, ErrNotExclusive):
			m.forget(e, r)
		default:
			m.rollBack(e, r)
		}
		return
	}
	if claimed {
		m.exclusive(e, r)
	}
	e.proc, _ = d.peer(ctx) // zero when it cannot be told: the next Sync keeps whoever answers then
	e.limits, e.State = w.Limits, Running
	if err := m.keep(e); err != nil {
		r.failed(fmt.Errorf("MPS daemon of %s started, but %w", w.Device, err))
		e.State = Starting
		m.rollBack(e, r)
		return
	}
	r.did(Started, e, "")
}

// rollBack undoes a start that did not finish: the daemon, if one of
// nri-gpu's pid namespace answers, is stopped, and the GPU put back in
// the mode it was in; the entry goes once both are done, else it stays,
// Stopping, to be tried again.
func (m *Manager) rollBack(e *entry, r *report) {
	if m.undo(e, r) {
		r.did(RolledBack, e, e.Was)
	}
}

// stop stops a daemon no longer wanted, and puts its GPU back in the
// mode it was in; it reports whether it is gone.
func (m *Manager) stop(e *entry, r *report) bool {
	return m.undo(e, r)
}

// undo stops e's daemon and puts its GPU back (Daemon.Stop), on a
// deadline of its own, the entry kept Stopping until both are done (a
// step that fails is an error, tried again at the next Sync); it
// reports whether the entry is gone.
func (m *Manager) undo(e *entry, r *report) bool {
	starting := e.State == Starting
	if e.State != Stopping {
		e.State = Stopping
		if err := m.keep(e); err != nil {
			r.failed(fmt.Errorf("stopping the MPS daemon of %s: %w", e.Device, err))
			return false
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), undoWait)
	defer cancel()
	d := m.daemon(e)
	_, err := d.peer(ctx)
	answered := err == nil
	if err := d.Stop(ctx, e.Was); err != nil {
		r.failed(fmt.Errorf("stopping the MPS daemon of %s, no longer wanted: %w (tried again)", e.Device, err))
		return false
	}
	e.proc.reap()
	if !starting && answered {
		r.did(Stopped, e, "")
	}
	if !starting && e.Was != "" && e.Was != ModeExclusive {
		r.did(Restored, e, e.Was)
	}
	m.forget(e, r)
	return true
}

// forget drops e, and keeps the entries left.
func (m *Manager) forget(e *entry, r *report) {
	delete(m.entries, e.Dir)
	if err := m.keepAll(); err != nil {
		r.failed(fmt.Errorf("MPS daemon of %s no longer kept, but %w", e.Device, err))
	}
}

// keep puts e among the entries and keeps them all in the journal.
func (m *Manager) keep(e *entry) error {
	m.entries[e.Dir] = e
	return m.keepAll()
}

// keepAll keeps every entry in the journal.
func (m *Manager) keepAll() error {
	if m.journal == nil {
		return nil
	}
	out := make([]Entry, 0, len(m.entries))
	for _, dir := range slices.Sorted(maps.Keys(m.entries)) {
		out = append(out, m.entries[dir].Entry)
	}
	if err := m.journal.Keep(out); err != nil {
		return fmt.Errorf("its start or stop could not be recorded: %w", err)
	}
	return nil
}

// Ready returns nil when d's daemon is ready for clients, and why not
// otherwise (wrapping ErrNotRunning or ErrNotTheDaemon): the process
// listening on its control socket is the daemon the manager started or
// found answering, so that clients are not handed to a socket a client
// container's process took the place of. A manager that starts nothing
// (mps.daemon: external) asks the daemon alone (Daemon.Ready).
func (m *Manager) Ready(ctx context.Context, d Daemon) error {
	if m.start == nil {
		return d.Ready(ctx)
	}
	m.mu.Lock()
	var kept proc // zero: none kept running
	if e := m.entries[d.Dir]; e != nil && e.State == Running {
		kept = e.proc
	}
	m.mu.Unlock()
	p, err := d.peer(ctx)
	switch {
	case err != nil:
		return err
	case kept.pid == 0:
		return fmt.Errorf("%w: nri-gpu has not started %s's daemon yet (it looks every start.mps.checkInterval)", ErrNotRunning, d.Dir)
	case p != kept:
		return fmt.Errorf("%w: %s is served by pid %d, not by the daemon nri-gpu started (pid %d)", ErrNotTheDaemon, d.socket(), p.pid, kept.pid)
	}
	return nil
}

// Run syncs the daemons wanted returns (with the problems of those it
// could not say), at once and then every interval, until ctx is done,
// telling report what each sync did and could not; a manager that
// starts nothing does nothing.
func (m *Manager) Run(ctx context.Context, every time.Duration, wanted func() ([]Want, []error), report func([]Event, []error)) {
	if m.start == nil {
		return
	}
	for {
		want, problems := wanted()
		events, errs := m.Sync(ctx, want)
		report(events, append(problems, errs...))
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}
