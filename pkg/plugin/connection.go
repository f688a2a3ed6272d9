package plugin

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/pkg/adjust"
)

// connection is what the plugin knows of its connection to the runtime,
// under its own lock.
type connection struct {
	// synced says the plugin is registered with the runtime: it has had
	// Synchronize on its current connection.
	synced atomic.Bool
	mu     sync.Mutex
	// configuredOK says a Configure succeeded on the current
	// connection.
	configuredOK bool
	// configErr is the last rejected configuration from the runtime.
	configErr error
	// rt is what the connected runtime applies, decided at Configure.
	rt adjust.Runtime
	// side tells of the runtime the current connection is to; nil
	// outside Serve.
	side runtimeSide
}

// runtimeSide is what the stub of a connection learnt of the runtime
// (NRI's stub.Stub): its NRI version, and how long it waits for an
// answer to a request, as it said at Configure (0 when it did not).
type runtimeSide interface {
	RuntimeNRIVersion() string
	RequestTimeout() time.Duration
}

// opening starts a connection through a stub that tells the runtime's
// NRI version and request timeout.
func (c *connection) opening(side runtimeSide) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.side = side
	c.configuredOK, c.configErr = false, nil
}

// configuring keeps and returns what the runtime being configured, of
// name and version, applies, by the NRI version it runs: as the runtime
// reports it or NRI's stub infers it (stub, which decides the events
// subscribed), else as NRI's map of runtime releases tells it from the
// release spelt with a "v" (containerd reports one, CRI-O does not). The
// map's word is not taken for events: it gives CRI-O 1.34.0 NRI v0.10.0,
// whose validation that CRI-O refuses (`invalid plugin events`).
func (c *connection) configuring(name, version string) (rt adjust.Runtime, stub string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	stub = api.UnknownVersion
	if c.side != nil {
		stub = c.side.RuntimeNRIVersion()
	}
	nriVersion := stub
	switch stub {
	case "", api.UnknownVersion, api.DevelVersion:
		if v, err := adjust.InferNRI(name, version); err == nil {
			nriVersion = v
		}
	}
	c.rt = adjust.RuntimeOf(name, version, nriVersion)
	return c.rt, stub
}

// configured says the connection's Configure succeeded, or keeps the
// error that refused the configuration it was handed.
func (c *connection) configured(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		c.configErr = err
		return
	}
	c.configuredOK = true
}

// closed says the connection's end: whether its Configure succeeded, and
// the configuration it refused.
func (c *connection) closed() (wasConfigured bool, refused error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.synced.Store(false)
	return c.configuredOK, c.configErr
}

// runtime returns what the connected runtime applies.
func (c *connection) runtime() adjust.Runtime {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rt
}

// patience returns how long the connected runtime waits for an answer
// to a request: what it said at Configure, else NRI's default
// (containerd's: 2 s).
func (c *connection) patience() time.Duration {
	c.mu.Lock()
	side := c.side
	c.mu.Unlock()
	if side != nil {
		if t := side.RequestTimeout(); t > 0 {
			return t
		}
	}
	return api.DefaultPluginRequestTimeout
}
