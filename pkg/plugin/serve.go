package plugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
)

// Backoff bounds between reconnection attempts.
const (
	MinBackoff = 500 * time.Millisecond
	MaxBackoff = 5 * time.Second
)

// Serve connects the plugin to the runtime and serves it until ctx is
// done. An external plugin whose connection fails or closes (containerd
// restarted or upgraded) connects again after a backoff doubling from
// MinBackoff to MaxBackoff, logging each attempt: it never gives up. A
// pre-registered plugin (started by containerd, on a socket containerd
// passed it) cannot reconnect: it returns, and containerd starts it anew.
//
// Serve returns nil when ctx is done or a pre-registered connection
// closed, and an error only for bad stub options, a configuration the
// runtime handed over that was rejected (wrapping ErrConfig), or the
// NVIDIA driver replaced under this process's NVML (ErrDriverChanged).
func (p *Plugin) Serve(ctx context.Context, opts ...stub.Option) error {
	preRegistered := PreRegistered()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil) // stops the generator whenever Serve returns
	go p.generateEvery(ctx, cancel)
	go p.watchHealth(ctx, p.inForce.start.Health, func(unhealthy int) {
		p.metrics.UnhealthyGPUs(unhealthy)
		p.notifyDoors()
	}, cancel)
	go p.node.mps.run(ctx)
	delay := MinBackoff
	for attempt := 1; ; attempt++ {
		s, err := stub.New(p, opts...)
		if err != nil {
			return fmt.Errorf("creating the NRI stub: %w", err)
		}
		p.conn.opening(s)
		err = s.Run(ctx)
		wasConfigured, cfgErr := p.conn.closed()
		if ctx.Err() != nil {
			return driverChanged(ctx)
		}
		if cfgErr != nil {
			return fmt.Errorf("%w: %w", ErrConfig, cfgErr)
		}
		if preRegistered {
			p.log.Warnf("connection to the runtime lost (%v); a pre-registered plugin exits and is started again by the runtime", err)
			return nil
		}
		if wasConfigured {
			delay = MinBackoff // it was connected: start the backoff anew
		}
		p.log.Warnf("NRI connection failed or lost (%v); reconnecting in %s (attempt %d)", err, delay, attempt)
		select {
		case <-ctx.Done():
			return driverChanged(ctx)
		case <-time.After(delay):
		}
		delay = min(2*delay, MaxBackoff)
	}
}

// driverChanged returns why Serve's ctx ended when it is ErrDriverChanged,
// else nil (ctx was done).
func driverChanged(ctx context.Context) error {
	if err := context.Cause(ctx); errors.Is(err, ErrDriverChanged) {
		return err
	}
	return nil
}

// PreRegistered reports whether the runtime started this plugin, handing
// it its connection (a pre-registered plugin), which cannot be opened
// again.
func PreRegistered() bool { return os.Getenv(api.PluginSocketEnvVar) != "" }
