package harness

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// ToolsEnv names the directory holding the test binaries, which
// `make e2e-tools` builds. ContainerdEnv, when set, names another
// directory to take containerd, ctr and containerd-shim-runc-v2 from (a
// different containerd version).
const (
	ToolsEnv      = "NRI_GPU_TOOLS"
	ContainerdEnv = "NRI_GPU_CONTAINERD"
)

// Tools locates the binaries a run needs.
type Tools struct {
	// Dir holds crictl and nri-gpu (and containerd's binaries, unless
	// ContainerdDir is set).
	Dir string
	// ContainerdDir holds containerd, ctr and containerd-shim-runc-v2.
	ContainerdDir string
	// ContainerdVersion is what containerd --version says, e.g. "1.7.35".
	ContainerdVersion string
	// Runc is the runc binary: the one beside containerd's binaries
	// (the runc that containerd release is tested with, which make
	// e2e-tools builds there), else the host's.
	Runc string
	// Busybox is a statically linked busybox for the image.
	Busybox string
}

// Path returns the path of a binary of the tools.
func (t Tools) Path(name string) string {
	switch name {
	case "containerd", "ctr", "containerd-shim-runc-v2":
		return filepath.Join(t.ContainerdDir, name)
	}
	return filepath.Join(t.Dir, name)
}

// Containerd2 reports whether the containerd is 2.x (config version 3).
func (t Tools) Containerd2() bool { return strings.HasPrefix(t.ContainerdVersion, "2.") }

// FindTools finds the tools in dir (or $NRI_GPU_TOOLS when dir is empty)
// and on the host, and says which are missing.
func FindTools(dir string) (Tools, error) {
	dir, err := dirOf(dir, ToolsEnv, "tools", "make e2e-tools builds it")
	if err != nil {
		return Tools{}, err
	}
	t := Tools{Dir: dir, ContainerdDir: os.Getenv(ContainerdEnv)}
	if t.ContainerdDir == "" {
		t.ContainerdDir = dir
	}
	var errs []error
	for _, name := range []string{"containerd", "ctr", "containerd-shim-runc-v2", "crictl", "nri-gpu"} {
		if _, err := os.Stat(t.Path(name)); err != nil {
			errs = append(errs, fmt.Errorf("tool %s: %w", name, err))
		}
	}
	t.ContainerdVersion = containerdVersion(t.Path("containerd"))
	if t.Runc, err = runcFor(t.ContainerdDir); err != nil {
		errs = append(errs, fmt.Errorf("runc: %w", err))
	}
	t.Busybox = "/bin/busybox"
	if _, err := os.Stat(t.Busybox); err != nil {
		errs = append(errs, fmt.Errorf("busybox-static: %w", err))
	}
	return t, errors.Join(errs...)
}

// dirOf is dir, or the directory the environment variable env names
// when dir is empty; an error saying what (what) to set, and how it is
// made (made), when neither names one.
func dirOf(dir, env, what, made string) (string, error) {
	if dir == "" {
		dir = os.Getenv(env)
	}
	if dir == "" {
		return "", fmt.Errorf("no %s directory: set %s (%s)", what, env, made)
	}
	return dir, nil
}

// missing are the errors of the files of paths that cannot be stat'ed.
func missing(paths ...string) []error {
	var errs []error
	for _, p := range paths {
		if _, err := os.Stat(p); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// WithContainerd returns the tools with containerd, ctr and the shim
// taken from dir instead (another containerd version).
func (t Tools) WithContainerd(dir string) (Tools, error) {
	t.ContainerdDir = dir
	if t.ContainerdVersion = containerdVersion(t.Path("containerd")); t.ContainerdVersion == "" {
		return t, fmt.Errorf("no containerd in %s", dir)
	}
	var err error
	t.Runc, err = runcFor(dir)
	return t, err
}

// runcFor returns the runc a containerd in dir runs: dir's own runc,
// else the host's.
func runcFor(dir string) (string, error) {
	own := filepath.Join(dir, "runc")
	if _, err := os.Stat(own); err == nil {
		return own, nil
	}
	return exec.LookPath("runc")
}

// containerdVersion returns what a containerd binary says its version is
// ("1.7.35"), or "".
func containerdVersion(path string) string {
	out, err := exec.Command(path, "--version").Output()
	if err != nil {
		return ""
	}
	// "containerd <module> 1.7.35+unknown <commit>"
	if f := strings.Fields(string(out)); len(f) >= 3 {
		return strings.TrimPrefix(strings.SplitN(f[2], "+", 2)[0], "v")
	}
	return ""
}
