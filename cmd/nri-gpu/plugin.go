package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/metrics"
	"github.com/nri-gpu/nri-gpu/pkg/plugin"
)

// runPlugin runs the plugin with the given command-line arguments.
func runPlugin(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("nri-gpu", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		socketPath = fs.String("socket-path", api.DefaultSocketPath, "NRI socket to connect to")
		configFile = fs.String("config", "", "YAML configuration file")
		specDirs   = fs.String("cdi-spec-dirs", "", "comma-separated CDI spec directories, later ones winning (overrides cdiSpecDirs; default "+strings.Join(config.DefaultCDISpecDirs, ",")+")")
		idx        = fs.String("idx", "10", "plugin index, which orders plugins in the runtime")
		name       = fs.String("name", "nri-gpu", "plugin name")
		logLevel   = fs.String("log-level", "info", "log level: debug, info, warn or error")
		generate   = fs.Bool("generate-specs", false, "generate the CDI spec of the node's NVIDIA GPUs with NVML (config generateSpecs)")
		metricsAt  = fs.String("metrics-address", "", "serve Prometheus metrics at http://ADDRESS/metrics (off when empty)")
	)
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "nri-gpu: unknown command %q\n", fs.Arg(0))
		return exitUsage
	}

	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(plugin.GCPercent)
	}
	log := logrus.StandardLogger()
	log.SetOutput(stderr)
	level, err := logrus.ParseLevel(*logLevel)
	if err != nil {
		fmt.Fprintf(stderr, "nri-gpu: --log-level: %v\n", err)
		return exitUsage
	}
	log.SetLevel(level)

	cfg := config.Default()
	if *configFile != "" {
		if cfg, err = config.Load(*configFile); err != nil {
			fmt.Fprintf(stderr, "nri-gpu: %v\n", err)
			return exitUsage
		}
	}
	if *generate {
		cfg.GenerateSpecs = true
	}
	var dirs []string
	if *specDirs != "" {
		dirs = strings.Split(*specDirs, ",")
	}

	var popts []plugin.Option
	if *metricsAt != "" {
		m := metrics.New()
		addr, _, err := m.Serve(*metricsAt)
		if err != nil {
			fmt.Fprintf(stderr, "nri-gpu: --metrics-address: %v\n", err)
			return exitUsage
		}
		log.Infof("serving metrics at http://%s/metrics", addr)
		popts = append(popts, plugin.WithMetrics(m))
	}
	p, err := plugin.New(cfg, dirs, log, popts...)
	if err != nil {
		fmt.Fprintf(stderr, "nri-gpu: %v\n", err)
		return exitUsage
	}
	defer p.Close()

	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var opts []stub.Option
	// A pre-registered plugin gets its name and index from the runtime's
	// environment; the flags' defaults apply only without it.
	if set["name"] || os.Getenv(api.PluginNameEnvVar) == "" {
		opts = append(opts, stub.WithPluginName(*name))
	}
	if set["idx"] || os.Getenv(api.PluginIdxEnvVar) == "" {
		opts = append(opts, stub.WithPluginIdx(*idx))
	}
	if set["socket-path"] {
		opts = append(opts, stub.WithSocketPath(*socketPath))
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := p.Serve(ctx, opts...); err != nil {
		log.Errorf("nri-gpu: %v", err)
		return exitUsage
	}
	log.Info("plugin stopped")
	return exitOK
}
