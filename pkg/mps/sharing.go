package mps

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nri-gpu/nri-gpu/pkg/inventory"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// Sharing is MPS on the node as one snapshot of the specs shows it: the
// policy (bound to the snapshot: policy.MPS says which devices MPS
// shares, by which entry or claim, within which bounds), the hardware
// (which GPU each device is) and where the daemons are.
type Sharing struct {
	// Layout is where the daemons are and what runs them.
	Layout Layout
	// Managed says nri-gpu runs the daemons (start.mps.daemon: managed).
	Managed bool
	// Policy is the policy in force, bound to Snapshot.
	Policy   *policy.Policy
	Snapshot *specs.Snapshot
	Hardware *inventory.Inventory
	// Claims are the prepared claims (a claim may ask for MPS on a GPU
	// the policy leaves unshared).
	Claims []policy.ClaimHolding
}

// Of returns device d's daemon where MPS shares it, with its clients'
// default limits, and how the policy shares it (nil, nil: it does not).
// It fails (ErrNotServed) for what nri-gpu cannot bound: a MIG device
// (nor does NVIDIA's device plugin share one with MPS), a GPU of unknown
// memory, a claim's GPU where nri-gpu runs no daemon.
func (s Sharing) Of(d specs.Device) (*Want, *policy.MPS, error) {
	m, err := s.Policy.MPSOf(d, s.Claims)
	if m == nil && err == nil {
		return nil, nil, nil
	}
	id := inventory.Identify(s.Snapshot, d)
	switch by := policy.ClaimsOwnMPS; {
	case id.MIG:
		if share := s.Policy.Sharing(d); share != nil {
			by = share.String()
		}
		return nil, nil, fmt.Errorf("%w: device %q: %s shares it with MPS, which nri-gpu does not do for MIG devices (nor does NVIDIA's device plugin); share MIG devices with strategy timeSlicing", ErrNotServed, d.Name, by)
	case err != nil:
		return nil, nil, fmt.Errorf("%w: %w", ErrNotServed, err)
	case m.Claim != nil && !s.Managed:
		return nil, nil, fmt.Errorf("%w: device %q: %s asks for MPS, and nri-gpu runs an MPS daemon for a claim's GPU only with start.mps.daemon: managed", ErrNotServed, d.Name, m.By)
	}
	daemon, err := s.Layout.Daemon(s.Hardware.UUID(s.Snapshot, d), id.Name) // no UUID: NVML does not know it either
	if err != nil {
		return nil, nil, fmt.Errorf("%w: device %q: %w", ErrNotServed, d.Name, err)
	}
	return &Want{Device: d.Name, By: m.By, Daemon: daemon, Limits: limitsOf(m.Threads, m.Memory)}, m, nil
}

// limitsOf is the Limits of threads (percent) and memory (bytes).
func limitsOf(threads int, memory int64) Limits {
	return Limits{ActiveThreadPercentage: threads, PinnedMemoryMiB: memory >> 20}
}

// Own returns the daemons of the GPUs a claim, one of s.Claims, asks
// MPS of for itself (policy.OwnMPS: the policy leaves them unshared), of
// asked, its devices; and why one cannot be had, naming the claim.
func (s Sharing) Own(claim policy.Claim, asked []policy.Asked) ([]Want, error) {
	var (
		own  []Want
		errs []error
	)
	for _, d := range asked {
		if d.Claim == nil || !s.Policy.OwnMPS(*d.Claim) {
			continue
		}
		switch w, _, err := s.Of(d.Device); {
		case err != nil:
			errs = append(errs, fmt.Errorf("%s: %w", claim, err))
		case w != nil: // nil: the claim is not among s.Claims
			own = append(own, *w)
		}
	}
	return own, errors.Join(errs...)
}

// ClientLimits returns the bounds of a client of m's daemon on device d
// that consumes c of it (a claim's device; zero for a pod's: the
// daemon's defaults), as the policy gives them.
func (s Sharing) ClientLimits(m *policy.MPS, d specs.Device, c policy.ClaimDevice) Limits {
	return limitsOf(s.Policy.Client(m, d, c))
}

// UserLimits returns the bounds of a client of m's daemon on device d
// that is user u's: a claim's (one of s.Claims) by what it consumes of
// d, a pod's the daemon's defaults.
func (s Sharing) UserLimits(m *policy.MPS, d specs.Device, u policy.User) Limits {
	var use policy.ClaimDevice // a pod's: the daemon's defaults
	for _, c := range s.Claims {
		if u.Claim == nil || c.Claim.UID != u.Claim.UID {
			continue
		}
		if i := slices.IndexFunc(c.Devices, func(c policy.ClaimDevice) bool { return c.Overlaps(d) }); i >= 0 {
			use = c.Devices[i]
		}
	}
	return s.ClientLimits(m, d, use)
}

// Wanted returns the daemon of every GPU of kind that MPS shares, one
// per daemon, by directory, and the problems of those it cannot bound.
func (s Sharing) Wanted(kind string) ([]Want, []error) {
	var (
		want []Want
		errs []error
	)
	for _, d := range inventory.Hardware(s.Snapshot, s.Policy, kind, []string{"*"}, nil) {
		switch w, _, err := s.Of(d); {
		case err != nil:
			errs = append(errs, err)
		case w != nil:
			want = append(want, *w)
		}
	}
	slices.SortFunc(want, func(a, b Want) int { return strings.Compare(a.Daemon.Dir, b.Daemon.Dir) })
	return want, errs
}

// Edits returns what a container given devices needs of MPS, and the
// device it is for: its one MPS-shared GPU's client edits, bound by what
// its claims consume and asked (uses, by device name), once m says the
// daemon is ready (Manager.Client); nil for none.
func (s Sharing) Edits(ctx context.Context, m *Manager, devices []specs.Device, uses map[string]policy.ClaimDevice) (*cdispec.ContainerEdits, string, error) {
	var (
		gpus   []Want
		errs   []error
		limits Limits
	)
	for _, d := range devices {
		w, p, err := s.Of(d)
		if err != nil {
			errs = append(errs, err)
		}
		if w != nil && !slices.ContainsFunc(gpus, func(o Want) bool { return o.Daemon.Dir == w.Daemon.Dir }) {
			gpus, limits = append(gpus, *w), s.ClientLimits(p, d, uses[d.Name])
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, "", err
	}
	edits, err := m.Client(ctx, gpus, limits)
	if edits == nil {
		return nil, "", err
	}
	return edits, gpus[0].Device, nil
}

// Shared is a device that is shared, as explain and devices show it.
type Shared struct {
	// Device is its name (the first of its names).
	Device string `json:"device"`
	// Sharing is the policy.sharing entry that shares it.
	Sharing string `json:"sharing"`
	// Users are the pods and claims that use it now.
	Users []string `json:"users"`
	// Limits are each MPS client's bounds ("" for time-slicing), or why
	// it cannot be bounded.
	Limits string `json:"limits,omitempty"`
}

// Shared returns the devices of kind that the policy shares, or a claim
// that holds one whole shares with MPS among its containers, who uses
// each (as users says: the pool's users of the device) and, for MPS,
// each client's bounds.
func (s Sharing) Shared(kind string, users func(specs.Device) []string) []Shared {
	var out []Shared
	for _, d := range inventory.Hardware(s.Snapshot, s.Policy, kind, []string{"*"}, nil) {
		m, _ := s.Policy.MPSOf(d, s.Claims)
		sharing := ""
		switch share := s.Policy.Sharing(d); {
		case share != nil:
			sharing = share.String()
		case m != nil:
			sharing = "mps, for the claim that holds it (its GpuConfig)"
		default:
			continue
		}
		shared := Shared{Device: d.Name, Sharing: sharing, Users: users(d)}
		if w, _, err := s.Of(d); err != nil {
			shared.Limits = err.Error()
		} else if w != nil {
			shared.Limits = fmt.Sprintf("each client %d%% of compute, %d MiB of pinned memory; daemon in %s", w.Limits.ActiveThreadPercentage, w.Limits.PinnedMemoryMiB, w.Daemon.Dir)
		}
		out = append(out, shared)
	}
	return out
}
