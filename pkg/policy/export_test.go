package policy

import "time"

// SetClock makes now the pool's clock.
func SetClock(a *Allocations, now func() time.Time) { a.now = now }
