package plugin

import (
	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/pkg/recovery"
)

// StopWith has the plugin stop containers with stop, for the package's
// tests, instead of killing their processes.
func (p *Plugin) StopWith(stop func(*api.Container) error) { p.stopper = stopFunc(stop) }

// stopFunc is a stopper that calls itself.
type stopFunc func(*api.Container) error

func (f stopFunc) Stop(c *api.Container) error { return f(c) }

// WithSandboxCheck has the plugin take a process for a pod's sandbox as
// is tells, for the package's tests, instead of by its cgroup.
func WithSandboxCheck(is func(pid int, podID string) bool) Option {
	return func(p *Plugin) { p.recovered = recovery.New(p.life.closed.Done(), is) }
}
