// Package specs finds, loads, trusts and watches CDI specs, and resolves
// qualified device names against them.
//
// It reads spec files as CDI's cache does (later directories winning over
// earlier ones), but trusting what it reads rather than a path, and has
// CDI (tags.cncf.io/container-device-interface/pkg/cdi) parse and validate
// exactly those bytes. A Registry loads the specs in the
// background, whenever a spec directory changes (and, as a safety net,
// every ResyncInterval), into an immutable Snapshot: the devices, whether
// their spec is trusted, their footprints and hooks, and the host device
// nodes they name, stat'ed at load. Requests read the current snapshot and
// never touch the disk.
package specs

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"tags.cncf.io/container-device-interface/pkg/parser"
)

// ErrUnresolvable is wrapped by the error for a device found in no spec.
var ErrUnresolvable = errors.New("unresolvable CDI device")

// HookEnv is the environment of a hook whose spec gives it none: nri-gpu
// gives it to every such hook it injects, and writes it into the hooks of
// the specs it generates, so that no hook inherits an environment nri-gpu
// did not choose.
const HookEnv = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Intervals of the background loading.
const (
	// PollInterval is how often missing spec directories are looked for,
	// so that a directory deleted and created again is watched again.
	PollInterval = time.Second
	// ResyncInterval is how often everything is loaded again regardless.
	ResyncInterval = 30 * time.Second
	// settle is how long loading waits for a burst of changes to end.
	settle = 50 * time.Millisecond
)

// Registry holds the current snapshot of the CDI specs of a set of
// directories, kept current by watching them.
type Registry struct {
	dirs   []string
	snap   atomic.Pointer[Snapshot]
	notify func(*Snapshot)
	parts  PartMajors
	stop   chan struct{}
	done   chan struct{}
}

// Option tunes a Registry.
type Option func(*Registry)

// WithNotify has fn called, from the loading goroutine, with each new
// snapshot.
func WithNotify(fn func(*Snapshot)) Option { return func(r *Registry) { r.notify = fn } }

// WithPartMajors has a device's nodes of these character majors taken for
// its parts (Device.Parts) rather than those NVIDIACaps gives.
func WithPartMajors(parts PartMajors) Option { return func(r *Registry) { r.parts = parts } }

// Open loads the specs in dirs, a later directory winning over an earlier
// one, and keeps loading them as they change until Close. Missing
// directories are not an error: they are looked for.
func Open(dirs []string, opts ...Option) (*Registry, error) {
	if len(dirs) == 0 {
		return nil, errNoDirs
	}
	r := newRegistry(dirs, opts)
	// Watch first, so that no change after the first load is missed.
	w := newWatcher(r.dirs)
	r.snap.Store(load(r.dirs, r.parts))
	go r.watch(w)
	return r, nil
}

// Load loads the specs in dirs once, without watching them: for commands
// that read the specs and exit.
func Load(dirs []string, opts ...Option) (*Snapshot, error) {
	if len(dirs) == 0 {
		return nil, errNoDirs
	}
	r := newRegistry(dirs, opts)
	return load(r.dirs, r.parts), nil
}

func newRegistry(dirs []string, opts []Option) *Registry {
	r := &Registry{
		dirs:  slices.Clone(dirs),
		parts: NVIDIACaps,
		stop:  make(chan struct{}),
		done:  make(chan struct{}),
	}
	for _, o := range opts {
		o(r)
	}
	return r
}

var errNoDirs = errors.New("no CDI spec directories")

// Close stops loading.
func (r *Registry) Close() {
	select {
	case <-r.stop:
	default:
		close(r.stop)
	}
	<-r.done
}

// Snapshot returns the current snapshot.
func (r *Registry) Snapshot() *Snapshot { return r.snap.Load() }

// reload loads the specs again and publishes the new snapshot.
func (r *Registry) reload() {
	s := load(r.dirs, r.parts)
	r.snap.Store(s)
	if r.notify != nil {
		r.notify(s)
	}
}

// Entries returns every device of the snapshot, trusted or not, sorted by
// name (numbers in numeric order).
func (s *Snapshot) Entries() []*Entry {
	out := slices.Collect(maps.Values(s.devices))
	slices.SortFunc(out, func(a, b *Entry) int { return naturalCompare(a.Footprint.Name, b.Footprint.Name) })
	return out
}

// Resolve looks up each qualified name in the snapshot. It returns
// the entries in the order asked, or an error naming every name that did
// not resolve, or whose spec is not trusted, and why.
func (s *Snapshot) Resolve(names []string) ([]*Entry, error) {
	entries := make([]*Entry, 0, len(names))
	var errs []error
	for _, name := range names {
		e, err := s.Lookup(name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		entries = append(entries, e)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return entries, nil
}

// Lookup returns the entry of a qualified name, or an error saying that
// no spec defines it (naming the specs that failed to load) or that its
// spec is not trusted.
func (s *Snapshot) Lookup(name string) (*Entry, error) {
	e := s.devices[name]
	switch {
	case e == nil:
		return nil, fmt.Errorf("%w %q: no CDI spec in %s defines it%s",
			ErrUnresolvable, name, strings.Join(s.dirs, ", "), s.problemHint())
	case e.Untrusted != nil:
		return nil, fmt.Errorf("device %q: %w", name, e.Untrusted)
	}
	return e, nil
}

// Hooks returns the hook executables the named device's edits (its
// own, or its spec's) inject, none where no trusted spec defines it.
func (s *Snapshot) Hooks(d Device) []string {
	if e, err := s.Lookup(d.Name); err == nil {
		return e.Hooks
	}
	return nil
}

// Footprints returns the footprints of devices by name, whether or not
// their specs are trusted; a name no spec defines has an empty footprint.
// It serves to rebuild what pods held, not to inject.
func (s *Snapshot) Footprints(names []string) []Device {
	out := make([]Device, len(names))
	for i, name := range names {
		if e := s.devices[name]; e != nil {
			out[i] = e.Footprint
		} else {
			out[i] = Device{Name: name}
		}
	}
	return out
}

// Candidates returns the individual devices of a kind (vendor/class) that
// come from trusted specs: every device but "all", each with its
// footprint, sorted by name (numbers in numeric order).
func (s *Snapshot) Candidates(kind string) []Device {
	vendor, class := parser.ParseQualifier(kind)
	var out []Device
	for _, e := range s.devices {
		spec := e.Device.GetSpec()
		if spec.GetVendor() != vendor || spec.GetClass() != class || e.Untrusted != nil {
			continue
		}
		if _, _, name := parser.ParseDevice(e.Footprint.Name); name == "all" {
			continue
		}
		out = append(out, e.Footprint)
	}
	slices.SortFunc(out, func(a, b Device) int { return naturalCompare(a.Name, b.Name) })
	return out
}

// Trusted returns the footprints of the devices of trusted specs, "all"
// ones too, sorted by name (numbers in numeric order).
func (s *Snapshot) Trusted() []Device {
	var out []Device
	for _, e := range s.Entries() {
		if e.Untrusted == nil {
			out = append(out, e.Footprint)
		}
	}
	return out
}

// Aliases returns the names d's hardware goes by in the snapshot: its own
// and those of every device of a trusted spec that is the same hardware
// (a GPU by index and by UUID), sorted (numbers in numeric order).
func (s *Snapshot) Aliases(d Device) []string {
	out := []string{d.Name}
	for name, e := range s.devices {
		if e.Untrusted == nil && name != d.Name && e.Footprint.Same(d) {
			out = append(out, name)
		}
	}
	slices.SortFunc(out, naturalCompare)
	return out
}
