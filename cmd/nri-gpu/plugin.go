package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/pkg/access"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/deviceplugin"
	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
	"github.com/nri-gpu/nri-gpu/pkg/metrics"
	"github.com/nri-gpu/nri-gpu/pkg/plugin"
	"github.com/nri-gpu/nri-gpu/pkg/record"
)

// pluginFlagSet is the plugin's command line.
type pluginFlagSet struct {
	fs     *flag.FlagSet
	config configFlags
	logs   logFlags

	socketPath, idx, name                     *string
	hookPath, metricsAt, stateFile, accessDir *string
	generate, takeOver                        *bool
}

// pluginFlags defines the plugin's flags, saying what goes wrong on w.
func pluginFlags(w io.Writer) *pluginFlagSet {
	fs := flag.NewFlagSet("nri-gpu", flag.ContinueOnError)
	fs.SetOutput(w)
	f := &pluginFlagSet{fs: fs, config: addConfigFlags(fs), logs: addLogFlags(fs)}
	f.socketPath = fs.String("socket-path", api.DefaultSocketPath, "NRI socket to connect to")
	f.idx = fs.String("idx", "10", "plugin index, which orders plugins in the runtime")
	f.name = fs.String("name", "nri-gpu", "plugin name")
	f.generate = fs.Bool("generate-specs", false, "generate the CDI spec of the node's NVIDIA GPUs with NVML (config generate.enabled)")
	f.hookPath = fs.String("hook-path", "", "the CDI hook the specs nri-gpu generates name, as the host has it (default: this executable; nri-gpu install puts one there)")
	f.metricsAt = fs.String("metrics-address", "", "serve Prometheus metrics at http://ADDRESS/metrics, and the probes /healthz and /readyz (off when empty)")
	f.stateFile = fs.String("state-file", record.DefaultPath, "file in which the plugin keeps which pod holds which devices, for a restart (none when empty)")
	f.accessDir = fs.String("access-dir", access.DefaultDir, "directory in which the plugin keeps, for each container it gives devices, its access file (what it was given), mounted read-only at "+access.Path+" (none when empty)")
	f.takeOver = fs.Bool("take-over", false, "when another nri-gpu holds the state file, wait for it to stop and serve then, ready meanwhile (a rolling update with surge), instead of exiting")
	fs.Usage = func() { usage(w) }
	return f
}

// options are the plugin's options the flags set.
func (f *pluginFlagSet) options(ctx context.Context, cfg *config.Config) ([]plugin.Option, error) {
	var popts []plugin.Option
	if *f.config.specDirs != "" {
		popts = append(popts, plugin.WithSpecDirs(cfg.CDISpecDirs))
	}
	if *f.generate {
		popts = append(popts, plugin.WithGenerate())
	}
	if *f.stateFile != "" {
		popts = append(popts, plugin.WithStateFile(*f.stateFile))
	}
	if *f.accessDir != "" {
		popts = append(popts, plugin.WithAccessDir(*f.accessDir))
	}
	if *f.takeOver {
		popts = append(popts, plugin.WithTakeOver(ctx))
	}
	if *f.hookPath != "" {
		if !filepath.IsAbs(*f.hookPath) {
			return nil, fmt.Errorf("--hook-path %q is not absolute", *f.hookPath)
		}
		popts = append(popts, plugin.WithHookPath(*f.hookPath))
	}
	return popts, nil
}

// openDoors returns the device plugins, the DRA driver and the pods'
// events that cfg's start block turns on.
func (f *pluginFlagSet) openDoors(cfg *config.Config, stderr io.Writer, log *logrus.Logger, fail context.CancelCauseFunc) (*doors, error) {
	d := &doors{resources: map[*deviceplugin.Later]config.Resource{}, draCfg: cfg.Start.DRA}
	dp := cfg.Start.DevicePlugin
	for _, r := range dp.Resources {
		view := &deviceplugin.Later{}
		d.resources[view] = r
		door := deviceplugin.New(r, dp.KubeletDir, dp.CDIDevices, view, log)
		serve := func(ctx context.Context) { _ = door.Run(ctx) }
		if dp.Relay != "" {
			// nri-gpu relay registers with kubelet and asks it.
			serve = func(ctx context.Context) {
				if err := door.ServeAt(ctx, deviceplugin.RelaySocket(dp.Relay, r.Name)); err != nil {
					log.Errorf("serving the device plugin to nri-gpu relay: %v", err)
				}
			}
		}
		d.opts, d.later = append(d.opts, plugin.WithDevicePlugin(door)), append(d.later, serve)
	}
	if cfg.Start.DRA.Enabled {
		opts := link.Options{DRA: cfg.Start.DRA, LogLevel: *f.logs.level, LogFormat: *f.logs.format, RollingUpdate: os.Getenv(podUIDEnv)}
		driver, pool, run, err := draDriver(opts, stderr, log, fail)
		if err != nil {
			return nil, err
		}
		d.opts, d.dra = append(d.opts, plugin.WithDRA(driver)), pool
		if opts.RollingUpdate != "" {
			d.early = append(d.early, run)
		} else {
			d.later = append(d.later, run)
		}
	}
	if cfg.Start.Events.Enabled {
		sink, run, err := podEvents(cfg.Start.Events, cfg.Start.DRA.NodeName, stderr, log)
		if err != nil {
			return nil, err
		}
		d.opts, d.later = append(d.opts, plugin.WithEvents(sink)), append(d.later, run)
	}
	return d, nil
}

// serveMetrics serves the metrics and probes at the flag's address when
// it is set, and returns them (nil when off). The probes answer from the
// start: not ready until the plugin is built, but ready while it waits
// to take over, so that a rolling update with surge goes on to stop the
// nri-gpu it replaces.
func (f *pluginFlagSet) serveMetrics(built *atomic.Pointer[plugin.Plugin], log *logrus.Logger, fail context.CancelCauseFunc) (*metrics.Metrics, error) {
	if *f.metricsAt == "" {
		return nil, nil
	}
	m := metrics.New()
	ready := func() error {
		if p := built.Load(); p != nil {
			return p.Ready()
		}
		if *f.takeOver {
			return nil
		}
		return fmt.Errorf("%w: starting", plugin.ErrNotReady)
	}
	addr, serveErr, err := m.Serve(*f.metricsAt, ready)
	if err != nil {
		return nil, fmt.Errorf("--metrics-address: %w", err)
	}
	log.Infof("serving metrics at http://%s/metrics, probes at /healthz and /readyz", addr)
	go func() { fail(fmt.Errorf("metrics server at %s: %w", addr, <-serveErr)) }()
	return m, nil
}

// runPlugin runs the plugin with the given command-line arguments.
func runPlugin(args []string, stderr io.Writer) int {
	f := pluginFlags(stderr)
	if code, done := parseFlags(f.fs, args); done {
		return code
	}
	if f.fs.NArg() > 0 {
		fmt.Fprintf(stderr, "nri-gpu: unknown command %q; nri-gpu help lists the commands\n", f.fs.Arg(0))
		return exitUsage
	}
	log := logrus.StandardLogger()
	log.SetOutput(stderr)
	if err := f.logs.apply(log); err != nil {
		fmt.Fprintf(stderr, "nri-gpu: %v\n", err)
		return exitUsage
	}
	inForce := ""
	if *f.config.file != "" {
		// Taken before the file is loaded: a change in between is then
		// seen by the watcher and reloaded.
		inForce = digest(*f.config.file)
	}
	cfg, err := f.config.load()
	if err != nil {
		fmt.Fprintf(stderr, "nri-gpu: %v\n", err)
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx, fail := context.WithCancelCause(ctx)
	defer fail(nil)
	popts, err := f.options(ctx, cfg)
	if err != nil {
		fmt.Fprintf(stderr, "nri-gpu: %v\n", err)
		return exitUsage
	}
	d, err := f.openDoors(cfg, stderr, log, fail)
	if err != nil {
		fmt.Fprintf(stderr, "nri-gpu: %v\n", err)
		return exitUsage
	}
	var built atomic.Pointer[plugin.Plugin]
	m, err := f.serveMetrics(&built, log, fail)
	if err != nil {
		fmt.Fprintf(stderr, "nri-gpu: %v\n", err)
		return exitError
	}
	if m != nil {
		popts = append(popts, plugin.WithMetrics(m))
	}
	if inForce != "" {
		// Said from the start: an nri-gpu waiting to take over is ready
		// before its plugin is built.
		log.Infof("configuration %s: %s in force", *f.config.file, inForce)
		m.ConfigLoaded(inForce)
	}
	return f.serve(ctx, fail, cfg, append(popts, d.opts...), d, &built, m, log, stderr, inForce)
}

// serve builds the plugin and serves the runtime and the doors until
// ctx is done, and returns the exit code. The doors are waited for before
// the plugin lets its record go (Close, deferred first): an nri-gpu
// taking over starts its own plugin only then.
func (f *pluginFlagSet) serve(ctx context.Context, fail context.CancelCauseFunc, cfg *config.Config, popts []plugin.Option, d *doors,
	built *atomic.Pointer[plugin.Plugin], m *metrics.Metrics, log *logrus.Logger, stderr io.Writer, inForce string) int {
	var running sync.WaitGroup
	for _, run := range d.early {
		running.Go(func() { run(ctx) })
	}
	p, err := plugin.New(cfg, log, popts...)
	if err != nil {
		stopped := *f.takeOver && ctx.Err() != nil && errors.Is(context.Cause(ctx), context.Canceled)
		fail(nil)
		running.Wait()
		if stopped {
			log.Info("plugin stopped before taking over")
			return exitOK
		}
		fmt.Fprintf(stderr, "nri-gpu: %v\n", err)
		return exitUsage
	}
	built.Store(p)
	defer p.Close()
	d.serveViews(p)
	if *f.config.file != "" {
		stopWatching := f.watchConfig(ctx, p, inForce, m, log)
		defer stopWatching()
	}
	defer running.Wait()
	for _, run := range d.later {
		running.Go(func() { run(ctx) })
	}
	defer fail(nil)
	return exitCode(ctx, p.Serve(ctx, stubOptions(f.fs, *f.name, *f.idx, *f.socketPath)...), log)
}

// watchConfig reloads the configuration file on SIGHUP and when it
// changes from inForce, until ctx is done; it returns what stops
// listening for SIGHUP.
func (f *pluginFlagSet) watchConfig(ctx context.Context, p *plugin.Plugin, inForce string, m *metrics.Metrics, log *logrus.Logger) func() {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go watchConfig(ctx, *f.config.file, inForce, f.config.load, p, hup, configReloadInterval, log, m.ConfigLoaded)
	return func() { signal.Stop(hup) }
}

// exitCode is nri-gpu's exit code once Serve returned err, ctx done.
func exitCode(ctx context.Context, err error, log *logrus.Logger) int {
	if err != nil {
		// A pre-registered plugin's connection was handed to it by the
		// runtime and cannot be opened again: it exits.
		if errors.Is(err, plugin.ErrDriverChanged) && !plugin.PreRegistered() {
			log.Info("starting again")
			return exitRestart
		}
		log.Errorf("nri-gpu: %v", err)
		if errors.Is(err, plugin.ErrConfig) {
			return exitUsage
		}
		return exitError
	}
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		log.Errorf("nri-gpu: %v", err)
		return exitError
	}
	log.Info("plugin stopped")
	return exitOK
}

// stubOptions passes NRI's stub the flags that were set. A pre-registered
// plugin gets its name and index from the runtime's environment; the
// flags' defaults apply only without it.
func stubOptions(fs *flag.FlagSet, name, idx, socketPath string) []stub.Option {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var opts []stub.Option
	if set["name"] || os.Getenv(api.PluginNameEnvVar) == "" {
		opts = append(opts, stub.WithPluginName(name))
	}
	if set["idx"] || os.Getenv(api.PluginIdxEnvVar) == "" {
		opts = append(opts, stub.WithPluginIdx(idx))
	}
	if set["socket-path"] {
		opts = append(opts, stub.WithSocketPath(socketPath))
	}
	return opts
}
