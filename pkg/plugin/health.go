package plugin

import (
	"context"
	"errors"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/specs/nvidia"
)

// CheckHealth looks once at the NVIDIA GPUs' health (a GPU a check finds
// lost), for a plugin that does not Serve (nri-gpu explain); without
// NVML it does nothing.
func (p *Plugin) CheckHealth() {
	m, err := nvidia.NewMonitor(p.node.hw.Lib())
	if err != nil {
		return
	}
	m.Check()
	m.Close() // what it found stays
	p.node.hw.Watching(m)
}

// watchHealth watches the NVIDIA GPUs' health through NVML as h says
// until ctx is done, calling changed with how many are unhealthy after
// each change; without NVML it says that it takes every GPU as healthy.
// When NVML stops answering for the driver loaded (its kernel module
// reloaded) it is opened again; where this process cannot load the new
// driver's NVML (still the old one: a version mismatch), stop ends
// serving with ErrDriverChanged, so that nri-gpu starts again with it,
// as spec generation does.
func (p *Plugin) watchHealth(ctx context.Context, h config.Health, changed func(unhealthy int), stop context.CancelCauseFunc) {
	m, err := nvidia.NewMonitor(p.node.hw.Lib())
	if err != nil {
		p.log.Infof("GPU health not watched (%v): every device is taken as healthy", err)
		return
	}
	defer m.Close()
	m.RecoverAfter = h.RecoverAfter
	m.OnChange = func(node, why string) {
		if why != "" {
			p.log.WithField("gpu", node).Warnf("GPU unhealthy: %s", why)
		} else {
			p.log.WithField("gpu", node).Info("GPU healthy again")
		}
		changed(len(m.Unhealthies()))
	}
	m.OnReopen = func(cause, err error) {
		switch {
		case errors.Is(err, nvml.ERROR_LIB_RM_VERSION_MISMATCH):
			p.log.Warnf("the NVIDIA driver changed under this process's NVML (GPU health: %v): starting again to load the new driver's", err)
			stop(fmt.Errorf("%w: %w", ErrDriverChanged, err))
		case err != nil:
			p.log.Warnf("GPU health not watched until NVML opens again (it answered %v; tried at each check): %v", cause, err)
		default:
			p.log.Infof("NVML answered %v for the GPUs it had (the NVIDIA driver reloaded): opened it again, watching the GPUs' health again", cause)
		}
	}
	p.node.hw.Watching(m)
	defer p.node.hw.Watching(nil)
	p.log.Infof("watching the health of NVIDIA GPUs (critical Xid events, a check every %s)", h.Interval)
	m.Run(ctx, h.Interval)
}
