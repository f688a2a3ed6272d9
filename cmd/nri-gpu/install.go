package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// installedName is the name install gives nri-gpu in its directory.
const installedName = "nri-gpu"

// runInstall copies this nri-gpu into a directory of the host, for the
// hooks of the specs it generates, which the runtime runs from the host
// (the chart's init container, when nri-gpu generates specs). The copy
// is written beside and renamed over the old one, so a hook running the
// old one finishes with it, and a hook started meanwhile finds either
// whole.
func runInstall(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("nri-gpu install", flag.ContinueOnError)
	fs.SetOutput(stderr)
	if code, done := parseFlags(fs, args); done {
		return code
	}
	if fs.NArg() != 1 || !filepath.IsAbs(fs.Arg(0)) {
		fmt.Fprintln(stderr, "usage: nri-gpu install DIR (absolute)")
		return exitUsage
	}
	path, err := install(fs.Arg(0))
	if err != nil {
		fmt.Fprintf(stderr, "nri-gpu install: %v\n", err)
		return exitError
	}
	fmt.Fprintf(stdout, "installed %s\n", path)
	return exitOK
}

// install copies this executable into dir as installedName and returns
// its path.
func install(dir string) (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", err
	}
	src, err := os.Open(self)
	if err != nil {
		return "", err
	}
	defer src.Close()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	dst := filepath.Join(dir, installedName)
	tmp, err := os.CreateTemp(dir, "."+installedName+"-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name()) // after the rename, there is none
	if _, err := io.Copy(tmp, src); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Chmod(0o755); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	return dst, os.Rename(tmp.Name(), dst)
}
