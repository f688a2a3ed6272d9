// Package plugin is the NRI glue of nri-gpu: it receives the runtime's
// requests, has pkg/policy read and judge what a container asks for,
// pkg/specs resolve it and pkg/adjust build the adjustment, keeps track of
// which pod holds which devices, and logs each decision once.
package plugin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/containerd/nri/pkg/api"
	"github.com/sirupsen/logrus"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/nri-gpu/nri-gpu/pkg/adjust"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/metrics"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// Annotations nri-gpu adds to each container it gives devices, from which
// it rebuilds what pods hold after a restart.
const (
	// DevicesAnnotation lists the devices the container got, a kind
	// written once for a run of its devices: "nvidia.com/gpu=0,1".
	DevicesAnnotation = "nri-gpu.io/devices"
	// CountedAnnotation lists those of them chosen for a count request,
	// written the same way.
	CountedAnnotation = "nri-gpu.io/counted"
)

// Plugin is nri-gpu's NRI plugin. It handles Configure, Synchronize,
// CreateContainer, StopPodSandbox and RemovePodSandbox, all of which every
// NRI-enabled containerd (1.7 on) knows.
type Plugin struct {
	log logrus.FieldLogger
	// specDirs, when set, overrides cdiSpecDirs of every configuration.
	specDirs []string
	// alloc outlives configurations.
	alloc *policy.Allocations

	mu sync.RWMutex
	st *state
	// configured counts successful Configure calls, one per connection.
	configured int
	// configErr is the last rejected configuration from the runtime.
	configErr error

	// nvml, when set, replaces the driver's NVML for spec generation.
	nvml nvml.Interface
	// metrics is nil when metrics are off.
	metrics *metrics.Metrics
	// fragments holds the edits of the current spec snapshot prepared.
	fragments adjust.Cache

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

// New returns a plugin serving cfg. specDirs, when not empty, overrides
// the spec directories of cfg and of any later configuration.
func New(cfg *config.Config, specDirs []string, log logrus.FieldLogger, opts ...Option) (*Plugin, error) {
	p := &Plugin{log: log, specDirs: slices.Clone(specDirs), alloc: policy.NewAllocations()}
	for _, o := range opts {
		o(p)
	}
	st, err := p.newState(cfg)
	if err != nil {
		return nil, err
	}
	p.st = st
	return p, nil
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
	parser, err := policy.NewParser(cfg.DefaultKind, cfg.HonorsCDIAnnotations())
	if err != nil {
		return nil, err
	}
	reg, err := specs.Open(cfg.CDISpecDirs, specs.WithNotify(p.logProblems))
	if err != nil {
		return nil, err
	}
	p.logProblems(reg.Snapshot())
	return &state{cfg: cfg, parser: parser, policy: policy.New(cfg.Policy), specs: reg}, nil
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

// Close stops watching the spec directories.
func (p *Plugin) Close() error {
	return p.state().specs.Close()
}

// Config returns the configuration in force.
func (p *Plugin) Config() *config.Config {
	return p.state().cfg
}

// Configure is called by the runtime when the plugin registers. A
// non-empty config (what containerd passes a pre-registered plugin from
// its plugin_config_path) replaces the configuration, parsed as a file is.
func (p *Plugin) Configure(_ context.Context, cfg, runtime, version string) (api.EventMask, error) {
	log := p.log.WithFields(logrus.Fields{"runtime": runtime, "version": version})
	if cfg == "" {
		p.mu.Lock()
		p.configured++
		p.mu.Unlock()
		log.Info("connected to runtime")
		return 0, nil
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
	if err := old.specs.Close(); err != nil {
		log.Warnf("stopping the old spec watch: %v", err)
	}
	log.Info("connected to runtime, using the configuration it passed")
	return 0, nil
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

// Synchronize rebuilds what pods hold from the annotations nri-gpu put on
// their containers, so that a restarted plugin hands out no device twice.
// Pods gone while the plugin was away hold nothing any more.
func (p *Plugin) Synchronize(_ context.Context, pods []*api.PodSandbox, containers []*api.Container) ([]*api.ContainerUpdate, error) {
	snap := p.state().specs.Snapshot()
	byID := make(map[string]policy.Pod, len(pods))
	for _, pod := range pods {
		byID[pod.GetId()] = podOf(pod)
	}
	var holdings []policy.Holding
	for _, c := range containers {
		pod, ok := byID[c.GetPodSandboxId()]
		devices := expandNames(c.GetAnnotations()[DevicesAnnotation])
		if !ok || len(devices) == 0 {
			continue
		}
		counted := expandNames(c.GetAnnotations()[CountedAnnotation])
		named := slices.DeleteFunc(slices.Clone(devices), func(d string) bool { return slices.Contains(counted, d) })
		holdings = append(holdings, policy.Holding{
			Pod: pod, Named: snap.Footprints(named), Counted: snap.Footprints(counted),
		})
	}
	p.alloc.Restore(holdings)
	p.countHeld()
	for pod, devices := range p.alloc.Held() {
		p.log.WithFields(logrus.Fields{"namespace": pod.Namespace, "pod": pod.Name, "devices": compactNames(devices, identity)}).
			Info("restored devices held by pod")
	}
	return nil, nil
}

// StopPodSandbox releases the devices a pod held.
func (p *Plugin) StopPodSandbox(_ context.Context, pod *api.PodSandbox) error {
	p.release(pod)
	return nil
}

// RemovePodSandbox releases the devices a pod held, if its stop did not.
func (p *Plugin) RemovePodSandbox(_ context.Context, pod *api.PodSandbox) error {
	p.release(pod)
	return nil
}

func (p *Plugin) release(pod *api.PodSandbox) {
	defer p.countHeld()
	if released := p.alloc.Release(pod.GetId()); len(released) > 0 {
		p.log.WithFields(logrus.Fields{"namespace": pod.GetNamespace(), "pod": pod.GetName(), "devices": compactNames(released, identity)}).
			Info("released devices")
	}
}

// CreateContainer injects the devices a container asks for, or fails its
// creation saying why. A container that asks for nothing is left alone.
func (p *Plugin) CreateContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	start := time.Now()
	sc := scratches.Get().(*scratch)
	defer sc.release()
	adj, devices, err := p.handle(p.state(), pod, ctr, sc)
	result := metrics.ResultInjected
	switch {
	case err != nil:
		result = metrics.ResultDenied
	case adj == nil:
		result = metrics.ResultNone
	}
	p.metrics.Request(result, err, time.Since(start))
	p.countHeld()
	if err != nil {
		logFor(p.log, pod, ctr, "", nil).Errorf("denied: %v", err)
		return nil, nil, fmt.Errorf("nri-gpu: container %q of pod %s/%s: %w",
			ctr.GetName(), pod.GetNamespace(), pod.GetName(), err)
	}
	if adj == nil {
		if debugEnabled(p.log) {
			logFor(p.log, pod, ctr, "", nil).Debug("no devices requested")
		}
		return nil, nil, nil
	}
	logFor(p.log, pod, ctr, "devices", devices).Info("injected devices")
	return adj, nil, nil
}

// logFor returns log with the fields naming a container and, when key is
// not empty, one more. Requests build it only when they log.
func logFor(log logrus.FieldLogger, pod *api.PodSandbox, ctr *api.Container, key string, value any) logrus.FieldLogger {
	fields := logrus.Fields{
		"namespace": pod.GetNamespace(),
		"pod":       pod.GetName(),
		"container": ctr.GetName(),
	}
	if key != "" {
		fields[key] = value
	}
	return log.WithFields(fields)
}

// debugEnabled reports whether log writes debug messages, so that a
// request that asks for nothing builds no log entry otherwise.
func debugEnabled(log logrus.FieldLogger) bool {
	switch l := log.(type) {
	case *logrus.Logger:
		return l.IsLevelEnabled(logrus.DebugLevel)
	case *logrus.Entry:
		return l.Logger.IsLevelEnabled(logrus.DebugLevel)
	}
	return true
}

// handle runs one request through policy, specs and adjust. It returns
// the adjustment (nil when nothing is asked for) and the devices given, as
// in DevicesAnnotation.
func (p *Plugin) handle(st *state, pod *api.PodSandbox, ctr *api.Container, sc *scratch) (*api.ContainerAdjustment, string, error) {
	snap := st.specs.Snapshot() // one snapshot for the whole request
	ask, err := st.parser.ParseAppend(sc.requests, policy.Container{
		Namespace:      pod.GetNamespace(),
		Pod:            pod.GetName(),
		Name:           ctr.GetName(),
		PodAnnotations: pod.GetAnnotations(),
		Annotations:    ctr.GetAnnotations(),
	})
	if err != nil {
		return nil, "", err
	}
	sc.requests = ask.Requests
	if ask.Empty() {
		return nil, "", nil
	}
	podRef := podOf(pod)
	if err := st.policy.Check(podRef, ask); err != nil {
		return nil, "", err
	}

	var (
		named      = sc.named[:0]
		footprints = sc.footprints[:0]
		injected   []*specs.Entry
		errs       []error
	)
	for _, r := range ask.Requests {
		e, err := st.resolve(snap, r.Device)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", r, err))
			continue
		}
		named = append(named, e)
		footprints = append(footprints, e.Footprint)
		if r.Source == policy.SourceCDI && injectedByRuntime(e, ctr) {
			injected = append(injected, e)
			logFor(p.log, pod, ctr, "device", r.Device).Info("device already injected by the runtime's own CDI support; not injected again")
		}
	}
	sc.named, sc.footprints = named, footprints
	if err := errors.Join(errs...); err != nil {
		return nil, "", err
	}
	var candidates []specs.Device
	if ask.Count > 0 || st.cfg.Policy.MaxDevicesPerPod > 0 {
		candidates = snap.Candidates(st.cfg.DefaultKind)
	}

	grant, err := p.alloc.Admit(st.policy, podRef, footprints, ask.Count, candidates)
	if err != nil {
		return nil, "", err
	}
	adj, err := st.build(&p.fragments, snap, named, injected, grant, ctr, sc)
	if err != nil {
		p.alloc.Revert(grant)
		return nil, "", err
	}
	for _, s := range adj.skipped {
		logFor(p.log, pod, ctr, "", nil).WithFields(logrus.Fields{"device": s.Device, "edit": s.Edit, "spec": s.Spec}).
			Warn("skipped a CDI edit that NRI cannot express (unsupportedEdits: warn)")
	}
	return adj.adjustment, adj.devices, nil
}

// scratch holds the lists a request builds and drops, kept for the next
// request so that serving one allocates little beyond its adjustment.
type scratch struct {
	requests   []policy.Request
	named      []*specs.Entry
	footprints []specs.Device
	devices    []*cdi.Device
}

var scratches = sync.Pool{New: func() any { return new(scratch) }}

// release empties the lists, so that they hold on to no snapshot, and
// returns them to the pool. Nothing of the request may use them after.
func (sc *scratch) release() {
	clear(sc.requests)
	clear(sc.named)
	clear(sc.footprints)
	clear(sc.devices)
	sc.requests, sc.named, sc.footprints, sc.devices = sc.requests[:0], sc.named[:0], sc.footprints[:0], sc.devices[:0]
	scratches.Put(sc)
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

type built struct {
	adjustment *api.ContainerAdjustment
	skipped    []adjust.Skipped
	// devices are the devices given, as in DevicesAnnotation.
	devices string
}

// build resolves the counted devices of a grant and builds the adjustment
// for all the container's devices, recording them in annotations.
func (st *state) build(cache *adjust.Cache, snap *specs.Snapshot, named, injected []*specs.Entry, grant policy.Grant, ctr *api.Container, sc *scratch) (built, error) {
	devices := sc.devices[:0]
	defer func() { sc.devices = devices }()
	var already []*cdi.Device
	for _, e := range named {
		if slices.Contains(injected, e) {
			already = append(already, e.Device)
			continue
		}
		devices = append(devices, e.Device)
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
		return built{}, err
	}
	res, err := adjust.BuildCached(cache, snap, devices, snap.HostNodes, adjust.Options{
		SkipUnsupported: st.cfg.UnsupportedEdits == config.UnsupportedWarn,
		Injected:        already,
		UID:             ctr.GetUser().GetUid(),
		GID:             ctr.GetUser().GetGid(),
	})
	if err != nil {
		return built{}, err
	}
	given := compactNames(grant.Devices, deviceName)
	res.Adjustment.AddAnnotation(DevicesAnnotation, given)
	if len(grant.Counted) > 0 {
		res.Adjustment.AddAnnotation(CountedAnnotation, compactNames(grant.Counted, deviceName))
	}
	return built{adjustment: res.Adjustment, skipped: res.Skipped, devices: given}, nil
}

// countHeld updates the devices-held metric.
func (p *Plugin) countHeld() {
	if p.metrics == nil {
		return
	}
	p.metrics.DevicesHeld(p.alloc.Count())
}

// injectedByRuntime reports whether the runtime already injected a device
// into the container (containerd's own CDI support, enable_cdi, acting on
// a cdi.k8s.io annotation before NRI is called): every device node and
// env entry of the device's own edits is already there. A device with
// neither cannot be told apart and counts as not injected.
func injectedByRuntime(e *specs.Entry, ctr *api.Container) bool {
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
