package plugin

import (
	"context"
	"sync"

	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/internal/lasting"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/inventory"
	"github.com/nri-gpu/nri-gpu/pkg/mps"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// mpsSharing is the glue of MPS: the policy says which devices MPS
// shares and within which bounds (policy.MPS), the inventory which GPU
// each is, and pkg/mps's Manager runs their daemons (start.mps.daemon:
// managed), recording each step (journal).
type mpsSharing struct {
	cfg     config.MPS
	mgr     *mps.Manager
	alloc   *policy.Allocations
	hw      *inventory.Inventory
	log     logrus.FieldLogger
	current interface{ state() *state }
	// mu serializes keep; problems are logged once while they last.
	mu       sync.Mutex
	problems lasting.Problems
}

// sharing returns MPS on the node as snap shows it, under pol (bound to
// snap).
func (m *mpsSharing) sharing(pol *policy.Policy, snap *specs.Snapshot) mps.Sharing {
	return mps.Sharing{
		Layout:  mps.Layout{Control: m.cfg.ControlCommand, Root: m.cfg.Root, HostRoot: m.cfg.HostRoot},
		Managed: m.cfg.Daemon == config.MPSManaged, Policy: pol, Snapshot: snap, Hardware: m.hw, Claims: m.alloc.Claims(),
	}
}

// wanted returns the daemons of every GPU MPS shares under the state in
// force, and the problems of those it cannot bound.
func (m *mpsSharing) wanted() ([]mps.Want, []error) {
	st := m.current.state()
	snap := st.specs.Snapshot()
	return m.sharing(m.hw.PolicyIn(st.policy, snap), snap).Wanted(st.cfg.DefaultKind)
}

// sync brings the daemons in line once (after a claim's preparation or release),
// logs what was done and returns what could not be.
func (m *mpsSharing) sync(ctx context.Context) []error {
	m.mu.Lock()
	defer m.mu.Unlock()
	want, problems := m.wanted()
	events, errs := m.mgr.Sync(ctx, want)
	m.report(events, append(problems, errs...))
	return errs
}

// run keeps the daemons every start.mps.checkInterval until ctx is done.
// Daemons are left running when nri-gpu exits: the next one finds them
// in the record.
func (m *mpsSharing) run(ctx context.Context) {
	m.mgr.Run(ctx, m.cfg.CheckInterval, func() ([]mps.Want, []error) {
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.wanted()
	}, m.report)
}

// report logs what the manager did, and each problem once while it
// lasts.
func (m *mpsSharing) report(events []mps.Event, errs []error) {
	for _, e := range events {
		log := m.log.WithFields(logrus.Fields{"device": e.Device, "uuid": e.Daemon.GPU, "dir": e.Daemon.Dir})
		if msg, warn := e.Message(); warn {
			log.Warn(msg)
		} else {
			log.Info(msg)
		}
	}
	current := map[string]string{}
	for _, err := range errs {
		current[err.Error()] = ""
	}
	appeared, _ := m.problems.Update(current)
	for _, msg := range appeared {
		m.log.Warn(msg)
	}
}

// startForClaim has the daemons of the GPUs a claim asked to share with
// MPS itself started, and returns why one does not answer.
func (m *mpsSharing) startForClaim(ctx context.Context, gpus []mps.Want) error {
	if len(gpus) == 0 {
		return nil
	}
	return m.mgr.Started(ctx, gpus, m.sync(ctx))
}
