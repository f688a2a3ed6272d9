package policy

import (
	"cmp"
	"errors"
	"fmt"

	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// ErrMPSUnbounded is wrapped by the error for a device shared with MPS
// whose clients the policy cannot bound.
var ErrMPSUnbounded = errors.New("MPS clients cannot be bounded")

// MPS is how a device is shared with MPS: by the policy.sharing entry
// that shares it with mps, or, for a GPU the entries leave unshared, by
// the prepared claim that holds it whole and asked for MPS (its
// GpuConfig): nri-gpu then runs a daemon for the claim's containers.
type MPS struct {
	// By says who shares it, for messages.
	By string
	// Entry is the policy.sharing entry; nil for a claim's own.
	Entry *SharingEntry
	// Claim is the claim's device, for a claim's own.
	Claim *ClaimDevice
	// Threads (percent of the GPU's compute) and Memory (bytes) bound
	// each client the daemon serves by default.
	Threads int
	Memory  int64
}

// ClaimsOwnMPS is who shares a GPU with MPS for a claim, in messages.
const ClaimsOwnMPS = "the GpuConfig of the claim that holds it"

// MPSOf returns how device d is shared with MPS under p, given the
// prepared claims, or nil when it is not; it fails for a GPU whose
// clients cannot be bounded: its entry bounds each to an equal share of
// memory NVML does not tell.
func (p *Policy) MPSOf(d specs.Device, claims []ClaimHolding) (*MPS, error) {
	share := p.Sharing(d)
	if share == nil {
		for _, h := range claims {
			for i, c := range h.Devices {
				if c.Same(d) && p.OwnMPS(c) {
					threads, memory := p.MPSBounds(nil, c.Device, c.Use)
					return &MPS{By: ClaimsOwnMPS, Claim: &h.Devices[i],
						Threads: cmp.Or(c.GpuConfig.ActiveThreadPercentage, threads), Memory: cmp.Or(c.GpuConfig.PinnedMemory, memory)}, nil
				}
			}
		}
		return nil, nil
	}
	if share.Strategy != config.StrategyMPS {
		return nil, nil
	}
	capacity := p.Capacity(share, d)
	if capacity.Default == 0 {
		return nil, fmt.Errorf("%w: device %q: %s bounds each MPS client to an equal share of the GPU's memory, which NVML does not tell here; set its pinnedMemoryLimit or memory",
			ErrMPSUnbounded, d.Name, share)
	}
	return &MPS{By: share.String(), Entry: share, Threads: share.ActiveThreadPercentage, Memory: capacity.Default}, nil
}

// OwnMPS reports whether claim device d asks for MPS on a GPU
// policy.sharing leaves unshared: one the claim has MPS run on for
// itself.
func (p *Policy) OwnMPS(d ClaimDevice) bool {
	return d.GpuConfig.Strategy == config.StrategyMPS && p.Sharing(d.Device) == nil
}

// Client returns the bounds of a client of m's daemon on device d that
// consumes c.Use of it (a claim's allocation; zero for a pod's: the
// daemon's defaults), within what the claim asked (c.GpuConfig). The
// clients of a claim's own daemon have its defaults.
func (p *Policy) Client(m *MPS, d specs.Device, c ClaimDevice) (threads int, memory int64) {
	if m.Entry == nil {
		return m.Threads, m.Memory
	}
	threads, memory = p.MPSBounds(m.Entry, d, c.Use)
	if a := c.GpuConfig.ActiveThreadPercentage; a > 0 {
		threads = min(threads, a)
	}
	if a := c.GpuConfig.PinnedMemory; a > 0 {
		memory = min(memory, a)
	}
	return threads, memory
}
