package plugin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/pkg/adjust"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/inventory"
	"github.com/nri-gpu/nri-gpu/pkg/mps"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// mpsSharing is how nri-gpu shares GPUs with MPS: which GPU's daemon
// serves a container or a claim, within which bounds, and the managed
// daemons kept (start.mps.daemon: managed) through pkg/mps's Manager.
type mpsSharing struct {
	cfg config.MPS
	mgr *mps.Manager
	// start is how the managed daemons are started.
	start mps.Start
	alloc *policy.Allocations
	hw    *inventory.Inventory
	log   logrus.FieldLogger
	// state returns the plugin's state in force.
	state func() *state

	// journal keeps mgr's entries in the record.
	journal daemonJournal

	// mu is held by keep, which the checker's loop and preparing and
	// releasing a claim that runs MPS call.
	mu sync.Mutex
	// problems are the problems with the daemons logged, while they
	// last.
	problems lasting
}

// mpsGPU is an MPS-shared GPU: its daemon, and what bounds each client.
type mpsGPU struct {
	device string
	dev    specs.Device
	// share is the policy.sharing entry that shares it; nil for a GPU
	// policy.sharing leaves unshared, whose claim asked for MPS.
	share *policy.Share
	// by says who shares it with MPS, for errors.
	by     string
	daemon mps.Daemon
	// limits are a pod's, the daemon's defaults; for a claim's GPU, the
	// claim's clients'.
	limits mps.Limits
}

// of returns how device d is shared with MPS, or nil when it is not:
// by the policy.sharing entry that shares it with mps, or, for a GPU the
// entries leave unshared, by the prepared claim that holds it whole and
// asked for MPS (NVIDIA's GpuConfig). It fails for one nri-gpu cannot
// bound: a MIG device, a GPU whose memory is not known when no
// pinnedMemoryLimit is set, or a claim's GPU where nri-gpu does not run
// the daemons.
func (m *mpsSharing) of(pol *policy.Policy, snap *specs.Snapshot, d specs.Device) (*mpsGPU, error) {
	share := pol.Sharing(d)
	if share == nil {
		if c, ok := m.claimAsking(pol, d); ok {
			return m.claim(pol, snap, c)
		}
		return nil, nil
	}
	if share.Strategy != config.StrategyMPS {
		return nil, nil
	}
	g, err := m.daemonOf(snap, d, share.String())
	if err != nil {
		return nil, err
	}
	capacity := pol.Capacity(share, d)
	if capacity.Default == 0 {
		return nil, fmt.Errorf("%w: device %q: %s bounds each MPS client to an equal share of the GPU's memory, which NVML does not tell here; set its pinnedMemoryLimit or memory",
			ErrMPS, d.Name, share)
	}
	g.share = share
	g.limits = mps.Limits{ActiveThreadPercentage: share.ActiveThreadPercentage, PinnedMemoryMiB: capacity.Default >> 20}
	return g, nil
}

// claim returns the MPS daemon of a GPU policy.sharing leaves unshared
// that claim device c holds whole and asked to share with MPS among the
// claim's containers: nri-gpu runs it (start.mps.daemon: managed) while
// the claim is prepared, its clients bound to what the claim asked, else
// the whole GPU.
func (m *mpsSharing) claim(pol *policy.Policy, snap *specs.Snapshot, c policy.ClaimDevice) (*mpsGPU, error) {
	by := "the GpuConfig of the claim that holds it"
	if m.cfg.Daemon != config.MPSManaged {
		return nil, fmt.Errorf("%w: device %q: %s asks for MPS, and nri-gpu runs an MPS daemon for a claim's GPU only with start.mps.daemon: managed",
			ErrMPS, c.Name, by)
	}
	g, err := m.daemonOf(snap, c.Device, by)
	if err != nil {
		return nil, err
	}
	threads, memory := pol.MPSBounds(nil, c.Device, c.Use)
	g.limits = mps.Limits{ActiveThreadPercentage: cmp.Or(c.GpuConfig.ActiveThreadPercentage, threads), PinnedMemoryMiB: cmp.Or(c.GpuConfig.PinnedMemory, memory) >> 20}
	return g, nil
}

// claimAsking returns the device of a prepared claim that is d and
// that the claim has MPS run on for itself (ownMPS).
func (m *mpsSharing) claimAsking(pol *policy.Policy, d specs.Device) (policy.ClaimDevice, bool) {
	for _, h := range m.alloc.Claims() {
		for _, c := range h.Devices {
			if c.Same(d) && ownMPS(pol, c) {
				return c, true
			}
		}
	}
	return policy.ClaimDevice{}, false
}

// daemonOf returns the daemon of device d, which by shares with MPS:
// named by its GPU's UUID (else its name), never of a MIG device.
func (m *mpsSharing) daemonOf(snap *specs.Snapshot, d specs.Device, by string) (*mpsGPU, error) {
	id := inventory.Identify(snap, d)
	if id.MIG {
		return nil, fmt.Errorf("%w: device %q: %s shares it with MPS, which nri-gpu does not do for MIG devices (nor does NVIDIA's device plugin); share MIG devices with strategy timeSlicing",
			ErrMPS, d.Name, by)
	}
	layout := mps.Layout{Control: m.cfg.ControlCommand, Root: m.cfg.Root, HostRoot: m.cfg.HostRoot}
	daemon, err := layout.Daemon(m.hw.UUID(snap, d), id.Name) // no UUID: NVML does not know it either
	if err != nil {
		return nil, fmt.Errorf("%w: device %q: %w", ErrMPS, d.Name, err)
	}
	return &mpsGPU{device: d.Name, dev: d, by: by, daemon: daemon}, nil
}

// limitsOf returns the bounds of a client that consumes c.Use of the GPU
// (a claim's allocation; zero for a pod's, the daemon's defaults), within
// what the claim asked (c.Asked). A claim's whole GPU's are its daemon's.
func (g *mpsGPU) limitsOf(pol *policy.Policy, c policy.ClaimDevice) mps.Limits {
	if g.share == nil {
		return g.limits
	}
	threads, memory := pol.MPSBounds(g.share, g.dev, c.Use)
	if a := c.GpuConfig.ActiveThreadPercentage; a > 0 {
		threads = min(threads, a)
	}
	if a := c.GpuConfig.PinnedMemory; a > 0 {
		memory = min(memory, a)
	}
	return mps.Limits{ActiveThreadPercentage: threads, PinnedMemoryMiB: memory >> 20}
}

// edits returns what a container given devices needs of MPS: for its
// MPS-shared GPU (one at most: a client reaches one daemon), the
// daemon's directories and the client's limits, once the daemon answers.
// A container of an MPS-shared GPU whose daemon does not run is refused:
// never given the GPU unbounded.
func (m *mpsSharing) edits(ctx context.Context, pol *policy.Policy, snap *specs.Snapshot, devices []specs.Device, uses map[string]policy.ClaimDevice) ([]adjust.Extra, error) {
	var (
		gpus []*mpsGPU
		errs []error
		// use is what the container's claims consume of its GPU, and
		// asked of its bounds.
		use policy.ClaimDevice
	)
	for _, d := range devices {
		g, err := m.of(pol, snap, d)
		if err != nil {
			errs = append(errs, err)
		}
		if g != nil && !slices.ContainsFunc(gpus, func(o *mpsGPU) bool { return o.daemon.Dir == g.daemon.Dir }) {
			gpus = append(gpus, g)
		}
		if u, ok := uses[d.Name]; ok && g != nil {
			use = u
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	switch len(gpus) {
	case 0:
		return nil, nil
	case 1:
	default:
		var names []string
		for _, g := range gpus {
			names = append(names, fmt.Sprintf("%q", g.device))
		}
		return nil, fmt.Errorf("%w: the container would have %d MPS-shared GPUs (%s), and an MPS client reaches one GPU's daemon; give each container one of them",
			ErrMPS, len(gpus), strings.Join(names, ", "))
	}
	g := gpus[0]
	if err := m.serves(ctx, g); err != nil {
		how := fmt.Sprintf("run one with CUDA_MPS_PIPE_DIRECTORY=%s, CUDA_MPS_LOG_DIRECTORY=%s and %s as its /dev/shm (mps.daemon: external)",
			g.daemon.PipeDir(), g.daemon.LogDir(), g.daemon.ShmDir())
		if m.cfg.Daemon == config.MPSManaged {
			how = "nri-gpu starts it (mps.daemon: managed): its log says why it could not"
		}
		return nil, fmt.Errorf("%w: device %q: %s shares it with MPS, but %v; nri-gpu does not give an MPS-shared GPU unbounded: %s",
			ErrMPS, g.device, g.by, err, how)
	}
	return []adjust.Extra{{Name: fmt.Sprintf("MPS of %s", g.device), Edits: g.daemon.ClientEdits(g.limitsOf(pol, use))}}, nil
}

// serves returns nil when g's daemon is ready for clients (with
// mps.daemon: managed, the one nri-gpu keeps), and why not otherwise.
func (m *mpsSharing) serves(ctx context.Context, g *mpsGPU) error {
	return m.mgr.Ready(ctx, g.daemon)
}

// daemons returns the daemons of every GPU the policy shares with
// MPS, by directory, and the problems of those it cannot bound.
func (m *mpsSharing) daemons(st *state) (map[string]*mpsGPU, []error) {
	snap := st.specs.Snapshot()
	pol := m.hw.PolicyIn(st.policy, snap)
	out := map[string]*mpsGPU{}
	var errs []error
	for _, d := range inventory.Hardware(snap, st.policy, st.cfg.DefaultKind, []string{"*"}, nil) {
		g, err := m.of(pol, snap, d)
		switch {
		case err != nil:
			errs = append(errs, err)
		case g != nil:
			out[g.daemon.Dir] = g
		}
	}
	return out, errs
}

// keep has the MPS manager, with mps.daemon: managed, keep the control
// daemon of each GPU the policy shares with MPS running, and stop those
// it kept whose GPU it no longer shares so, and logs what it did; the
// manager keeps each step in the record before it takes it, and undoes
// one on a deadline of its own. Daemons are left running when nri-gpu
// exits, so that running clients keep their server through a restart of
// nri-gpu; the next one finds them in the record, answering. It returns
// what the manager could not do.
func (m *mpsSharing) keep(ctx context.Context) []error {
	m.mu.Lock()
	defer m.mu.Unlock()
	want, problems := m.wanted()
	events, errs := m.mgr.Sync(ctx, want)
	m.report(events, append(problems, errs...))
	return errs
}

// wanted returns the daemons of every GPU the policy in force shares
// with MPS, and the problems of those it cannot bound.
func (m *mpsSharing) wanted() ([]mps.Want, []error) {
	daemons, errs := m.daemons(m.state())
	want := make([]mps.Want, 0, len(daemons))
	for _, dir := range slices.Sorted(maps.Keys(daemons)) {
		g := daemons[dir]
		want = append(want, mps.Want{Device: g.device, Daemon: g.daemon, Limits: g.limits})
	}
	return want, errs
}

// report logs what the manager did, and each problem once while it
// lasts.
func (m *mpsSharing) report(events []mps.Event, errs []error) {
	for _, e := range events {
		log := m.log.WithFields(logrus.Fields{"device": e.Device, "activeThreadPercentage": e.Limits.ActiveThreadPercentage, "pinnedMemoryMiB": e.Limits.PinnedMemoryMiB})
		switch e.What {
		case mps.Started:
			log.WithField("pipe", e.Daemon.PipeDir()).Info("started MPS control daemon")
		case mps.LimitsSet:
			log.Info("set the MPS control daemon's limits, for its next server")
		case mps.Stopped:
			m.log.WithField("dir", e.Daemon.Dir).Info("stopped MPS control daemon: its GPU is no longer shared with MPS")
		case mps.Exclusive:
			m.log.WithFields(logrus.Fields{"device": e.Device, "uuid": e.Daemon.GPU, "was": e.Was}).
				Info("put the GPU in Exclusive_Process compute mode while it is shared with MPS")
		case mps.Restored:
			m.log.WithFields(logrus.Fields{"uuid": e.Daemon.GPU, "mode": e.Was}).Info("put the GPU back in its compute mode: it is no longer shared with MPS")
		case mps.RolledBack:
			m.log.WithFields(logrus.Fields{"dir": e.Daemon.Dir, "uuid": e.Daemon.GPU, "mode": e.Was}).Warn("rolled back the start of an MPS control daemon that did not finish: stopped, its GPU back in its compute mode")
		}
	}
	current := map[string]string{}
	for _, err := range errs {
		current[err.Error()] = ""
	}
	appeared, _ := m.problems.update(current)
	for _, msg := range appeared {
		m.log.Warn(msg)
	}
}

// run keeps the daemons every start.mps.checkInterval, until ctx is
// done.
func (m *mpsSharing) run(ctx context.Context) {
	m.mgr.Run(ctx, m.cfg.CheckInterval, func() ([]mps.Want, []error) {
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.wanted()
	}, m.report)
}

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

// MPSShmCommand is nri-gpu's command that mounts a directory on /dev/shm
// and runs a program (startInShm).
const MPSShmCommand = "mps-shm"

// Shared is a device policy.sharing shares, as explain and devices show
// it.
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

// SharedDevices returns the devices of the default kind that the policy
// in force shares, or a claim that holds one whole shares with MPS among
// its containers, who uses each and, for MPS, each client's bounds.
func (p *Plugin) SharedDevices() []Shared {
	st := p.state()
	snap := st.specs.Snapshot()
	pol := p.hw.PolicyIn(st.policy, snap)
	var out []Shared
	for _, d := range inventory.Hardware(snap, st.policy, st.cfg.DefaultKind, []string{"*"}, nil) {
		sharing := ""
		if share := pol.Sharing(d); share != nil {
			sharing = share.String()
		} else if _, ok := p.mps.claimAsking(pol, d); ok {
			sharing = "mps, for the claim that holds it (its GpuConfig)"
		} else {
			continue
		}
		s := Shared{Device: d.Name, Sharing: sharing, Users: p.alloc.Users(d)}
		if g, err := p.mps.of(pol, snap, d); err != nil {
			s.Limits = err.Error()
		} else if g != nil {
			s.Limits = fmt.Sprintf("each client %d%% of compute, %d MiB of pinned memory; daemon in %s", g.limits.ActiveThreadPercentage, g.limits.PinnedMemoryMiB, g.daemon.Dir)
		}
		out = append(out, s)
	}
	return out
}
