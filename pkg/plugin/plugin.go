package plugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/internal/lasting"
	"github.com/nri-gpu/nri-gpu/pkg/access"
	"github.com/nri-gpu/nri-gpu/pkg/adjust"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
	"github.com/nri-gpu/nri-gpu/pkg/inventory"
	"github.com/nri-gpu/nri-gpu/pkg/metrics"
	"github.com/nri-gpu/nri-gpu/pkg/mps"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/record"
	"github.com/nri-gpu/nri-gpu/pkg/recovery"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// Annotations nri-gpu adds to each container it gives devices (pkg/adjust
// writes them).
const (
	DevicesAnnotation = adjust.DevicesAnnotation
	CountedAnnotation = adjust.CountedAnnotation
)

// The NRI events the plugin handles. A method whose signature drifted
// from the stub's would otherwise silently not be called.
var (
	_ stub.ConfigureInterface       = (*Plugin)(nil)
	_ stub.SynchronizeInterface     = (*Plugin)(nil)
	_ stub.CreateContainerInterface = (*Plugin)(nil)
	_ stub.StartContainerInterface  = (*Plugin)(nil)
	_ stub.StopContainerInterface   = (*Plugin)(nil)
	_ stub.StopPodInterface         = (*Plugin)(nil)
	_ stub.RemovePodInterface       = (*Plugin)(nil)
	_ stub.RemoveContainerInterface = (*Plugin)(nil)
)

// Plugin is nri-gpu's NRI plugin. It handles Configure, Synchronize,
// CreateContainer, StartContainer, StopContainer, RemoveContainer,
// StopPodSandbox and RemovePodSandbox,
// all of which every NRI-enabled containerd (1.7 on) knows, and ValidateContainerAdjustment
// where the runtime asks validators (NRI v0.10 on: containerd 2.2).
//
// Its fields are set by New and its options, and none is replaced after
// but st (under mu); those that change inside (the pool, the record, the
// connection, the inventory, the recovered pods, MPS sharing, the
// problems logged) have locks of their own.
type Plugin struct {
	log logrus.FieldLogger
	// flags override what every configuration says (the command line's).
	flags overrides
	// node is what outlives configurations.
	node node
	// inForce is the configuration in force.
	inForce inForce
	// conn is the connection to the runtime.
	conn connection
	// metrics is nil when metrics are off.
	metrics *metrics.Metrics
	// doors are told whenever what pods hold changes.
	doors doors
	// recovered are the pods of the last Synchronize, whose end the
	// runtime may tell only through their containers' removal.
	recovered *recovery.Pods
	// stopper stops a running container (killer: its process killed).
	stopper stopper
	// limits are the driver's bounds of the containers' GPU memory.
	limits bounds
	life   life
	// logged are the problems logged once, not at every reload.
	logged struct {
		// problems are the spec problems, by spec file; sharing the
		// devices two policy.sharing entries match.
		problems, sharing lasting.Problems
	}
}

// node is what outlives configurations: the pool, its record, the
// hardware, the MPS daemons and the containers' access files.
type node struct {
	alloc *policy.Allocations
	// rec keeps alloc (and the MPS daemons) in the state file across
	// restarts.
	rec *record.Keeper
	// hw is the node's hardware: what NVML says of its GPUs.
	hw *inventory.Inventory
	// mps shares GPUs with MPS.
	mps *mpsSharing
	// access keeps the containers' access files (what each was given); nil when
	// they get none.
	access *access.Dir
}

// inForce is the configuration in force.
type inForce struct {
	// mu covers st.
	mu sync.RWMutex
	st *state
	// start is the configuration's start block as nri-gpu started with
	// it: what every part reads of it, which no reload and no
	// configuration from the runtime changes.
	start config.Start
}

// life is done once Close let the record go: what the plugin still does
// in the background (the claim check after Synchronize) stops.
type life struct {
	closed context.Context
	cancel context.CancelFunc
	// restore is done once the first Synchronize restored the pool.
	restore *restoration
}

// doors are the ways to the pool beside the runtime's requests.
type doors struct {
	// told are told whenever what pods hold, or what is healthy,
	// changes.
	told []Listener
	// claims tells which prepared DRA claims a container uses; nil
	// without DRA.
	claims link.Finder
	// events, when set, is told what the pods' users should learn of.
	events EventSink
	// kubelet are the extended resources of the device plugins.
	kubelet []config.Resource
}

// state is everything a request needs, replaced whole on reconfiguration.
type state struct {
	cfg    *config.Config
	parser *policy.Parser
	policy *policy.Policy
	specs  *specs.Registry
}

// New returns a plugin serving cfg.
func New(cfg *config.Config, log logrus.FieldLogger, opts ...Option) (*Plugin, error) {
	p := &Plugin{log: log, node: node{alloc: policy.NewAllocations()}}
	p.life.closed, p.life.cancel = context.WithCancel(context.Background())
	p.life.restore = newRestoration()
	p.recovered = recovery.New(p.life.closed.Done(), nil)
	if self, err := os.Executable(); err == nil {
		p.flags.config.HookPath = self
		p.flags.mpsStart = mps.InShm(self, mps.ShmCommand)
	}
	for _, o := range opts {
		o(p)
	}
	var start mps.Launcher // mps.daemon: external: nri-gpu starts none
	if cfg.Start.MPS.Daemon == config.MPSManaged {
		start = p.flags.mpsStart
	}
	p.node.hw = inventory.New(cfg.Start.DriverRoot, p.flags.nvml, log.Infof)
	if p.flags.cgroups != nil {
		p.node.hw.SetCgroups(*p.flags.cgroups)
	}
	if p.stopper == nil {
		p.stopper = recovery.Killer{Proc: "/proc", Cgroups: p.node.hw.Cgroups()}
	}
	p.node.rec = record.NewKeeper(p.flags.record, p.node.alloc)
	mgr := mps.NewManager(start, mps.NVMLModes{Lib: p.node.hw.Lib}, p.node.rec)
	p.node.mps = &mpsSharing{cfg: cfg.Start.MPS, mgr: mgr, alloc: p.node.alloc, hw: p.node.hw, log: log, current: p}
	st, err := p.newState(cfg)
	if err != nil {
		return nil, err
	}
	p.inForce.st, p.inForce.start = st, cfg.Start
	if err := p.restoreRecord(st); err != nil {
		st.specs.Close()
		return nil, err
	}
	// Only the nri-gpu that holds the record tells the node's devices: one
	// waiting to take over tells none.
	p.metrics.WatchNode(p.metricsNode)
	p.doors.kubelet = cfg.Start.DevicePlugin.Resources
	return p, nil
}

// restoreRecord locks the record for this nri-gpu (at once, or, taking
// over, once the nri-gpu holding it has stopped) and reads it back: the
// claims it kept are held again at once, the pods' holdings when the
// runtime says which pods still run (Synchronize), the MPS daemons when
// their manager first looks.
func (p *Plugin) restoreRecord(st *state) error {
	file := p.node.rec.File()
	if file == nil {
		return nil
	}
	waited, held := time.Now(), false
	err := p.node.rec.Lock(p.flags.takeOver, func(pid string) {
		held = true
		p.log.Infof("the state file %s is held by another nri-gpu (pid %s): waiting for it to stop, to take over", file.Path(), pid)
	})
	if err != nil {
		return err
	}
	if held {
		p.log.Infof("took over the state file %s after %s", file.Path(), time.Since(waited).Round(time.Millisecond))
	}
	kept, aside, err := p.node.rec.Load()
	if err != nil {
		p.recordLost(err, aside, len(kept.Claims))
	}
	if kept.EarlierBoot != "" {
		p.log.Infof("the record of what pods and claims held was kept before the node last booted (boot %s): it holds nothing now, and kubelet prepares the claims of the pods it starts again", kept.EarlierBoot)
	}
	if err := p.node.alloc.RestoreClaims(p.node.hw.PolicyIn(st.policy, st.specs.Snapshot()), kept.Claims); err != nil {
		p.log.Warn(err)
	}
	for _, c := range kept.Claims {
		p.log.WithFields(logrus.Fields{"namespace": c.Claim.Namespace, "claim": c.Claim.Name, "devices": strings.Join(specs.Names(c.Footprints()), ",")}).
			Info("restored devices held by prepared DRA claim")
	}
	return nil
}

func (p *Plugin) newState(cfg *config.Config) (*state, error) {
	cfg, err := p.flags.config.Apply(cfg)
	if err != nil {
		return nil, err
	}
	for _, dir := range cfg.CDISpecDirs {
		// One that does not exist yet is watched for; one that is
		// something else would leave every device unresolvable.
		if fi, err := os.Stat(dir); err == nil && !fi.IsDir() {
			return nil, fmt.Errorf("cdiSpecDirs: %s is not a directory", dir)
		}
	}
	parser, err := policy.NewParser(cfg.DefaultKind, cfg.HonorsCDIAnnotations(), cfg.AnnotationKeys...)
	if err != nil {
		return nil, err
	}
	opts := []specs.Option{specs.WithNotify(p.logProblems)}
	if p.flags.parts != nil {
		opts = append(opts, specs.WithPartMajors(p.flags.parts))
	}
	reg, err := specs.Open(cfg.CDISpecDirs, opts...)
	if err != nil {
		return nil, err
	}
	p.logProblems(reg.Snapshot())
	// Whether a device is shared follows its hardware: the names it
	// goes by in a snapshot of the specs (policyIn binds a decision's).
	st := &state{cfg: cfg, parser: parser, policy: policy.New(cfg.Policy), specs: reg}
	snap := reg.Snapshot()
	if err := p.node.hw.PolicyIn(st.policy, snap).CheckSharing(snap.Trusted()); err != nil {
		reg.Close()
		return nil, err
	}
	return st, nil
}

// logProblems logs each spec problem once, when it appears, and when it
// is gone.
func (p *Plugin) logProblems(s *specs.Snapshot) {
	current := map[string]string{}
	for path, errs := range s.Problems {
		current[path] = errors.Join(errs...).Error()
	}
	appeared, gone := p.logged.problems.Update(current)
	for _, path := range appeared {
		p.log.WithField("spec", path).Warnf("CDI spec not used: %s", current[path])
	}
	for _, path := range gone {
		p.log.WithField("spec", path).Info("CDI spec problem gone")
	}
	p.metrics.SpecErrors(len(current))
	p.logSharing(s)
}

// logSharing logs, once while it lasts, each device of s that two
// policy.sharing entries of the policy in force match (specs changed
// since the policy was checked): it is refused until one entry no longer
// matches it.
func (p *Plugin) logSharing(s *specs.Snapshot) {
	p.inForce.mu.RLock()
	st := p.inForce.st
	p.inForce.mu.RUnlock()
	current := map[string]string{}
	if st != nil {
		if err, ok := p.node.hw.PolicyIn(st.policy, s).CheckSharing(s.Trusted()).(interface{ Unwrap() []error }); ok {
			for _, e := range err.Unwrap() {
				current[e.Error()] = e.Error()
			}
		}
	}
	appeared, gone := p.logged.sharing.Update(current)
	for _, msg := range appeared {
		p.log.Warnf("%s; until then the device is refused", msg)
	}
	for _, msg := range gone {
		p.log.Infof("gone: %s", msg)
	}
}

// Resource returns the devices of extended resource r.
func (p *Plugin) Resource(r config.Resource) *Resource { return &Resource{p: p, cfg: r} }

// DRAView returns the DRA driver's view of the devices, for a driver
// configured by cfg.
func (p *Plugin) DRAView(cfg config.DRA) *DRAView { return &DRAView{p: p, cfg: cfg} }

func (p *Plugin) state() *state {
	p.inForce.mu.RLock()
	defer p.inForce.mu.RUnlock()
	return p.inForce.st
}

// decision returns what one decision reads: the state in force, one
// snapshot of its specs, and its policy bound to that snapshot.
func (p *Plugin) decision() (*state, *specs.Snapshot, *policy.Policy) {
	st := p.state()
	snap := st.specs.Snapshot()
	return st, snap, p.node.hw.PolicyIn(st.policy, snap)
}

// Close stops watching the spec directories and lets the state file's
// lock go, once nothing of it can write the record any more (the
// watches of pods' sandboxes ended).
func (p *Plugin) Close() {
	p.life.cancel()
	p.recovered.Wait()
	p.state().specs.Close()
	p.node.rec.Unlock()
}

// Configure is called by the runtime when the plugin registers. A
// non-empty config (what containerd passes a pre-registered plugin from
// its plugin_config_path) replaces the configuration, parsed as a file is
// and checked as a reload is: one that cannot be used, or changes the
// start block, is refused (the plugin does not register), and the
// configuration in force stays.
func (p *Plugin) Configure(_ context.Context, cfg, runtime, version string) (api.EventMask, error) {
	log := p.log.WithFields(logrus.Fields{"runtime": runtime, "version": version})
	rt, stub := p.conn.configuring(runtime, version)
	log.Infof("what the runtime can apply: %s", rt)
	ev := events(stub)
	if !ev.IsSet(api.Event_VALIDATE_CONTAINER_ADJUSTMENT) {
		log.Infof("the runtime's NRI (%s, as it reports it) asks no validators: a device another NRI plugin asks the runtime to inject is not checked against those nri-gpu injects", stub)
	}
	if cfg == "" {
		p.conn.configured(nil)
		log.Info("connected to runtime")
		return ev, nil
	}
	c, err := config.Parse([]byte(cfg))
	var st *state
	if err == nil {
		st, err = p.reloaded(c)
	}
	if err != nil {
		err = fmt.Errorf("configuration from runtime: %w", err)
		p.conn.configured(err)
		return 0, err
	}
	p.putInForce(st)
	p.conn.configured(nil)
	log.Info("connected to runtime, using the configuration it passed")
	return ev, nil
}

// Reload puts a new, validated configuration in force for the next
// request, as after SIGHUP or a change of the configuration file. What
// pods hold is kept: a device a pod holds that the new policy would not
// give it stays held, and is logged. It returns an error, and the old
// configuration stays, when the new one cannot be used (its spec
// directories cannot be watched).
func (p *Plugin) Reload(cfg *config.Config) error {
	st, err := p.reloaded(cfg)
	if err != nil {
		return err
	}
	p.putInForce(st)
	return nil
}

// putInForce makes st the state of the next request, however its
// configuration came (a reload, the runtime's Configure), and logs what
// pods hold that it would not give them: they keep it until removed.
func (p *Plugin) putInForce(st *state) {
	p.inForce.mu.Lock()
	old := p.inForce.st
	p.inForce.st = st
	p.inForce.mu.Unlock()
	old.specs.Close()
	if err := p.node.alloc.Check(p.node.hw.PolicyIn(st.policy, st.specs.Snapshot())); err != nil {
		p.log.Warnf("the new configuration would not give some pods what they hold: %v", err)
	}
}

// reloaded returns the state of a configuration that replaces the one
// in force: refused (ErrStartOnly, naming the keys) when it changes the
// start block, which nri-gpu read when it started.
func (p *Plugin) reloaded(cfg *config.Config) (*state, error) {
	if keys := p.inForce.start.Changed(cfg.Start); len(keys) > 0 {
		return nil, fmt.Errorf("%w: %s is read at start: restart nri-gpu to change it (a pre-registered nri-gpu reads its start block from --config)", ErrStartOnly, strings.Join(keys, ", "))
	}
	return p.newState(cfg)
}

// Ready returns nil when the plugin is registered with the runtime (it
// has had Synchronize on its current connection), has a snapshot of the
// specs and, with DRA, kubelet has registered its DRA driver; it says
// what is missing otherwise: before the first connection, while it
// reconnects after losing one, while the driver is not registered.
func (p *Plugin) Ready() error {
	switch {
	case !p.conn.synced.Load():
		return fmt.Errorf("%w: not registered with the runtime (connecting)", ErrNotReady)
	case p.state().specs.Snapshot() == nil:
		return fmt.Errorf("%w: no snapshot of the CDI specs yet", ErrNotReady)
	}
	if r, ok := p.doors.claims.(registration); ok {
		ctx, cancel := context.WithTimeout(context.Background(), readyWait)
		defer cancel()
		if err := r.Registered(ctx); err != nil {
			return fmt.Errorf("%w: the DRA driver: %w", ErrNotReady, err)
		}
	}
	return nil
}

// registration is a DRA driver that says whether kubelet has registered
// it (link.Process).
type registration interface {
	Registered(ctx context.Context) error
}

// readyWait bounds how long Ready asks the DRA driver.
const readyWait = time.Second
