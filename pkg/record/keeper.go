package record

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/nri-gpu/nri-gpu/pkg/mps"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
)

// Keeper keeps a pool of holdings, and the MPS daemons nri-gpu runs, in
// a record across restarts: it locks the record for one nri-gpu, reads
// it back once at start, keeps the pods' holdings it read pending until
// the runtime tells which of their pods still run (TakeRestored), and
// writes the record whole at each change (Save). It is the MPS
// manager's Journal: a daemon's start or stop is in the record before
// it is taken. A Keeper of no file keeps nothing and writes nothing.
type Keeper struct {
	file *File
	pool *policy.Allocations
	// lost says the record could not be read back at start.
	lost atomic.Bool

	mu sync.Mutex
	// pending are the pods' holdings read at start; restoring says they
	// are still pending.
	pending   []policy.Holding
	restoring bool
	// daemons are the MPS manager's entries.
	daemons []mps.Entry
}

var _ mps.Journal = (*Keeper)(nil)

// NewKeeper returns the keeper of pool in file (nil: none).
func NewKeeper(file *File, pool *policy.Allocations) *Keeper {
	return &Keeper{file: file, pool: pool}
}

// File returns the record's file, nil when there is none.
func (k *Keeper) File() *File { return k.file }

// Lock locks the record for this nri-gpu: at once, or, with takeOver
// set, once the nri-gpu holding it has stopped (waiting is told its pid
// when it has to wait). A record that is only read is not locked.
func (k *Keeper) Lock(takeOver context.Context, waiting func(holder string)) error {
	switch {
	case k.file == nil || k.file.ReadOnly():
		return nil
	case takeOver == nil:
		return k.file.Lock()
	}
	return k.file.TakeOver(takeOver, waiting)
}

// Unlock lets the record go.
func (k *Keeper) Unlock() {
	if k.file != nil {
		k.file.Unlock()
	}
}

// Load reads the record back, once, at start: the pods' holdings are
// pending until TakeRestored, the claims and MPS daemons are returned
// and kept. A record that cannot be read back is set aside for the
// operator (never one that is only read: aside says where, or why not)
// and counts as lost; what Load could still read of it (the claims of a
// newer nri-gpu's record) is returned with the error.
func (k *Keeper) Load() (c Content, aside string, err error) {
	if k.file == nil {
		return Content{}, "", nil
	}
	c, err = k.file.Load()
	if err != nil {
		k.lost.Store(true)
		if !k.file.ReadOnly() {
			var aerr error
			if aside, aerr = k.file.SetAside(); aerr != nil {
				aside = aerr.Error()
			}
		}
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.pending, k.restoring, k.daemons = c.Pods, true, c.Daemons
	return c, aside, err
}

// Lost reports whether the record could not be read back at start.
func (k *Keeper) Lost() bool { return k.lost.Load() }

// Restoring reports whether the pods' holdings read at start are still
// pending.
func (k *Keeper) Restoring() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.restoring
}

// TakeRestored returns what pods hold as far as the keeper knows: what
// the record said at start, the first time (which ends its pending:
// the caller restores the pool from it); then the pool's.
func (k *Keeper) TakeRestored() []policy.Holding {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.restoring {
		k.restoring = false
		return k.pending
	}
	return k.pool.Holdings()
}

// Content returns what the record keeps: the pods' holdings (those read
// at start, while they are pending), the prepared claims and the MPS
// daemons.
func (k *Keeper) Content() Content {
	k.mu.Lock()
	pending, restoring, daemons := k.pending, k.restoring, slices.Clone(k.daemons)
	k.mu.Unlock()
	if !restoring {
		pending = k.pool.Holdings()
	}
	return Content{Pods: pending, Claims: k.pool.Claims(), Daemons: daemons}
}

// ErrNotRecorded is wrapped by Save's error: what changed is not in the
// record, and is not to be given (or started) on that account.
var ErrNotRecorded = errors.New("could not be recorded")

// Save writes the record, unless it is what was last written; it
// returns why it could not, wrapping ErrNotRecorded.
func (k *Keeper) Save() error {
	if k.file == nil {
		return nil
	}
	if err := k.file.Save(k.Content); err != nil {
		return fmt.Errorf("%w: %w", ErrNotRecorded, err)
	}
	return nil
}

// Entries returns the MPS manager's entries last kept (read at start).
func (k *Keeper) Entries() []mps.Entry {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.daemons)
}

// Keep keeps the MPS manager's entries in the record, before the manager
// acts on them, and returns why it could not.
func (k *Keeper) Keep(entries []mps.Entry) error {
	k.mu.Lock()
	k.daemons = slices.Clone(entries)
	k.mu.Unlock()
	return k.Save()
}
