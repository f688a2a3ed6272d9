package nvidia

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// ErrUnhealthy is wrapped by the error Monitor.Unhealthy returns.
var ErrUnhealthy = errors.New("unhealthy GPU")

// ignoredXids are Xid errors an application causes, not the GPU (as the
// NVIDIA device plugin skips them): they leave the GPU healthy.
var ignoredXids = map[uint64]bool{13: true, 31: true, 43: true, 45: true, 68: true, 109: true}

// Monitor watches the health of a node's NVIDIA GPUs through NVML: a
// critical Xid error event makes a GPU unhealthy, and so do a
// GPU-unavailable event and a check (every interval of Run) that finds it
// lost. A lost GPU that answers
// again is healthy again; one that had an Xid error is, once it has
// answered for RecoverAfter (never, when 0).
type Monitor struct {
	lib  nvml.Interface
	set  nvml.EventSet
	gpus []gpuHandle
	// RecoverAfter is how long after an Xid error a GPU that answers its
	// checks is healthy again; 0 keeps it unhealthy until nri-gpu
	// restarts.
	RecoverAfter time.Duration
	// OnChange, when set, is called after a GPU's health changed, with
	// its node and why it is unhealthy ("" when it is healthy again).
	OnChange func(node, reason string)
	// OnReopen, when set, is called after a check found NVML answering
	// cause for the GPUs it had (the driver's kernel module reloaded, an
	// upgrade: NVML_ERROR_LIB_RM_VERSION_MISMATCH) and the monitor opened
	// NVML again: err is nil once it watches again, else why it cannot
	// (it then tries again at each check, and watches nothing meanwhile;
	// told again only when the reason changes).
	OnReopen func(cause, err error)
	now      func() time.Time
	// blind is why NVML could not be opened again, nil while it is open;
	// staleBy is the answer that had it opened again.
	blind, staleBy error

	mu  sync.Mutex
	bad map[string]problem // by GPU node
}

type problem struct {
	reason string
	since  time.Time
	lost   bool
	xid    uint64
}

// NewMonitor opens NVML (kept open until Close), finds the GPUs and
// registers for their critical Xid events where NVML supports that.
func NewMonitor(lib nvml.Interface) (*Monitor, error) {
	m := &Monitor{lib: lib, now: time.Now, bad: map[string]problem{}}
	if err := m.open(); err != nil {
		return nil, err
	}
	return m, nil
}

// open opens NVML, finds the GPUs and registers for their events; it
// leaves NVML closed when it fails.
func (m *Monitor) open() error {
	if ret := m.lib.Init(); ret != nvml.SUCCESS {
		return fmt.Errorf("%w: %w", ErrNVML, ret)
	}
	gpus, err := gpuHandles(m.lib)
	if err != nil {
		_ = m.lib.Shutdown()
		return err
	}
	m.gpus = gpus
	if set, ret := m.lib.EventSetCreate(); ret == nvml.SUCCESS {
		m.set = set
		for _, g := range m.gpus {
			// Each on its own: a driver that knows no GPU-unavailable
			// event still gives Xid errors. Not supported: checks only.
			_ = g.dev.RegisterEvents(nvml.EventTypeXidCriticalError, set)
			_ = g.dev.RegisterEvents(nvml.EventTypeGpuUnavailableError, set)
		}
	}
	return nil
}

// Close frees the event set and closes NVML.
func (m *Monitor) Close() {
	if m.blind == nil {
		m.close()
	}
}

func (m *Monitor) close() {
	if m.set != nil {
		_ = m.set.Free()
	}
	_ = m.lib.Shutdown()
}

// stale reports whether NVML's answer says the library open is no longer
// the loaded driver's: its kernel module was reloaded (an upgrade), or
// NVML was shut down under it.
func stale(ret nvml.Return) bool {
	return ret == nvml.ERROR_LIB_RM_VERSION_MISMATCH || ret == nvml.ERROR_UNINITIALIZED || ret == nvml.ERROR_DRIVER_NOT_LOADED
}

// reopen closes NVML and opens it again (the library is loaded anew
// once no one holds it), telling OnReopen how it went: each time it
// succeeds, and when it first fails or fails otherwise.
func (m *Monitor) reopen() {
	was := m.blind
	if was == nil {
		m.close()
		m.set = nil
	}
	err := m.open()
	if err != nil {
		err = fmt.Errorf("opening NVML again: %w", err)
	}
	m.blind = err
	if m.OnReopen != nil && (err == nil || was == nil || was.Error() != err.Error()) {
		m.OnReopen(m.staleBy, err)
	}
}

// Run waits for events and checks every GPU every interval, until ctx
// is done.
func (m *Monitor) Run(ctx context.Context, interval time.Duration) {
	last := time.Time{}
	for ctx.Err() == nil {
		if m.now().Sub(last) >= interval {
			m.check()
			last = m.now()
		}
		if m.set == nil || m.blind != nil {
			select {
			case <-ctx.Done():
			case <-time.After(interval):
			}
			continue
		}
		data, ret := m.set.Wait(uint32(min(interval, time.Second).Milliseconds()))
		if ret == nvml.SUCCESS {
			m.event(data)
		}
	}
}

// event handles an NVML event.
func (m *Monitor) event(e nvml.EventData) {
	var p problem
	switch {
	case e.EventType&nvml.EventTypeGpuUnavailableError != 0:
		p = problem{reason: "the GPU is unavailable (NVML event)", since: m.now(), lost: true}
	case e.EventType&nvml.EventTypeXidCriticalError != 0 && !ignoredXids[e.EventData]:
		p = problem{reason: fmt.Sprintf("critical Xid error %d", e.EventData), since: m.now(), xid: e.EventData}
	default:
		return
	}
	for _, g := range m.gpus {
		if g.dev == e.Device || e.Device == nil {
			m.mark(g.node, p)
		}
	}
}

// Check asks every GPU once whether it still answers, as Run does every
// interval (for a one-time look: nri-gpu devices).
func (m *Monitor) Check() { m.check() }

// check asks every GPU whether it still answers. An NVML that answers
// for another driver than the one loaded is opened again first (and,
// until that succeeds, at each check).
func (m *Monitor) check() {
	if m.blind != nil {
		if m.reopen(); m.blind != nil {
			return
		}
	}
	answers := m.ask()
	if i := slices.IndexFunc(answers, stale); i >= 0 {
		m.staleBy = answers[i]
		if m.reopen(); m.blind != nil {
			return
		}
		answers = m.ask()
	}
	for i, g := range m.gpus {
		m.mu.Lock()
		p, bad := m.bad[g.node]
		m.mu.Unlock()
		switch {
		case answers[i] == nvml.ERROR_GPU_IS_LOST:
			if !bad || !p.lost {
				m.mark(g.node, problem{reason: "the GPU is lost (fallen off the bus)", since: m.now(), lost: true})
			}
		case !bad:
		case p.lost, m.RecoverAfter > 0 && m.now().Sub(p.since) >= m.RecoverAfter:
			m.clear(g.node)
		}
	}
}

// ask returns each GPU's answer to a question (its UUID).
func (m *Monitor) ask() []nvml.Return {
	out := make([]nvml.Return, len(m.gpus))
	for i, g := range m.gpus {
		_, out[i] = g.dev.GetUUID()
	}
	return out
}

func (m *Monitor) mark(node string, p problem) {
	m.mu.Lock()
	m.bad[node] = p
	m.mu.Unlock()
	if m.OnChange != nil {
		m.OnChange(node, p.reason)
	}
}

func (m *Monitor) clear(node string) {
	m.mu.Lock()
	delete(m.bad, node)
	m.mu.Unlock()
	if m.OnChange != nil {
		m.OnChange(node, "")
	}
}

// Unhealthy says why a CDI device's GPU (a MIG device's parent) is
// unhealthy, or returns nil: for a healthy GPU, and for a device that is
// no NVIDIA GPU.
func (m *Monitor) Unhealthy(d specs.Device) error {
	node := gpuNode(d)
	m.mu.Lock()
	p, bad := m.bad[node]
	m.mu.Unlock()
	if node == "" || !bad {
		return nil
	}
	return fmt.Errorf("%w: %s since %s", ErrUnhealthy, p.reason, p.since.UTC().Format(time.RFC3339))
}

// Health is why a GPU is unhealthy.
type Health struct {
	// Reason says it in words.
	Reason string
	// Lost says NVML lost the GPU; else Xid is its critical Xid error.
	Lost bool
	Xid  uint64
}

// Health returns why a CDI device's GPU (a MIG device's parent) is
// unhealthy, and false for a healthy GPU and a device that is no NVIDIA
// GPU.
func (m *Monitor) Health(d specs.Device) (Health, bool) {
	node := gpuNode(d)
	m.mu.Lock()
	p, bad := m.bad[node]
	m.mu.Unlock()
	if node == "" || !bad {
		return Health{}, false
	}
	return Health{Reason: p.reason, Lost: p.lost, Xid: p.xid}, true
}

// Unhealthies returns why each unhealthy GPU is, by GPU node.
func (m *Monitor) Unhealthies() map[string]string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]string, len(m.bad))
	for node, p := range maps.All(m.bad) {
		out[node] = p.reason
	}
	return out
}
