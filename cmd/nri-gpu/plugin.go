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
	"github.com/nri-gpu/nri-gpu/pkg/deviceplugin"
	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
	"github.com/nri-gpu/nri-gpu/pkg/metrics"
	"github.com/nri-gpu/nri-gpu/pkg/plugin"
	"github.com/nri-gpu/nri-gpu/pkg/record"
)

// runPlugin runs the plugin with the given command-line arguments.
func runPlugin(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("nri-gpu", flag.ContinueOnError)
	fs.SetOutput(stderr)
	flags := addConfigFlags(fs)
	logs := addLogFlags(fs)
	var (
		socketPath = fs.String("socket-path", api.DefaultSocketPath, "NRI socket to connect to")
		idx        = fs.String("idx", "10", "plugin index, which orders plugins in the runtime")
		name       = fs.String("name", "nri-gpu", "plugin name")
		generate   = fs.Bool("generate-specs", false, "generate the CDI spec of the node's NVIDIA GPUs with NVML (config generate.enabled)")
		hookPath   = fs.String("hook-path", "", "the CDI hook the specs nri-gpu generates name, as the host has it (default: this executable; nri-gpu install puts one there)")
		metricsAt  = fs.String("metrics-address", "", "serve Prometheus metrics at http://ADDRESS/metrics, and the probes /healthz and /readyz (off when empty)")
		stateFile  = fs.String("state-file", record.DefaultPath, "file in which the plugin keeps which pod holds which devices, for a restart (none when empty)")
		accessDir  = fs.String("access-dir", access.DefaultDir, "directory in which the plugin keeps, for each container it gives devices, the record of what it was given, mounted read-only at "+access.Path+" (none when empty)")
		takeOver   = fs.Bool("take-over", false, "when another nri-gpu holds the state file, wait for it to stop and serve then, ready meanwhile (a rolling update with surge), instead of exiting")
	)
	if code, done := parseFlags(fs, args); done {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "nri-gpu: unknown command %q\n", fs.Arg(0))
		return exitUsage
	}
	log := logrus.StandardLogger()
	log.SetOutput(stderr)
	if err := logs.apply(log); err != nil {
		fmt.Fprintf(stderr, "nri-gpu: %v\n", err)
		return exitUsage
	}
	cfg, err := flags.load()
	if err != nil {
		fmt.Fprintf(stderr, "nri-gpu: %v\n", err)
		return exitUsage
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx, fail := context.WithCancelCause(ctx)
	defer fail(nil)
	var popts []plugin.Option
	if *flags.specDirs != "" {
		popts = append(popts, plugin.WithSpecDirs(cfg.CDISpecDirs))
	}
	if *generate {
		popts = append(popts, plugin.WithGenerate())
	}
	if *stateFile != "" {
		popts = append(popts, plugin.WithStateFile(*stateFile))
	}
	if *accessDir != "" {
		popts = append(popts, plugin.WithAccessDir(*accessDir))
	}
	if *takeOver {
		popts = append(popts, plugin.WithTakeOver(ctx))
	}
	if *hookPath != "" {
		if !filepath.IsAbs(*hookPath) {
			fmt.Fprintf(stderr, "nri-gpu: --hook-path %q is not absolute\n", *hookPath)
			return exitUsage
		}
		popts = append(popts, plugin.WithHookPath(*hookPath))
	}
	var m *metrics.Metrics
	if *metricsAt != "" {
		m = metrics.New()
		popts = append(popts, plugin.WithMetrics(m))
	}
	// Device-plugin mode: each resource served to kubelet beside the NRI
	// side, over the same specs and pool.
	// early are the doors run before the plugin is built: the DRA driver
	// of a rolling update, registered with kubelet while the nri-gpu this
	// one takes over from still serves.
	var doors, early []func(context.Context)
	dp := cfg.Start.DevicePlugin
	for _, r := range dp.Resources {
		popts = append(popts, plugin.WithDevicePlugin(r, func(res *plugin.Resource) plugin.Door {
			d := deviceplugin.New(r, dp.KubeletDir, dp.CDIDevices, res, log)
			serve := func(ctx context.Context) { _ = d.Run(ctx) }
			if dp.Relay != "" {
				// nri-gpu relay registers with kubelet and asks it.
				serve = func(ctx context.Context) {
					if err := d.ServeAt(ctx, deviceplugin.RelaySocket(dp.Relay, r.Name)); err != nil {
						log.Errorf("serving the device plugin to nri-gpu relay: %v", err)
					}
				}
			}
			doors = append(doors, serve)
			return d
		}))
	}
	if cfg.Start.DRA.Enabled {
		opts := link.Options{DRA: cfg.Start.DRA, LogLevel: *logs.level, LogFormat: *logs.format, RollingUpdate: os.Getenv(podUIDEnv)}
		opt, run, err := draDriver(opts, stderr, log, fail)
		if err != nil {
			fmt.Fprintf(stderr, "nri-gpu: %v\n", err)
			return exitUsage
		}
		popts = append(popts, opt)
		if opts.RollingUpdate != "" {
			early = append(early, run)
		} else {
			doors = append(doors, run)
		}
	}
	if cfg.Start.Events.Enabled {
		tell, run, err := podEvents(cfg.Start.Events, cfg.Start.DRA.NodeName, stderr, log)
		if err != nil {
			fmt.Fprintf(stderr, "nri-gpu: %v\n", err)
			return exitUsage
		}
		popts, doors = append(popts, plugin.WithEvents(tell)), append(doors, run)
	}
	// The probes answer from the start: not ready until the plugin is
	// built, but ready while it waits to take over, so that a rolling
	// update with surge goes on to stop the nri-gpu it replaces.
	var built atomic.Pointer[plugin.Plugin]
	if m != nil {
		ready := func() error {
			if p := built.Load(); p != nil {
				return p.Ready()
			}
			if *takeOver {
				return nil
			}
			return fmt.Errorf("%w: starting", plugin.ErrNotReady)
		}
		addr, serveErr, err := m.Serve(*metricsAt, ready)
		if err != nil {
			fmt.Fprintf(stderr, "nri-gpu: --metrics-address: %v\n", err)
			return exitError
		}
		log.Infof("serving metrics at http://%s/metrics, probes at /healthz and /readyz", addr)
		go func() { fail(fmt.Errorf("metrics server at %s: %w", addr, <-serveErr)) }()
	}
	// The doors are waited for before the plugin lets its record go
	// (Close, deferred first): an nri-gpu taking over starts its own
	// plugin only then.
	var running sync.WaitGroup
	for _, run := range early {
		running.Go(func() { run(ctx) })
	}
	p, err := plugin.New(cfg, log, popts...)
	if err != nil {
		stopped := *takeOver && ctx.Err() != nil && errors.Is(context.Cause(ctx), context.Canceled)
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
	// The configuration file, reloaded on SIGHUP and when it changes.
	if *flags.file != "" {
		d := digest(*flags.file)
		log.Infof("configuration %s: %s in force", *flags.file, d)
		m.ConfigLoaded(d)
		hup := make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		defer signal.Stop(hup)
		go watchConfig(ctx, *flags.file, d, flags.load, p, hup, configReloadInterval, log, m.ConfigLoaded)
	}
	// The doors beside the runtime's requests, run once the plugin is
	// built and until ctx is done.
	defer running.Wait()
	for _, run := range doors {
		running.Go(func() { run(ctx) })
	}
	defer fail(nil)

	if err := p.Serve(ctx, stubOptions(fs, *name, *idx, *socketPath)...); err != nil {
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
