package harness

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// ToolsEnv names the directory holding the test binaries, which
// `make e2e-tools` builds.
const ToolsEnv = "NRI_GPU_TOOLS"

// Tools locates the binaries a run needs.
type Tools struct {
	// Dir holds containerd, ctr, containerd-shim-runc-v2, crictl and nri-gpu.
	Dir string
	// Runc is the runc binary.
	Runc string
	// Busybox is a statically linked busybox for the image.
	Busybox string
}

// Path returns the path of a binary in the tools directory.
func (t Tools) Path(name string) string { return filepath.Join(t.Dir, name) }

// FindTools finds the tools in dir (or $NRI_GPU_TOOLS when dir is empty)
// and on the host, and says which are missing.
func FindTools(dir string) (Tools, error) {
	if dir == "" {
		dir = os.Getenv(ToolsEnv)
	}
	if dir == "" {
		return Tools{}, fmt.Errorf("no tools directory: set %s (make e2e-tools builds it)", ToolsEnv)
	}
	t := Tools{Dir: dir}
	var errs []error
	for _, name := range []string{"containerd", "ctr", "containerd-shim-runc-v2", "crictl", "nri-gpu"} {
		if _, err := os.Stat(t.Path(name)); err != nil {
			errs = append(errs, fmt.Errorf("tool %s: %w", name, err))
		}
	}
	var err error
	if t.Runc, err = exec.LookPath("runc"); err != nil {
		errs = append(errs, fmt.Errorf("runc: %w", err))
	}
	t.Busybox = "/bin/busybox"
	if _, err := os.Stat(t.Busybox); err != nil {
		errs = append(errs, fmt.Errorf("busybox-static: %w", err))
	}
	return t, errors.Join(errs...)
}
