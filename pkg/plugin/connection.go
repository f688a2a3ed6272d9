package plugin

import (
	"sync"
	"time"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/pkg/adjust"
)

// connection is what the plugin knows of its connection to the runtime,
// under its own lock.
type connection struct {
	mu sync.Mutex
	// configuredOK counts successful Configure calls, one per
	// connection.
	configuredOK int
	// synced says the plugin is registered with the runtime: it has had
	// Synchronize on its current connection.
	synced bool
	// configErr is the last rejected configuration from the runtime.
	configErr error
	// rt is what the connected runtime applies, decided at Configure.
	rt adjust.Runtime
	// nriVersion returns the connected runtime's NRI version, as the
	// stub of the current connection learnt it; nil outside Serve.
	nriVersion func() string
	// requestTimeout returns how long the runtime waits for an answer to
	// a request, as it said at Configure (0 when it did not); nil
	// outside Serve.
	requestTimeout func() time.Duration
}

// opening starts a connection through a stub that tells the runtime's
// NRI version and request timeout, and returns how many connections were
// configured before it.
func (c *connection) opening(nriVersion func() string, requestTimeout func() time.Duration) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.nriVersion, c.requestTimeout = nriVersion, requestTimeout
	return c.configuredOK
}

// configuring keeps what the runtime being configured applies, and
// returns its NRI version ("unknown" outside Serve).
func (c *connection) configuring(rt adjust.Runtime) (nriVersion string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rt = rt
	if c.nriVersion == nil {
		return "unknown"
	}
	return c.nriVersion()
}

// configured counts a configured connection, or keeps the error that
// refused its configuration.
func (c *connection) configured(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		c.configErr = err
		return
	}
	c.configuredOK++
}

// closed says the connection's end: whether a connection was configured
// since opening said before, and the configuration it refused, which it
// forgets.
func (c *connection) closed(before int) (wasConfigured bool, refused error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.synced = false
	refused, c.configErr = c.configErr, nil
	return c.configuredOK != before, refused
}

func (c *connection) setSynced() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.synced = true
}

func (c *connection) isSynced() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.synced
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
	timeout := c.requestTimeout
	c.mu.Unlock()
	if timeout != nil {
		if t := timeout(); t > 0 {
			return t
		}
	}
	return api.DefaultPluginRequestTimeout
}
