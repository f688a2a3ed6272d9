package main

import (
	"flag"
	"fmt"
	"io"
	"runtime/debug"
)

// version and commit are set at build time (make build: -ldflags "-X
// main.version=... -X main.commit=..."); otherwise they come from the
// build information Go records.
var version, commit = "", ""

// buildInfo is what `nri-gpu version` prints: nri-gpu's version and
// commit, the Go it was built with, and the NRI and CDI libraries in it.
func buildInfo() string {
	v, rev, goVersion := version, commit, "unknown"
	libs := map[string]string{"github.com/containerd/nri": "unknown", "tags.cncf.io/container-device-interface": "unknown"}
	if bi, ok := debug.ReadBuildInfo(); ok {
		goVersion = bi.GoVersion
		if v == "" {
			v = bi.Main.Version
		}
		modified := ""
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				if rev == "" {
					rev = s.Value
				}
			case "vcs.modified":
				if s.Value == "true" && commit == "" {
					modified = " (modified)"
				}
			}
		}
		if rev != "" {
			rev += modified
		}
		for _, d := range bi.Deps {
			if _, ok := libs[d.Path]; ok {
				libs[d.Path] = d.Version
			}
		}
	}
	if v == "" {
		v = "unknown"
	}
	if rev == "" {
		rev = "unknown"
	}
	return fmt.Sprintf("nri-gpu %s\ncommit: %s\ngo: %s\nnri: %s\ncdi: %s\n", v, rev, goVersion,
		libs["github.com/containerd/nri"], libs["tags.cncf.io/container-device-interface"])
}

// runVersion prints the build information.
func runVersion(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("nri-gpu version", flag.ContinueOnError)
	fs.SetOutput(stderr)
	if code, done := parseFlags(fs, args); done {
		return code
	}
	fmt.Fprint(stdout, buildInfo())
	return exitOK
}
