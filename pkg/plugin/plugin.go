// Package plugin is the NRI glue of nri-gpu: it receives CreateContainer
// requests, has pkg/policy read and judge the container's requests,
// pkg/specs resolve them and pkg/adjust build the adjustment, and logs
// each decision once.
package plugin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/containerd/nri/pkg/api"
	"github.com/sirupsen/logrus"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/nri-gpu/nri-gpu/pkg/adjust"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// Plugin is nri-gpu's NRI plugin. It implements the stub's Configure and
// CreateContainer interfaces, and so subscribes to CreateContainer only,
// an event every NRI-enabled containerd knows.
type Plugin struct {
	log logrus.FieldLogger
	// specDirs, when set, overrides cdiSpecDirs of every configuration.
	specDirs []string

	mu sync.RWMutex
	st *state
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
func New(cfg *config.Config, specDirs []string, log logrus.FieldLogger) (*Plugin, error) {
	p := &Plugin{log: log, specDirs: slices.Clone(specDirs)}
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
	reg, err := specs.Open(cfg.CDISpecDirs)
	if err != nil {
		return nil, err
	}
	for path, errs := range reg.Errors() {
		p.log.WithField("path", path).Warnf("CDI spec problem: %v", errors.Join(errs...))
	}
	return &state{cfg: cfg, parser: parser, policy: policy.New(cfg.Policy), specs: reg}, nil
}

// Close stops watching the spec directories.
func (p *Plugin) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.st.specs.Close()
}

// Config returns the configuration in force.
func (p *Plugin) Config() *config.Config {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.st.cfg
}

// Configure is called by the runtime when the plugin registers. A
// non-empty config (what containerd passes a pre-registered plugin from
// its plugin_config_path) replaces the configuration, parsed as a file is.
func (p *Plugin) Configure(_ context.Context, cfg, runtime, version string) (api.EventMask, error) {
	log := p.log.WithFields(logrus.Fields{"runtime": runtime, "version": version})
	if cfg == "" {
		log.Info("connected to runtime")
		return 0, nil
	}
	c, err := config.Parse([]byte(cfg))
	if err != nil {
		return 0, fmt.Errorf("configuration from runtime: %w", err)
	}
	st, err := p.newState(c)
	if err != nil {
		return 0, fmt.Errorf("configuration from runtime: %w", err)
	}
	p.mu.Lock()
	old := p.st
	p.st = st
	p.mu.Unlock()
	if err := old.specs.Close(); err != nil {
		log.Warnf("stopping the old spec watch: %v", err)
	}
	log.Info("connected to runtime, using the configuration it passed")
	return 0, nil
}

// CreateContainer injects the devices a container asks for, or fails its
// creation saying why. A container that asks for nothing is left alone.
func (p *Plugin) CreateContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	p.mu.RLock()
	st := p.st
	p.mu.RUnlock()

	log := p.log.WithFields(logrus.Fields{
		"namespace": pod.GetNamespace(),
		"pod":       pod.GetName(),
		"container": ctr.GetName(),
	})
	adj, devices, err := st.handle(pod, ctr, log)
	if err != nil {
		log.Errorf("denied: %v", err)
		return nil, nil, fmt.Errorf("nri-gpu: container %q of pod %s/%s: %w",
			ctr.GetName(), pod.GetNamespace(), pod.GetName(), err)
	}
	if adj == nil {
		log.Debug("no devices requested")
		return nil, nil, nil
	}
	log.WithField("devices", devices).Info("injected devices")
	return adj, nil, nil
}

// handle runs one request through policy, specs and adjust.
func (st *state) handle(pod *api.PodSandbox, ctr *api.Container, log logrus.FieldLogger) (*api.ContainerAdjustment, []string, error) {
	reqs, err := st.parser.Parse(policy.Container{
		Namespace:      pod.GetNamespace(),
		Pod:            pod.GetName(),
		Name:           ctr.GetName(),
		PodAnnotations: pod.GetAnnotations(),
		Annotations:    ctr.GetAnnotations(),
	})
	if err != nil {
		return nil, nil, err
	}
	if len(reqs) == 0 {
		return nil, nil, nil
	}
	if err := st.policy.Check(reqs); err != nil {
		return nil, nil, err
	}

	var (
		devices []*cdi.Device
		names   []string
		errs    []error
	)
	for _, r := range reqs {
		d, err := st.specs.Resolve([]string{r.Device})
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", r, err))
			continue
		}
		devices = append(devices, d...)
		names = append(names, r.Device)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, nil, err
	}

	res, err := adjust.Build(devices, adjust.Options{
		SkipUnsupported: st.cfg.UnsupportedEdits == config.UnsupportedWarn,
		UID:             ctr.GetUser().GetUid(),
		GID:             ctr.GetUser().GetGid(),
	})
	if err != nil {
		return nil, nil, err
	}
	for _, s := range res.Skipped {
		log.WithFields(logrus.Fields{"device": s.Device, "edit": s.Edit, "spec": s.Spec}).
			Warn("skipped a CDI edit that NRI cannot express (unsupportedEdits: warn)")
	}
	return res.Adjustment, names, nil
}
