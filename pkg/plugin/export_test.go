package plugin

import "github.com/containerd/nri/pkg/api"

// StopWith has the plugin stop containers with stop, for the package's
// tests, instead of killing their processes.
func (p *Plugin) StopWith(stop func(*api.Container) error) { p.stop = stop }
