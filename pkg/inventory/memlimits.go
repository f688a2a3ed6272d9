package inventory

import (
	"fmt"

	"github.com/nri-gpu/nri-gpu/pkg/memlimit"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// Cgroups is where the containers' cgroups are found: the proc
// filesystem and the cgroup v2 mount (memlimit.Cgroups).
func (inv *Inventory) Cgroups() memlimit.Cgroups { return inv.cgroups }

// SetCgroups makes c where the containers' cgroups are found (tests: a
// node's other proc and cgroup roots). It is called before any question.
func (inv *Inventory) SetCgroups(c memlimit.Cgroups) { inv.cgroups = c }

// support is whether the driver can bound GPU memory per cgroup here,
// asked once, when a holder first needs it; nil where NVML does not
// open (then why says why).
func (inv *Inventory) support() (*memlimit.Support, error) {
	inv.limitsOnce.Do(func() {
		s, err := memlimit.Probe(inv.Lib(), inv.cgroups)
		if err != nil {
			inv.limitsErr = fmt.Errorf("%w: %w", memlimit.ErrUnenforceable, err)
			return
		}
		inv.limits = &s
		if why := s.Why(); len(why) > 0 {
			inv.say("GPU memory limits: the driver cannot bound holders' memory here: %v", why)
		} else if s.Dmem != nil {
			inv.say("GPU memory limits: %v (%s)", s.Dmem, memlimit.DmemHint)
		}
	})
	return inv.limits, inv.limitsErr
}

// Bounding returns why the driver cannot bound the memory of a holder of
// a device of snap to what the pool gave it (nil where it can): NVML does
// not open, cgroup v1, a driver without per-cgroup limits, a MIG device,
// a GPU that answers NOT_SUPPORTED. The policy reads it for every door
// (PolicyIn); the node is asked once, when a device first needs it.
func (inv *Inventory) Bounding(snap *specs.Snapshot) func(specs.Device) error {
	return func(d specs.Device) error {
		if Identify(snap, d).MIG {
			return fmt.Errorf("%w: %s is a MIG device (the driver limits whole GPUs only)", memlimit.ErrUnenforceable, d.Name)
		}
		s, err := inv.support()
		switch {
		case err != nil:
			return err
		case s.Cgroup != nil:
			return s.Cgroup
		case s.Driver != nil:
			return s.Driver
		}
		uuid := inv.UUID(snap, d)
		for _, g := range s.GPUs {
			if g.UUID == uuid {
				return g.Err
			}
		}
		return fmt.Errorf("%w: NVML does not list the GPU of %s", memlimit.ErrUnenforceable, d.Name)
	}
}
