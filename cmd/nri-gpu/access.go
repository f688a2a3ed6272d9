package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"

	"tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nri-gpu/nri-gpu/pkg/access"
	"github.com/nri-gpu/nri-gpu/pkg/adjust"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// runAccess prints, as JSON, the access files of what the containers of a pod
// were given (--pod), or the one a container running as root on
// containerd 2.x would get for the devices named (qualified, or short
// names of the default kind).
func runAccess(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("nri-gpu access", flag.ContinueOnError)
	fs.SetOutput(stderr)
	flags := addConfigFlags(fs)
	var (
		pod = fs.String("pod", "", "NAMESPACE/NAME: print the records of what the pod's containers were given")
		dir = fs.String("access-dir", access.DefaultDir, "the running plugin's --access-dir, read with --pod")
	)
	if code, done := parseFlags(fs, args); done {
		return code
	}
	if (*pod == "") == (fs.NArg() == 0) {
		fmt.Fprintln(stderr, "usage: nri-gpu access [--config FILE] [--cdi-spec-dirs DIR,...] DEVICE...\n       nri-gpu access --pod NAMESPACE/NAME [--access-dir DIR]")
		return exitUsage
	}
	var (
		recs []*cdispec.Spec
		code int
	)
	if *pod != "" {
		recs, code = podRecords(*pod, *dir, stderr)
	} else {
		recs, code = deviceRecord(flags, fs.Args(), stderr)
	}
	if code != exitOK {
		return code
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	for _, r := range recs {
		if err := enc.Encode(r); err != nil {
			fmt.Fprintf(stderr, "nri-gpu access: %v\n", err)
			return exitError
		}
	}
	return exitOK
}

// podRecords returns the records of what the containers of pod were
// given, kept in dir.
func podRecords(pod, dir string, stderr io.Writer) ([]*cdispec.Spec, int) {
	ns, name, ok := strings.Cut(pod, "/")
	if !ok || ns == "" || name == "" {
		fmt.Fprintf(stderr, "nri-gpu access: --pod %q: want NAMESPACE/NAME\n", pod)
		return nil, exitUsage
	}
	found, err := access.Open(dir).Pod(ns, name)
	if err != nil {
		fmt.Fprintf(stderr, "nri-gpu access: %v\n", err)
		return nil, exitError
	}
	if len(found) == 0 {
		fmt.Fprintf(stderr, "nri-gpu access: no record in %s of a container of pod %s given devices\n", dir, pod)
		return nil, exitError
	}
	recs := make([]*cdispec.Spec, len(found))
	for i, r := range found {
		recs[i] = r.Spec
	}
	return recs, exitOK
}

// deviceRecord returns the record a container running as root on
// containerd 2.x would get for devices, as a pod annotation asks.
func deviceRecord(flags configFlags, devices []string, stderr io.Writer) ([]*cdispec.Spec, int) {
	cfg, err := flags.load()
	if err != nil {
		fmt.Fprintf(stderr, "nri-gpu access: %v\n", err)
		return nil, exitUsage
	}
	parser, err := policy.NewParser(cfg.DefaultKind, false)
	if err != nil {
		fmt.Fprintf(stderr, "nri-gpu access: %v\n", err)
		return nil, exitUsage
	}
	// The device list is parsed as a pod annotation would be.
	ask, err := parser.Parse(policy.Container{PodAnnotations: map[string]string{policy.AnnotationKey: strings.Join(devices, ",")}})
	if err != nil {
		fmt.Fprintf(stderr, "nri-gpu access: %v\n", err)
		return nil, exitUsage
	}
	snap, err := specs.Load(cfg.CDISpecDirs)
	if err != nil {
		fmt.Fprintf(stderr, "nri-gpu access: %v\n", err)
		return nil, exitError
	}
	var names []string
	for _, r := range ask.Requests {
		names = append(names, r.Device)
	}
	entries, err := snap.Resolve(names)
	if err != nil {
		fmt.Fprintf(stderr, "nri-gpu access: %v\n", err)
		return nil, exitError
	}
	devs := make([]*cdi.Device, len(entries))
	for i, e := range entries {
		devs[i] = e.Device
		names[i] = e.Device.GetQualifiedName()
	}
	res, err := adjust.Build(devs, snap.HostNodes, adjust.Options{Runtime: adjust.RuntimeOf("containerd", "v2", adjust.NRIAll), SpecPath: snap.SpecPath})
	if err != nil {
		fmt.Fprintf(stderr, "nri-gpu access: %v\n", err)
		return nil, exitError
	}
	rec, err := access.New(access.Container{}, names, res.Given)
	if err != nil || rec == nil {
		fmt.Fprintf(stderr, "nri-gpu access: devices %s give a container nothing (%v)\n", strings.Join(names, ","), err)
		return nil, exitError
	}
	return []*cdispec.Spec{rec}, exitOK
}
