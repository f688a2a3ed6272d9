package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"

	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/nri-gpu/nri-gpu/pkg/adjust"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// runAccess prints, as JSON, what a sandbox must reach for the devices
// named (qualified, or short names of the default kind).
func runAccess(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("nri-gpu access", flag.ContinueOnError)
	fs.SetOutput(stderr)
	flags := addConfigFlags(fs)
	if code, done := parseFlags(fs, args); done {
		return code
	}
	if fs.NArg() == 0 {
		fmt.Fprintln(stderr, "usage: nri-gpu access [--cdi-spec-dirs DIR,...] DEVICE...")
		return exitUsage
	}
	cfg, err := flags.load()
	if err != nil {
		fmt.Fprintf(stderr, "nri-gpu access: %v\n", err)
		return exitUsage
	}
	parser, err := policy.NewParser(cfg.DefaultKind, false)
	if err != nil {
		fmt.Fprintf(stderr, "nri-gpu access: %v\n", err)
		return exitUsage
	}
	// The device list is parsed as a pod annotation would be.
	ask, err := parser.Parse(policy.Container{PodAnnotations: map[string]string{policy.AnnotationKey: strings.Join(fs.Args(), ",")}})
	if err != nil {
		fmt.Fprintf(stderr, "nri-gpu access: %v\n", err)
		return exitUsage
	}
	snap, err := specs.Load(cfg.CDISpecDirs)
	if err != nil {
		fmt.Fprintf(stderr, "nri-gpu access: %v\n", err)
		return exitError
	}
	var names []string
	for _, r := range ask.Requests {
		names = append(names, r.Device)
	}
	entries, err := snap.Resolve(names)
	if err != nil {
		fmt.Fprintf(stderr, "nri-gpu access: %v\n", err)
		return exitError
	}
	devices := make([]*cdi.Device, len(entries))
	for i, e := range entries {
		devices[i] = e.Device
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(adjust.AccessOf(devices, snap.HostNodes)); err != nil {
		fmt.Fprintf(stderr, "nri-gpu access: %v\n", err)
		return exitError
	}
	return exitOK
}
