// Package plugin is the NRI glue of nri-gpu: it receives the runtime's
// requests, has pkg/policy read and judge what a container asks for,
// pkg/specs resolve it and pkg/adjust build the adjustment, keeps track of
// which pod holds which devices, and logs each decision once.
package plugin

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	"github.com/sirupsen/logrus"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/nri-gpu/nri-gpu/pkg/adjust"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/metrics"
	"github.com/nri-gpu/nri-gpu/pkg/mps"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/record"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
	"github.com/nri-gpu/nri-gpu/pkg/specs/nvidia"
)

// Annotations nri-gpu adds to each container it gives devices, for
// operators to read. nri-gpu writes them whole and removes them from a
// container it gives nothing: a tenant cannot set them.
const (
	// DevicesAnnotation lists the devices the container got, qualified
	// CDI names separated by commas: "nvidia.com/gpu=0,nvidia.com/gpu=1".
	DevicesAnnotation = "nri-gpu.io/devices"
	// CountedAnnotation lists those of them chosen for a count request,
	// written the same way.
	CountedAnnotation = "nri-gpu.io/counted"
)

// The NRI events the plugin handles. A method whose signature drifted
// from the stub's would otherwise silently not be called.
var (
	_ stub.ConfigureInterface       = (*Plugin)(nil)
	_ stub.SynchronizeInterface     = (*Plugin)(nil)
	_ stub.CreateContainerInterface = (*Plugin)(nil)
	_ stub.StopPodInterface         = (*Plugin)(nil)
	_ stub.RemovePodInterface       = (*Plugin)(nil)
	_ stub.RemoveContainerInterface = (*Plugin)(nil)
)

// Plugin is nri-gpu's NRI plugin. It handles Configure, Synchronize,
// CreateContainer, RemoveContainer, StopPodSandbox and RemovePodSandbox,
// all of which every NRI-enabled containerd (1.7 on) knows, and ValidateContainerAdjustment
// where the runtime asks validators (NRI v0.10 on: containerd 2.2).
type Plugin struct {
	log logrus.FieldLogger
	// specDirs, when set, overrides cdiSpecDirs of every configuration.
	specDirs []string
	// alloc outlives configurations.
	alloc *policy.Allocations
	// saved keeps alloc across restarts; nil when there is no state file.
	saved *record.File
	// lost says the state file could not be read back at start.
	lost atomic.Bool
	// pending are the pods' holdings read from saved at start, until the
	// first Synchronize tells which of their pods still run; restoring
	// says they are still pending.
	pending   []policy.Holding
	restoring bool
	// claims tells which prepared DRA claims a container uses; nil
	// without DRA.
	claims ClaimFinder

	mu sync.RWMutex
	st *state
	// configured counts successful Configure calls, one per connection.
	configured int
	// synced says the plugin is registered with the runtime: it has had
	// Synchronize on its current connection.
	synced bool
	// configErr is the last rejected configuration from the runtime.
	configErr error
	// runtime is what the connected runtime applies, decided at Configure.
	runtime adjust.Runtime
	// nriVersion returns the connected runtime's NRI version, as the
	// stub of the current connection learnt it; nil outside Serve.
	nriVersion func() string

	// sysfs, when set, replaces the host's /sys for PCIe roots.
	sysfs fs.ReadLinkFS
	// nvml, when set, replaces the driver's NVML for spec generation.
	nvml nvml.Interface
	// hookPath is the CDI hook that the specs the plugin generates name
	// (nri-gpu itself, by default), which the policy allows.
	hookPath string
	// metrics is nil when metrics are off.
	metrics *metrics.Metrics

	// onHeld are called whenever what pods hold changes.
	onHeld []func()
	// recovered are the pods of the last Synchronize, whose end the
	// runtime may tell only through their containers' removal.
	recovered recovered

	// mps keeps the managed MPS control daemons.
	mps   *mps.Manager
	mpsMu sync.Mutex
	// mpsWarned are the MPS problems logged, while they last.
	mpsWarned map[string]bool

	gpusOnce sync.Once
	// gpuFacts is what NVML says of the GPUs, by minor; nil without NVML.
	gpuFacts map[int]gpuInfo

	topologyOnce sync.Once
	// topology is nil where NVML cannot be had.
	topology nvidia.Topology
	// health watches the NVIDIA GPUs; nil where NVML cannot be had.
	health atomic.Pointer[nvidia.Monitor]

	problemsMu sync.Mutex
	// problems are the spec problems logged, by spec file.
	problems map[string]string
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
	p := &Plugin{log: log, alloc: policy.NewAllocations(), mps: mps.NewManager(nil)}
	if self, err := os.Executable(); err == nil {
		p.hookPath = self
		p.mps = mps.NewManager(startInShm(self))
	}
	for _, o := range opts {
		o(p)
	}
	st, err := p.newState(cfg)
	if err != nil {
		return nil, err
	}
	p.st = st
	if p.saved != nil {
		if !p.saved.ReadOnly() {
			if err := p.saved.Lock(); err != nil {
				st.specs.Close()
				return nil, err
			}
		}
		kept, err := p.saved.Load()
		if err != nil {
			p.recordLost(err)
		}
		pods, claims := kept.Pods, kept.Claims
		if err := p.alloc.RestoreClaims(st.policy, claims); err != nil {
			p.log.Warn(err)
		}
		for _, c := range claims {
			p.log.WithFields(logrus.Fields{"namespace": c.Claim.Namespace, "claim": c.Claim.Name, "devices": strings.Join(specs.Names(c.Footprints()), ",")}).
				Info("restored devices held by prepared DRA claim")
		}
		p.pending, p.restoring = pods, true
	}
	return p, nil
}

// recordLost handles a state file that cannot be read back: it is set
// aside for the operator (never when read only), and every device found
// in a running container is then held by its pod alone (Synchronize).
func (p *Plugin) recordLost(err error) {
	kept := "left where it is"
	if !p.saved.ReadOnly() {
		aside, aerr := p.saved.SetAside()
		if aerr != nil {
			kept = aerr.Error()
		} else {
			kept = "kept as " + aside
		}
	}
	p.lost.Store(true)
	p.log.Errorf("the record of what pods hold is unusable (%v; %s): it is rebuilt from the device nodes of the running containers, each device found held by its pod alone (as a count grant is) until the pod is removed", err, kept)
}

func (p *Plugin) newState(cfg *config.Config) (*state, error) {
	if len(p.specDirs) > 0 {
		c := *cfg
		c.CDISpecDirs = slices.Clone(p.specDirs)
		if err := c.Validate(); err != nil {
			return nil, fmt.Errorf("--cdi-spec-dirs: %w", err)
		}
		cfg = &c
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
	reg, err := specs.Open(cfg.CDISpecDirs, specs.WithNotify(p.logProblems))
	if err != nil {
		return nil, err
	}
	p.logProblems(reg.Snapshot())
	// The hook of the specs nri-gpu generates, nri-gpu itself by
	// default, is as trusted as the plugin.
	rules := cfg.Policy
	if p.hookPath != "" && !slices.Contains(rules.HookPaths, p.hookPath) {
		rules.HookPaths = append(slices.Clone(rules.HookPaths), p.hookPath)
	}
	return &state{cfg: cfg, parser: parser, policy: policy.New(rules), specs: reg}, nil
}

// logProblems logs each spec problem once, when it appears, and when it
// is gone.
func (p *Plugin) logProblems(s *specs.Snapshot) {
	p.problemsMu.Lock()
	defer p.problemsMu.Unlock()
	current := map[string]string{}
	for path, errs := range s.Problems {
		msg := errors.Join(errs...).Error()
		current[path] = msg
		if p.problems[path] != msg {
			p.log.WithField("spec", path).Warnf("CDI spec not used: %s", msg)
		}
	}
	for path := range p.problems {
		if _, ok := current[path]; !ok {
			p.log.WithField("spec", path).Info("CDI spec problem gone")
		}
	}
	p.problems = current
	p.metrics.SpecErrors(len(current))
}

func (p *Plugin) state() *state {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.st
}

// connectedRuntime returns what the connected runtime applies.
func (p *Plugin) connectedRuntime() adjust.Runtime {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.runtime
}

// Close stops watching the spec directories and lets the state file's
// lock go.
func (p *Plugin) Close() {
	p.state().specs.Close()
	if p.saved != nil {
		p.saved.Unlock()
	}
}

// Configure is called by the runtime when the plugin registers. A
// non-empty config (what containerd passes a pre-registered plugin from
// its plugin_config_path) replaces the configuration, parsed as a file is.
func (p *Plugin) Configure(_ context.Context, cfg, runtime, version string) (api.EventMask, error) {
	log := p.log.WithFields(logrus.Fields{"runtime": runtime, "version": version})
	rt := adjust.RuntimeOf(runtime, version)
	p.mu.Lock()
	p.runtime = rt
	nriVersion := "unknown"
	if p.nriVersion != nil {
		nriVersion = p.nriVersion()
	}
	p.mu.Unlock()
	log.Infof("what the runtime can apply: %s", rt)
	ev := events(nriVersion)
	if !ev.IsSet(api.Event_VALIDATE_CONTAINER_ADJUSTMENT) {
		log.Infof("the runtime's NRI (%s) asks no validators: a device another NRI plugin asks the runtime to inject is not checked against those nri-gpu injects", nriVersion)
	}
	if cfg == "" {
		p.mu.Lock()
		p.configured++
		p.mu.Unlock()
		log.Info("connected to runtime")
		return ev, nil
	}
	st, err := p.parseRuntimeConfig(cfg)
	p.mu.Lock()
	if err != nil {
		p.configErr = err
		p.mu.Unlock()
		return 0, err
	}
	old := p.st
	p.st = st
	p.configured++
	p.mu.Unlock()
	old.specs.Close()
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
	inForce := p.state().cfg
	for _, c := range []struct {
		key, what string
		old, next any
	}{
		{"devicePlugin", "kubelet's sockets, the resources registered", inForce.DevicePlugin, cfg.DevicePlugin},
		{"dra", "kubelet's sockets, the resources registered", inForce.DRA, cfg.DRA},
		{"mps", "the MPS control daemons run or looked for", inForce.MPS, cfg.MPS},
	} {
		if !reflect.DeepEqual(c.old, c.next) {
			return fmt.Errorf("%w: %s is read at start (%s): restart nri-gpu to change it", ErrStartOnly, c.key, c.what)
		}
	}
	st, err := p.newState(cfg)
	if err != nil {
		return err
	}
	p.mu.Lock()
	old := p.st
	p.st = st
	p.mu.Unlock()
	old.specs.Close()
	if err := p.alloc.Check(st.policy); err != nil {
		p.log.Warnf("the new configuration would not give some pods what they hold: %v", err)
	}
	return nil
}

func (p *Plugin) parseRuntimeConfig(cfg string) (*state, error) {
	c, err := config.Parse([]byte(cfg))
	if err != nil {
		return nil, fmt.Errorf("configuration from runtime: %w", err)
	}
	st, err := p.newState(c)
	if err != nil {
		return nil, fmt.Errorf("configuration from runtime: %w", err)
	}
	return st, nil
}

// ErrNotRecorded is wrapped by the error of a request whose grant could
// not be written to the state file: it is not given.
var ErrNotRecorded = errors.New("could not be recorded")

// ErrStartOnly is wrapped by Reload's error for a configuration that
// changes what only a start reads.
var ErrStartOnly = errors.New("cannot change while nri-gpu runs")

// ErrNotReady is wrapped by Ready's error.
var ErrNotReady = errors.New("not ready")

// Ready returns nil when the plugin is registered with the runtime (it
// has had Synchronize on its current connection) and has a snapshot of
// the specs, and says what is missing otherwise: before the first
// connection, and while it reconnects after losing one.
func (p *Plugin) Ready() error {
	p.mu.RLock()
	defer p.mu.RUnlock()
	switch {
	case !p.synced:
		return fmt.Errorf("%w: not registered with the runtime (connecting)", ErrNotReady)
	case p.st.specs.Snapshot() == nil:
		return fmt.Errorf("%w: no snapshot of the CDI specs yet", ErrNotReady)
	}
	return nil
}

func (p *Plugin) setSynced(v bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.synced = v
}

// connections returns how many connections the runtime configured.
func (p *Plugin) connections() int {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.configured
}

// takeConfigError returns and forgets the last rejected configuration.
func (p *Plugin) takeConfigError() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	err := p.configErr
	p.configErr = nil
	return err
}

// Synchronize rebuilds what pods hold after a restart, from sources no
// tenant can write: the state file the plugin keeps, for the pods the
// runtime still runs, and the device nodes the runtime reports in the
// containers nri-gpu gave devices. Pods gone while the plugin was away,
// and pods all of whose containers have stopped (stopped pods, not yet
// removed), hold nothing any more. Holdings that break the policy or each
// other are logged, and stay held.
func (p *Plugin) Synchronize(_ context.Context, pods []*api.PodSandbox, containers []*api.Container) ([]*api.ContainerUpdate, error) {
	st := p.state()
	live := make(map[string]policy.Pod, len(pods))
	for _, pod := range pods {
		live[pod.GetId()] = podOf(pod)
	}
	withContainers, running := map[string]bool{}, map[string]bool{} // by pod ID
	for _, c := range containers {
		withContainers[c.GetPodSandboxId()] = true
		if c.GetState() != api.ContainerState_CONTAINER_STOPPED {
			running[c.GetPodSandboxId()] = true
		}
	}
	for id := range withContainers {
		if !running[id] { // a stopped pod, not yet removed
			delete(live, id)
		}
	}
	var holdings []policy.Holding
	recorded := map[string][]specs.Device{} // by pod ID
	for _, h := range p.known() {
		if pod, ok := live[h.Pod.ID]; ok {
			h.Pod = pod
			holdings = append(holdings, h)
			recorded[pod.ID] = append(recorded[pod.ID], slices.Concat(h.Named, h.Counted)...)
		}
	}
	candidates := st.specs.Snapshot().Candidates(st.cfg.DefaultKind)
	// A device of a prepared claim, found in a container, is the claim's.
	claimed := p.alloc.ClaimHeld()
	candidates = slices.DeleteFunc(candidates, func(d specs.Device) bool { return policy.Overlaps(d, claimed) })
	for _, c := range containers {
		pod, ok := live[c.GetPodSandboxId()]
		if !ok || c.GetState() == api.ContainerState_CONTAINER_STOPPED {
			continue
		}
		found := foundIn(c, candidates)
		if len(found) == 0 {
			continue
		}
		// What no record has is held as strictly as it may have been
		// given: by the pod alone.
		var sole []string
		for _, d := range found {
			if !policy.Overlaps(d, recorded[pod.ID]) {
				sole = append(sole, d.Name)
			}
		}
		holdings = append(holdings, policy.Holding{Pod: pod, Named: found, Sole: sole})
		if len(sole) > 0 {
			p.log.WithFields(logrus.Fields{"namespace": pod.Namespace, "pod": pod.Name, "container": c.GetName(), "devices": strings.Join(sole, ",")}).
				Warn("devices found in a running container that no record has: held by its pod alone until the pod is removed")
		}
	}
	if err := p.alloc.Restore(st.policy, holdings); err != nil {
		p.log.Warn(err)
	}
	p.recovered.reset(containers, func(id string) bool { _, ok := live[id]; return ok })
	p.held()
	p.setSynced(true)
	for pod, devices := range p.alloc.Held() {
		p.log.WithFields(logrus.Fields{"namespace": pod.Namespace, "pod": pod.Name, "devices": strings.Join(devices, ",")}).
			Info("restored devices held by pod")
	}
	return nil, nil
}

// maxContainerDevices caps the device nodes of one container looked at.
const maxContainerDevices = 1024

// foundIn returns the candidates whose device nodes are all in a
// container nri-gpu gave devices, as the runtime reports them (its spec).
// A container nri-gpu gave nothing (a privileged one, say) holds nothing.
func foundIn(c *api.Container, candidates []specs.Device) []specs.Device {
	if _, ok := c.GetAnnotations()[DevicesAnnotation]; !ok {
		return nil
	}
	nodes := map[string]bool{}
	for i, d := range c.GetLinux().GetDevices() {
		if i == maxContainerDevices {
			break
		}
		nodes[specs.NodeID(d.GetType(), d.GetMajor(), d.GetMinor())] = true
	}
	var found []specs.Device
	for _, cand := range candidates {
		if len(cand.Nodes) > 0 && !slices.ContainsFunc(cand.Nodes, func(n string) bool { return !nodes[n] }) {
			found = append(found, cand)
		}
	}
	return found
}

// StopPodSandbox releases the devices a pod held.
func (p *Plugin) StopPodSandbox(_ context.Context, pod *api.PodSandbox) error {
	p.recovered.forget(pod.GetId())
	p.release(pod)
	return nil
}

// RemovePodSandbox releases the devices a pod held, if its stop did not.
func (p *Plugin) RemovePodSandbox(_ context.Context, pod *api.PodSandbox) error {
	p.recovered.forget(pod.GetId())
	p.release(pod)
	return nil
}

// RemoveContainer releases the devices of a pod the runtime reported at
// Synchronize once its last container is removed: after the runtime
// restarted, that is all it tells of the pod's end (see recovered).
func (p *Plugin) RemoveContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) error {
	if p.recovered.remove(pod.GetId(), ctr.GetId()) {
		p.release(pod)
	}
	return nil
}

func (p *Plugin) release(pod *api.PodSandbox) {
	if released := p.alloc.Release(pod.GetId()); len(released) > 0 {
		p.held()
		p.log.WithFields(logrus.Fields{"namespace": pod.GetNamespace(), "pod": pod.GetName(), "devices": strings.Join(released, ",")}).
			Info("released devices")
	}
}

// CreateContainer injects the devices a container asks for, or fails its
// creation saying why. A container that asks for nothing is left alone.
func (p *Plugin) CreateContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	adj, _, err := p.Explain(pod, ctr)
	if err == nil {
		p.recovered.add(pod.GetId(), ctr.GetId())
	}
	return adj, nil, err
}

// Explain serves a CreateContainer request (CreateContainer is it, for
// the runtime): it runs it, records its metrics, logs the decision once
// and wraps a denial for the runtime. For `nri-gpu explain` it also
// returns what the pool granted, with the devices a count request passed
// over and the chosen set's score.
func (p *Plugin) Explain(pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, policy.Grant, error) {
	start := time.Now()
	log := p.log.WithFields(logrus.Fields{"namespace": pod.GetNamespace(), "pod": pod.GetName(), "container": ctr.GetName()})
	adj, grant, err := p.handle(p.state(), log, pod, ctr)
	if err == nil && grant.Added() {
		// Only a grant that adds to what pods hold changes the record.
		if err = p.recorded(func() { p.alloc.Revert(grant) }); err != nil {
			adj, grant, err = nil, policy.Grant{}, fmt.Errorf("devices not given, since their grant %w", err)
		}
	}
	devices, score := specs.Names(grant.Devices), grant.Score
	result := metrics.ResultInjected
	switch {
	case err != nil:
		result = metrics.ResultDenied
	case len(devices) == 0:
		result = metrics.ResultNone
	}
	p.metrics.Request(result, rule(err), time.Since(start))
	if err != nil {
		log.Errorf("denied: %v", err)
		return nil, grant, bounded(fmt.Errorf("nri-gpu: container %q of pod %s/%s: %w",
			ctr.GetName(), pod.GetNamespace(), pod.GetName(), err))
	}
	if len(devices) == 0 {
		if adj != nil {
			log.Warnf("no devices requested; removed the annotations %s and %s, which only nri-gpu writes", DevicesAnnotation, CountedAnnotation)
		} else {
			log.Debug("no devices requested")
		}
		return adj, grant, nil
	}
	entry := log.WithField("devices", strings.Join(devices, ","))
	if score > 0 {
		entry = entry.WithField("topologyScore", score)
	}
	entry.Info("injected devices")
	return adj, grant, nil
}

// unhealthy says why a device's GPU is unhealthy, or returns nil where
// nri-gpu watches no GPU (no NVML): every device is then healthy.
func (p *Plugin) unhealthy() func(specs.Device) error {
	if m := p.health.Load(); m != nil {
		return m.Unhealthy
	}
	return nil
}

// nvmlLib returns the NVML spec generation, health and topology ask: the
// one given (tests), else the driver's under cfg's driver root.
func (p *Plugin) nvmlLib(cfg *config.Config) nvml.Interface {
	if p.nvml != nil {
		return p.nvml
	}
	return nvidia.Library(cfg.DriverRoot)
}

// CheckHealth looks once at the NVIDIA GPUs' health (a GPU a check finds
// lost), for a plugin that does not Serve (nri-gpu explain); without
// NVML it does nothing.
func (p *Plugin) CheckHealth() {
	m, err := nvidia.NewMonitor(p.nvmlLib(p.state().cfg))
	if err != nil {
		return
	}
	m.Check()
	m.Close() // what it found stays
	p.health.Store(m)
}

// keepWatchingHealth watches the NVIDIA GPUs' health through NVML until
// ctx is done; without NVML it says that it takes every GPU as healthy.
func (p *Plugin) keepWatchingHealth(ctx context.Context) {
	cfg := p.state().cfg
	m, err := nvidia.NewMonitor(p.nvmlLib(cfg))
	if err != nil {
		p.log.Infof("GPU health not watched (%v): every device is taken as healthy", err)
		return
	}
	defer m.Close()
	m.RecoverAfter = cfg.HealthRecoverAfter
	m.OnChange = func(node, why string) {
		if why != "" {
			p.log.WithField("gpu", node).Warnf("GPU unhealthy: %s", why)
		} else {
			p.log.WithField("gpu", node).Info("GPU healthy again")
		}
		p.metrics.UnhealthyGPUs(len(m.Unhealthies()))
		for _, f := range p.onHeld {
			f()
		}
	}
	p.health.Store(m)
	defer p.health.Store(nil)
	p.log.Infof("watching the health of NVIDIA GPUs (critical Xid events, a check every %s)", cfg.HealthInterval)
	m.Run(ctx, cfg.HealthInterval)
}

// links returns how closely two devices are connected, from the GPU
// topology NVML reports (asked once), or nil where NVML cannot be had:
// count requests then take free devices in spec order.
func (p *Plugin) links() func(a, b specs.Device) int {
	p.topologyOnce.Do(func() {
		t, err := nvidia.DiscoverTopology(p.nvmlLib(p.state().cfg))
		if err != nil {
			p.log.Infof("GPU topology unknown (%v): count requests take free devices in spec order", err)
			return
		}
		p.log.Infof("GPU topology of %d pairs known: count requests take the most closely connected free devices", len(t))
		p.topology = t
	})
	if p.topology == nil {
		return nil
	}
	return p.topology.Links
}

// handle runs one request through policy, specs and adjust. It returns
// the adjustment (nil when nothing is asked for) and what the pool
// granted (no devices when nothing is asked for).
func (p *Plugin) handle(st *state, log logrus.FieldLogger, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, policy.Grant, error) {
	snap := st.specs.Snapshot() // one snapshot for the whole request
	ask, err := st.parser.Parse(policy.Container{
		Namespace:      pod.GetNamespace(),
		Pod:            pod.GetName(),
		Name:           ctr.GetName(),
		PodAnnotations: pod.GetAnnotations(),
		Annotations:    ctr.GetAnnotations(),
		CDIDevices:     cdiDeviceNames(ctr),
	})
	if err != nil {
		return nil, policy.Grant{}, err
	}
	claims, claimed, err := p.claimDevices(pod, ctr)
	if err != nil {
		return nil, policy.Grant{}, err
	}
	if ask.Empty() && len(claimed) == 0 {
		return scrub(ctr), policy.Grant{}, nil
	}
	podRef := podOf(pod)
	if err := st.policy.Check(podRef, kept(p.alloc, podRef, ask)); err != nil {
		return nil, policy.Grant{}, err
	}

	var (
		named       []*specs.Entry
		footprints  []specs.Device
		injected    []*cdi.Device
		fromKubelet []string
		errs        []error
	)
	// The devices of the claims the container uses are the claims'
	// holdings: injected (unless the runtime did), not held again.
	for _, d := range claimed {
		e, err := st.resolve(snap, d.Name)
		if err != nil {
			errs = append(errs, fmt.Errorf("DRA claim device %q: %w", d.Name, err))
			continue
		}
		named = append(named, e)
		if injectedByRuntime(e, ctr) {
			injected = append(injected, e.Device)
		}
	}
	for _, r := range ask.Requests {
		if r.Source == policy.SourceRuntime && slices.ContainsFunc(claimed, func(d specs.Device) bool { return d.Name == r.Device }) {
			continue // a claim's, above
		}
		if r.FromKubelet() {
			fromKubelet = append(fromKubelet, r.Device)
		}
		if r.Source == policy.SourceRuntime {
			// The runtime injects it from its own spec dirs: it is held
			// by the pod, and its spec's edits are not applied again.
			footprints = append(footprints, snap.Footprints([]string{r.Device})...)
			if e, err := snap.Lookup(r.Device); err == nil {
				injected = append(injected, e.Device)
			}
			continue
		}
		e, err := st.resolve(snap, r.Device)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", r, err))
			continue
		}
		named = append(named, e)
		footprints = append(footprints, e.Footprint)
		if r.Source == policy.SourceCDI && injectedByRuntime(e, ctr) {
			injected = append(injected, e.Device)
			log.WithField("device", r.Device).Info("device already injected by the runtime's own CDI support; not injected again")
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, policy.Grant{}, err
	}

	rt := p.connectedRuntime()
	// A count request passes over devices this container cannot have: a
	// hook outside policy.hookPaths, edits the runtime cannot apply.
	usable := func(d specs.Device) error {
		e, err := st.resolve(snap, d.Name)
		if err == nil {
			_, err = adjust.Build([]*cdi.Device{e.Device}, snap.HostNodes, st.buildOptions(snap, nil, ctr, rt))
		}
		return err
	}
	choice := policy.Choice{Candidates: snap.Candidates(st.cfg.DefaultKind), Usable: usable, Unhealthy: p.unhealthy()}
	if ask.Count > 1 {
		choice.Links = p.links()
	}
	grant := policy.Grant{Pod: podRef}
	if len(footprints) > 0 || ask.Count > 0 {
		if grant, err = p.alloc.Admit(st.policy, podRef, footprints, ask.Count, choice, fromKubelet, claims...); err != nil {
			return nil, policy.Grant{}, err
		}
	}
	grant.Devices = append(grant.Devices, claimed...)
	extra, err := p.mpsEdits(context.Background(), st, snap, grant.Devices)
	if err != nil {
		p.alloc.Revert(grant)
		return nil, policy.Grant{}, err
	}
	res, err := st.build(snap, named, injected, grant, ctr, rt, extra)
	if err != nil {
		p.alloc.Revert(grant)
		return nil, policy.Grant{}, err
	}
	for _, s := range res.Skipped {
		log.WithFields(logrus.Fields{"device": s.Device, "edit": s.Edit, "spec": s.Spec}).
			Warn("skipped a CDI edit the runtime cannot apply (unsupportedEdits: warn)")
	}
	for _, s := range res.Unneeded {
		log.WithFields(logrus.Fields{"device": s.Device, "edit": s.Edit, "spec": s.Spec}).
			Info("left out a CDI edit the runtime cannot apply and the container does not need (its process runs as root or has the groups)")
	}
	given := specs.Names(grant.Devices)
	res.Adjustment.AddAnnotation(DevicesAnnotation, strings.Join(given, ","))
	if len(grant.Counted) > 0 {
		res.Adjustment.AddAnnotation(CountedAnnotation, strings.Join(specs.Names(grant.Counted), ","))
	} else if _, ok := ctr.GetAnnotations()[CountedAnnotation]; ok {
		res.Adjustment.RemoveAnnotation(CountedAnnotation)
	}
	return res.Adjustment, grant, nil
}

// kept returns ask without what the pod holds already: a device it holds
// by name, its count grant. What a pod holds is kept until it is removed
// whatever door it came through, under the configuration it was given
// by (a reload logged what the new one would not give): a pod's new
// container gets it as the pod's others did. The rest is judged by the
// policy in force.
func kept(alloc *policy.Allocations, pod policy.Pod, ask policy.Ask) policy.Ask {
	holds, counted := alloc.Holds(pod.ID)
	out := ask
	out.Requests = slices.DeleteFunc(slices.Clone(ask.Requests), func(r policy.Request) bool { return holds(r.Device) })
	if counted {
		out.Count = 0
	}
	return out
}

// scrub returns the adjustment that removes the annotations nri-gpu
// writes from a container it gives nothing, or nil if it has none.
func scrub(ctr *api.Container) *api.ContainerAdjustment {
	var adj *api.ContainerAdjustment
	for _, key := range []string{DevicesAnnotation, CountedAnnotation} {
		if _, ok := ctr.GetAnnotations()[key]; ok {
			if adj == nil {
				adj = &api.ContainerAdjustment{}
			}
			adj.RemoveAnnotation(key)
		}
	}
	return adj
}

// resolve looks a device up in the trusted specs and checks its hooks.
func (st *state) resolve(snap *specs.Snapshot, name string) (*specs.Entry, error) {
	e, err := snap.Lookup(name)
	if err != nil {
		return nil, err
	}
	if err := st.policy.CheckHooks(name, e.Hooks); err != nil {
		return nil, err
	}
	return e, nil
}

// build resolves the counted devices of a grant and builds the adjustment
// for all the container's devices but those the runtime injected itself,
// and the edits of nri-gpu's own (extra).
func (st *state) build(snap *specs.Snapshot, named []*specs.Entry, injected []*cdi.Device, grant policy.Grant, ctr *api.Container, rt adjust.Runtime, extra []adjust.Extra) (*adjust.Result, error) {
	var devices []*cdi.Device
	for _, e := range named {
		if !slices.Contains(injected, e.Device) {
			devices = append(devices, e.Device)
		}
	}
	var errs []error
	for _, c := range grant.Counted {
		e, err := st.resolve(snap, c.Name)
		if err != nil {
			errs = append(errs, fmt.Errorf("pod annotation %q: %w", policy.CountAnnotationKey, err))
			continue
		}
		devices = append(devices, e.Device)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	opts := st.buildOptions(snap, injected, ctr, rt)
	opts.Extra = extra
	return adjust.Build(devices, snap.HostNodes, opts)
}

// buildOptions are the options of adjust.Build for a container.
func (st *state) buildOptions(snap *specs.Snapshot, injected []*cdi.Device, ctr *api.Container, rt adjust.Runtime) adjust.Options {
	return adjust.Options{
		SpecPath:        snap.SpecPath,
		SkipUnsupported: st.cfg.UnsupportedEdits == config.UnsupportedWarn,
		Injected:        injected,
		UID:             ctr.GetUser().GetUid(),
		GID:             ctr.GetUser().GetGid(),
		AdditionalGIDs:  ctr.GetUser().GetAdditionalGids(),
		Runtime:         rt,
	}
}

// known returns what pods hold as far as the plugin knows: what the
// state file said at start, until the first Synchronize; then the pool's.
// It ends the pending state.
func (p *Plugin) known() []policy.Holding {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.restoring {
		p.restoring = false
		return p.pending
	}
	return p.alloc.Holdings()
}

// HoldRecorded has the pool hold what the state file said pods held at
// start, as a Synchronize that found all of them running would, for a
// plugin that is not served (nri-gpu explain). It returns what the
// policy in force would not give, which the pods keep until removed (a
// *policy.ConflictError), or nil.
func (p *Plugin) HoldRecorded() error {
	return p.alloc.Restore(p.state().policy, p.known())
}

// record returns what the state file keeps: the pods' holdings (those
// read at start, while they are pending) and the prepared claims.
func (p *Plugin) record() record.Content {
	p.mu.RLock()
	pending, restoring := p.pending, p.restoring
	p.mu.RUnlock()
	if restoring {
		return record.Content{Pods: pending, Claims: p.alloc.Claims()}
	}
	return record.Content{Pods: p.alloc.Holdings(), Claims: p.alloc.Claims()}
}

// held records what pods hold: in the state file, and in the
// devices-held and rebuilt-record metrics. It returns the state file's
// error, which it also logs.
func (p *Plugin) held() error {
	var err error
	if p.saved != nil {
		if err = p.saved.Save(p.record); err != nil {
			p.log.Errorf("what pods hold is not kept for a restart: %v", err)
		}
	}
	p.metrics.DevicesHeld(p.alloc.Count()) // nil metrics: nothing
	p.metrics.RecordRebuilt(p.lost.Load() || p.alloc.Rebuilt() > 0)
	for _, f := range p.onHeld {
		f()
	}
	return err
}

// recorded records a change that added to what is held (a pod's grant, a
// prepared claim), or has undo take it back when the state file cannot
// keep it: a holding only memory knows would be handed out again after a
// restart.
func (p *Plugin) recorded(undo func()) error {
	err := p.held()
	if err == nil {
		return nil
	}
	undo()
	_ = p.held() // what was last written again, which needs no write
	return fmt.Errorf("%w: %w", ErrNotRecorded, err)
}

// cdiDeviceNames returns the CDI devices the runtime reports it injects
// into the container.
func cdiDeviceNames(ctr *api.Container) []string {
	var out []string
	for _, d := range ctr.GetCDIDevices() {
		out = append(out, d.GetName())
	}
	return out
}

// injectedByRuntime reports whether the runtime already injected a device
// into the container (containerd's own CDI support, enable_cdi, acting on
// a cdi.k8s.io annotation before NRI is called): the runtime reports it
// among the CDI devices it injects (containerd 2.x), or every device node
// and env entry of the device's own edits is there already. A device the
// runtime does not report and whose edits have neither cannot be told
// apart and counts as not injected.
func injectedByRuntime(e *specs.Entry, ctr *api.Container) bool {
	if slices.Contains(cdiDeviceNames(ctr), e.Footprint.Name) {
		return true
	}
	edits := e.Device.ContainerEdits
	if len(edits.DeviceNodes) == 0 && len(edits.Env) == 0 {
		return false
	}
	for _, n := range edits.DeviceNodes {
		if n != nil && !slices.ContainsFunc(ctr.GetLinux().GetDevices(), func(d *api.LinuxDevice) bool { return d.GetPath() == n.Path }) {
			return false
		}
	}
	for _, kv := range edits.Env {
		if !slices.Contains(ctr.GetEnv(), kv) {
			return false
		}
	}
	return true
}

func podOf(pod *api.PodSandbox) policy.Pod {
	return policy.Pod{ID: pod.GetId(), Namespace: pod.GetNamespace(), Name: pod.GetName()}
}

// maxErrorLen bounds the error returned to the runtime, which shows it to
// users (crictl, kubelet events) and must fit in one ttrpc message.
const maxErrorLen = 4096

// boundedError is an error whose message was cut to maxErrorLen.
type boundedError struct {
	msg string
	err error
}

func (e *boundedError) Error() string { return e.msg }

// Unwrap returns the whole error, for errors.Is and errors.As.
func (e *boundedError) Unwrap() error { return e.err }

// bounded returns err with its message cut to maxErrorLen.
func bounded(err error) error {
	msg := err.Error()
	if len(msg) <= maxErrorLen {
		return err
	}
	cut := fmt.Sprintf(" ... (%d more bytes; the plugin's log has all of it)", len(msg)-(maxErrorLen-64))
	return &boundedError{msg: msg[:maxErrorLen-64] + cut, err: err}
}

// rule names what refused a container, for the denials metric: a policy
// rule, or the kind of problem with the request.
func rule(err error) string {
	var d *policy.Denial
	switch {
	case err == nil:
		return ""
	case errors.As(err, &d):
		return d.Rule
	case errors.Is(err, policy.ErrInvalidRequest):
		return "invalidRequest"
	case errors.Is(err, specs.ErrUntrusted):
		return "untrustedSpec"
	case errors.Is(err, specs.ErrUnresolvable):
		return "unresolvable"
	case errors.Is(err, adjust.ErrUnsupportedEdit):
		return "unsupportedEdits"
	case errors.Is(err, ErrInjectedTwice):
		return "injectedTwice"
	case errors.Is(err, ErrNotRecorded):
		return "notRecorded"
	case errors.Is(err, ErrMPS):
		return "mps"
	}
	return "other"
}
