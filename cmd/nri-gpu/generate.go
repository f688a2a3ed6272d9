package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/nri-gpu/nri-gpu/pkg/adjust"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
	"github.com/nri-gpu/nri-gpu/pkg/specs/nvidia"
)

// DefaultSpecPath is where generate writes by default.
const DefaultSpecPath = "/var/run/cdi/nvidia.com-gpu.yaml"

// runGenerate writes the CDI spec of the node's NVIDIA GPUs, read from
// the NVML lib returns for the driver root (nvidia.Library: the driver's;
// tests give go-nvml's mock).
func runGenerate(args []string, stdout, stderr io.Writer, lib func(driverRoot string) nvml.Interface) int {
	fs := flag.NewFlagSet("nri-gpu generate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		output     = fs.String("output", DefaultSpecPath, `spec file to write, or "-" for standard output`)
		driverRoot = fs.String("driver-root", config.DefaultDriverRoot, "root of the driver's files (device nodes, libraries, /proc)")
		kind       = fs.String("kind", config.DefaultKind, "the spec's kind, vendor/class")
		strategies = fs.String("device-name-strategy", "index,uuid", "device names: index, uuid, or both")
		devRoot    = fs.String("dev-root", "", "root of the driver's /dev (default: the driver root)")
		mkNodes    = fs.Bool("create-device-nodes", true, "make the control device nodes the loaded driver has but the dev root lacks (nvidia-uvm before the first CUDA call)")
		hookPath   = fs.String("hook-path", selfPath(), "the CDI hook the spec's hooks run: nri-gpu itself (the default), nvidia-cdi-hook, or nvidia-ctk")
		format     = fs.String("format", "", "yaml or json (default: from the file name, else yaml)")
		hookFree   = fs.Bool("hook-free", false, "write a spec with no hook: NVIDIA's hooks replaced by mounts and device nodes, as hookFree injects (docs/hook-free.md)")
	)
	if code, done := parseFlags(fs, args); done {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "nri-gpu generate: unexpected argument %q\n", fs.Arg(0))
		return exitUsage
	}
	if *format == "" {
		*format = "yaml"
		if filepath.Ext(*output) == ".json" {
			*format = "json"
		}
	}
	if *format != "yaml" && *format != "json" {
		fmt.Fprintf(stderr, "nri-gpu generate: --format %q is neither yaml nor json\n", *format)
		return exitUsage
	}
	opts := nvidia.Options{
		DriverRoot: *driverRoot, DevRoot: *devRoot, Kind: *kind, HookPath: *hookPath, CreateControlNodes: *mkNodes,
		NameStrategies: strings.Split(*strategies, ","),
	}
	spec, err := nvidia.Generate(lib(*driverRoot), opts)
	if err != nil {
		fmt.Fprintf(stderr, "nri-gpu generate: %v\n", err)
		if errors.Is(err, nvidia.ErrOptions) {
			return exitUsage
		}
		return exitError
	}
	if *hookFree {
		left, err := adjust.WithoutHooks(spec, specs.LibrarySonames(spec))
		if err != nil {
			fmt.Fprintf(stderr, "nri-gpu generate: %v\n", err)
			return exitError
		}
		said := map[string]bool{}
		for _, l := range left {
			if msg := fmt.Sprintf("left out %s: the container lacks %s", l.Hook, l.Lacks); !said[msg] {
				said[msg] = true
				fmt.Fprintf(stderr, "nri-gpu generate: %s\n", msg)
			}
		}
	}
	if err := nvidia.Write(spec, *output, *format, stdout); err != nil {
		fmt.Fprintf(stderr, "nri-gpu generate: %v\n", err)
		return exitError
	}
	if *output != "-" {
		fmt.Fprintf(stderr, "nri-gpu generate: wrote %s (%d devices, CDI %s)\n", *output, len(spec.Devices), spec.Version)
	}
	return exitOK
}

// selfPath returns the path of the running nri-gpu, the default hook of
// the specs it generates.
func selfPath() string {
	p, err := os.Executable()
	if err != nil {
		return ""
	}
	return p
}
