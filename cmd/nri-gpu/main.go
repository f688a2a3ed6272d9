// Command nri-gpu is a containerd NRI plugin that injects CDI devices
// (GPUs and others) into containers from their pods' annotations, without
// relying on the runtime's own CDI support.
//
// With no subcommand it runs the plugin: this is how containerd starts a
// pre-registered plugin from its plugin_path. Subcommands:
//
//	nri-gpu generate   write the CDI spec of this node's NVIDIA GPUs (NVML)
//	nri-gpu devices    list the devices nri-gpu can inject, and the GPUs
//	nri-gpu explain    show what nri-gpu would do for a pod, or why it refuses
//	nri-gpu access     what a sandbox must reach for some devices (JSON)
//	nri-gpu check      check a node: NRI, containerd config, specs, hooks
//	nri-gpu validate   check configuration files
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/plugin"
)

// Exit codes.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run runs a subcommand, or the plugin when there is none.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "generate":
			return runGenerate(args[1:], stdout, stderr)
		case "devices":
			return runDevices(args[1:], stdout, stderr)
		case "validate":
			return runValidate(args[1:], stdout, stderr)
		case "explain":
			return runExplain(args[1:], stdout, stderr)
		case "access":
			return runAccess(args[1:], stdout, stderr)
		case "check":
			return runCheck(args[1:], stdout, stderr)
		}
	}
	return runPlugin(args, stderr)
}

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
	)
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "nri-gpu: unknown command %q\n", fs.Arg(0))
		return exitUsage
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

	p, err := plugin.New(cfg, dirs, log)
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
