package policy

import (
	"errors"
	"fmt"

	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// RuleMemoryLimits names policy.memoryLimits in denials.
const RuleMemoryLimits = "memoryLimits"

// errBoundsUnknown is why the driver's bounds are taken as impossible
// where no one told the policy (WithBounding).
var errBoundsUnknown = errors.New("whether the driver can bound GPU memory here is not known")

// errNotCounted is why memory a claim asks of a device whose memory is
// not counted (NVML does not tell it, the entry sets none) is not bound.
var errNotCounted = errors.New("the device's memory is not known: set the entry's memory")

// WithBounding returns a copy of p that knows why the driver cannot
// bound the memory of a device's holders on this node (nil where it
// can): cgroup v1, a driver without per-cgroup limits, a MIG device.
func (p *Policy) WithBounding(why func(specs.Device) error) *Policy {
	c := *p
	c.bounding = why
	return &c
}

// MemoryBound says whether each holder of device d is to be bounded by
// the driver to the memory the pool gave it (counted: an entry shares d
// with its memory counted; a device held whole needs no bound), and,
// where it is, why the driver cannot bound it here (nil where it can).
// MPS bounds its clients itself (their pinned-memory limit): the
// driver's bound is a second one, counted only where the driver can set
// it, and never a reason to refuse.
func (p *Policy) MemoryBound(d specs.Device) (counted bool, why error) {
	s := p.Sharing(d)
	if s == nil || p.Capacity(s, d).Memory == 0 {
		return false, nil
	}
	why = p.DriverBounds(d)
	if s.Strategy == config.StrategyMPS {
		return why == nil, nil
	}
	return true, why
}

// DriverBounds returns why the driver cannot bound the memory of a
// holder of d here, nil where it can, whether or not the policy counts
// d's memory (a container may ask limits of its own).
func (p *Policy) DriverBounds(d specs.Device) error {
	if p.bounding == nil {
		return errBoundsUnknown
	}
	return p.bounding(d)
}

// Agreement reports whether holders the driver cannot bound run bounded
// only by agreement (policy.memoryLimits: agreement).
func (p *Policy) Agreement() bool { return p.memoryLimits == config.MemoryLimitsAgreement }

// bounded refuses, under policy.memoryLimits: enforced, a device whose
// holders' memory a timeSlicing entry counts where the driver cannot
// bound it to what the pool gives each; one whose entry makes memory a
// scheduling quota (memoryQuota) is bounded only by agreement there.
func (q *question) bounded() []error {
	return q.each(named, func(d Asked) error {
		counted, why := q.p.MemoryBound(d.Device)
		if !counted || why == nil || q.p.Agreement() || q.p.Sharing(d.Device).MemoryQuota {
			return nil
		}
		return q.claimed(deny(RuleMemoryLimits, fmt.Errorf("%w: device %q: %s counts each holder's memory, which the driver cannot bound here: %w; set policy.memoryLimits: agreement to run its holders bounded only by agreement",
			ErrDenied, d.Name, q.p.Sharing(d.Device), why)))
	})
}
