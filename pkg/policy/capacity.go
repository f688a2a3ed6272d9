package policy

import (
	"cmp"
	"fmt"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// Capacity is what one shared device offers its users, all doors
// together: replicas (shares) and memory. Each user consumes some of
// both: a pod (whatever door it came through) one share and the default
// memory, a DRA claim what kube-scheduler allocated it (consumable
// capacity), and the device takes no user past either.
type Capacity struct {
	// Shares is the entry's replicas.
	Shares int
	// Memory is the device's memory in bytes, rounded down to Step; 0
	// when it is not known (no NVML and no policy.sharing[].memory),
	// and then memory is not counted (Default is then the entry's, 0
	// when it sets none).
	Memory int64
	// Default is what a user that asks for no amount consumes; Minimum
	// and Maximum bound what a claim may ask for, in multiples of Step.
	Default, Minimum, Maximum, Step int64
}

// Use is what one user consumes of a shared device. The zero Use is a
// user that asked for no amount: one share and the default memory.
type Use struct {
	Shares int
	Memory int64
}

// IsZero reports whether u asked for no amount.
func (u Use) IsZero() bool { return u == Use{} }

// String writes u for messages: "1 share and 20Gi of memory".
func (u Use) String() string {
	s := fmt.Sprintf("%d shares", u.Shares)
	if u.Shares == 1 {
		s = "1 share"
	}
	if u.Memory > 0 {
		s += " and " + Quantity(u.Memory) + " of memory"
	}
	return s
}

// Quantity writes bytes as Kubernetes writes a quantity ("20Gi").
func Quantity(bytes int64) string { return resource.NewQuantity(bytes, resource.BinarySI).String() }

// WithMemory returns a copy of p that knows each device's memory in bytes
// (NVML's; 0 when unknown), for the capacity of the devices it shares
// whose policy.sharing entry does not set memory.
func (p *Policy) WithMemory(memory func(specs.Device) int64) *Policy {
	c := *p
	c.memory = memory
	return &c
}

// Capacity returns what device d offers its users under s (see
// Capacity). The entry's memory, else the device's as WithMemory tells
// it, is rounded down to memoryRequest.step; the default is
// memoryRequest.default, else pinnedMemoryLimit, else the memory divided
// by the replicas, rounded down to the step and within minimum and
// maximum.
func (p *Policy) Capacity(s *SharingEntry, d specs.Device) Capacity {
	a := s.amounts
	c := Capacity{Shares: s.Replicas, Step: a.Step}
	c.Memory = a.Memory
	if c.Memory == 0 && p.memory != nil {
		c.Memory = p.memory(d)
	}
	c.Memory -= c.Memory % c.Step
	c.Default = cmp.Or(a.Default, s.PinnedMemory)
	if c.Memory < c.Step {
		// Not counted; what a user is bound to (MPS) is the entry's.
		return Capacity{Shares: s.Replicas, Default: c.Default}
	}
	c.Minimum = max(a.Minimum, c.Step)
	c.Maximum = c.Memory
	if a.Maximum > 0 {
		c.Maximum = min(a.Maximum, c.Memory)
	}
	if c.Default == 0 {
		c.Default = c.Memory / int64(s.Replicas)
	}
	c.Default -= c.Default % c.Step
	c.Default = min(max(c.Default, c.Minimum), c.Maximum)
	return c
}

// use returns what u consumes of c: what it does not say (the zero Use,
// a claim allocated before the device offered what it says) is one
// share and the default memory.
func (c Capacity) use(u Use) Use {
	if u.Shares == 0 {
		u.Shares = 1
	}
	switch {
	case c.Memory == 0:
		u.Memory = 0
	case u.Memory == 0:
		u.Memory = c.Default
	}
	return u
}

// fits reports whether u may be had beside used.
func (c Capacity) fits(used, u Use) bool {
	u = c.use(u)
	return used.Shares+u.Shares <= c.Shares && (c.Memory == 0 || used.Memory+u.Memory <= c.Memory)
}

// usersLeft returns how many more users that ask for no amount fit beside
// used.
func (c Capacity) usersLeft(used Use) int {
	n := c.Shares - used.Shares
	if c.Memory > 0 && c.Default > 0 {
		n = min(n, int((c.Memory-used.Memory)/c.Default))
	}
	return max(0, n)
}

// Left returns what is left of c beside used.
func (c Capacity) Left(used Use) Use {
	return Use{Shares: max(0, c.Shares-used.Shares), Memory: max(0, c.Memory-used.Memory)}
}

// GpuConfig is what a claim asked of how its device is shared (NVIDIA's
// GpuConfig opaque parameters): a strategy, and for MPS bounds of its
// clients tighter than those its allocation allows (0: none asked).
type GpuConfig struct {
	Strategy               config.Strategy
	ActiveThreadPercentage int
	PinnedMemory           int64
}

// MPSBounds returns the bounds of an MPS client of device d that consumes
// u of it under s (a pod's u is zero): its memory (the default where u
// names none) and the entry's compute share for each of its shares, at
// most the whole GPU. Where s is nil (a GPU a claim holds whole), they
// are the whole GPU: all its compute, and its memory (0 where unknown).
func (p *Policy) MPSBounds(s *SharingEntry, d specs.Device, u Use) (threads int, memory int64) {
	if s == nil {
		if p.memory != nil {
			memory = p.memory(d)
		}
		return 100, memory
	}
	c := p.Capacity(s, d)
	memory = c.Default
	if u.Memory > 0 {
		memory = u.Memory
	}
	return min(100, s.ActiveThreadPercentage*max(1, u.Shares)), memory
}

// checkAsked refuses what a claim asked of device d's sharing beyond
// what the operator's policy.sharing gives it: MPS where the GPU is
// shared by time-slicing (its other users are no clients of a daemon),
// time-slicing where it is shared with MPS (its clients would leave the
// daemon's bounds), bounds above those its allocation allows. A GPU
// policy.sharing leaves unshared is the claim's whole: it may have it
// shared with MPS among its own containers, within the whole GPU.
func (p *Policy) checkAsked(c Claim, d ClaimDevice) error {
	a := d.GpuConfig
	s := p.Sharing(d.Device)
	how := "not shared"
	if s != nil {
		how = "shared by " + s.String()
	}
	refuse := func(format string, args ...any) error {
		return deny(RuleSharing, fmt.Errorf("%s: %w: device %q is %s, and the claim's GpuConfig asks for %s; ask for no more than policy.sharing gives it",
			c, ErrDenied, d.Name, how, fmt.Sprintf(format, args...)))
	}
	switch a.Strategy {
	case config.StrategyMPS:
		if s != nil && s.Strategy != config.StrategyMPS {
			return refuse("MPS, whose bounds its other users, not clients of a daemon, would not keep")
		}
		threads, memory := p.MPSBounds(s, d.Device, d.Use)
		if a.ActiveThreadPercentage > threads {
			return refuse("%d%% of compute, more than the %d%% it is allowed", a.ActiveThreadPercentage, threads)
		}
		if memory > 0 && a.PinnedMemory > memory {
			return refuse("%s of pinned memory, more than the %s it is allowed", Quantity(a.PinnedMemory), Quantity(memory))
		}
	case config.StrategyTimeSlicing:
		if s != nil && s.Strategy == config.StrategyMPS {
			return refuse("time-slicing, which would take its clients out of the MPS daemon's bounds")
		}
	}
	return nil
}
