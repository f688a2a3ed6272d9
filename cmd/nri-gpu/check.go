package main

import (
	"flag"
	"fmt"
	"io"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/pkg/doctor"
	"github.com/nri-gpu/nri-gpu/pkg/memlimit"
	"github.com/nri-gpu/nri-gpu/pkg/record"
	"github.com/nri-gpu/nri-gpu/pkg/specs/nvidia"
)

// runCheck checks the node and prints each finding; it exits 1 on a FAIL.
func runCheck(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("nri-gpu check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	flags := addConfigFlags(fs)
	var (
		socketPath = fs.String("socket-path", api.DefaultSocketPath, "NRI socket")
		ctdConfig  = fs.String("containerd-config", "/etc/containerd/config.toml", `containerd's config.toml ("" to skip)`)
		crioConfig = fs.String("crio-config", "/etc/crio/crio.conf", `CRI-O's crio.conf, read with the drop-ins of the crio.conf.d beside it ("" to skip)`)
		stateFile  = fs.String("state-file", record.DefaultPath, `nri-gpu's state file, read and never written ("" to skip)`)
	)
	if code, done := parseFlags(fs, args); done {
		return code
	}
	in := doctor.Input{SocketPath: *socketPath, ContainerdConfig: *ctdConfig, CRIOConfig: *crioConfig, ConfigFile: *flags.file}
	cfg, err := flags.load()
	if err != nil {
		// The configuration's problems are a finding; the rest is checked
		// with the defaults.
		cfg, err = loadConfig("", *flags.specDirs)
	}
	if err != nil {
		fmt.Fprintf(stderr, "nri-gpu check: %v\n", err)
		return exitUsage
	}
	in.Config = cfg
	if cfg.Start.DRA.Enabled {
		path, err := driverPath()
		in.DRADriver = &doctor.Program{Path: path, Err: err}
	}
	if *stateFile != "" {
		rebuilt, damaged, err := record.Inspect(*stateFile)
		in.Record = &doctor.Record{Path: *stateFile, Err: err, Rebuilt: rebuilt, Damaged: damaged}
	}
	in.MemoryLimits, in.NoNVML = probeMemoryLimits(cfg.Start.DriverRoot)
	findings := doctor.Run(in)
	for _, f := range findings {
		fmt.Fprintf(stdout, "%-4s  %-22s %s\n", f.Status, f.Check, f.Detail)
		if f.Fix != "" {
			fmt.Fprintf(stdout, "      %-22s fix: %s\n", "", f.Fix)
		}
	}
	if doctor.Failed(findings) {
		return exitError
	}
	return exitOK
}

// probeMemoryLimits asks the driver under driverRoot whether it can limit
// GPU memory per cgroup on this node; nil and why where NVML does not
// open.
func probeMemoryLimits(driverRoot string) (*memlimit.Support, error) {
	s, err := memlimit.Probe(nvidia.Library(driverRoot), memlimit.Host)
	if err != nil {
		return nil, err
	}
	return &s, nil
}
