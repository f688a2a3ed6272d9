package plugin

import (
	"fmt"
	"slices"
	"sync"

	"github.com/nri-gpu/nri-gpu/pkg/mps"
)

// daemonJournal keeps the MPS manager's entries in the record, with what
// pods and claims hold.
type daemonJournal struct {
	mu      sync.Mutex
	entries []mps.Entry
	// rec writes the record.
	rec interface{ saveAndNotify() error }
}

var _ mps.Journal = (*daemonJournal)(nil)

// Entries returns the entries last kept (read from the record at start).
func (j *daemonJournal) Entries() []mps.Entry {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Clone(j.entries)
}

// Keep keeps entries in the record, and returns why it could not.
func (j *daemonJournal) Keep(entries []mps.Entry) error {
	j.mu.Lock()
	j.entries = slices.Clone(entries)
	j.mu.Unlock()
	if err := j.rec.saveAndNotify(); err != nil {
		return fmt.Errorf("%w: %w", ErrNotRecorded, err)
	}
	return nil
}
