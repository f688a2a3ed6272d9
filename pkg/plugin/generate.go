package plugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/nri-gpu/nri-gpu/pkg/adjust"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
	"github.com/nri-gpu/nri-gpu/pkg/specs/nvidia"
)

// GeneratedSpecName is the file generateSpecs writes in the last spec dir.
const GeneratedSpecName = "nvidia.com-gpu.yaml"

// generateEvery, while generateSpecs is on, generates the spec of the
// node's GPUs now and again (every generateInterval) and writes it
// whenever it differs from the file: a GPU appearing, a control node
// made, the driver upgraded (its version, or only its files under the
// driver root), the file edited or removed. Containers created afterwards
// get what it then names; running ones keep what they were given.
// Injection keeps reading the spec dirs as before.
//
// A driver upgrade that reloads the kernel module leaves this process
// with the old NVML, which then refuses to run
// (NVML_ERROR_LIB_RM_VERSION_MISMATCH): once it has answered before,
// that ends Serve with ErrDriverChanged, through stop, so that nri-gpu
// starts again with the new one. An NVML that never answered (a library
// newer than the loaded module, until the node reboots) does not: it is
// logged, as any other error.
func (p *Plugin) generateEvery(ctx context.Context, stop context.CancelCauseFunc) {
	var lastErr string
	answered := false
	for {
		st := p.state()
		if st.cfg.Generate.Enabled {
			dir := st.cfg.CDISpecDirs[len(st.cfg.CDISpecDirs)-1]
			path := filepath.Join(dir, GeneratedSpecName)
			what, wrote, err := p.generate(p.node.hw.Lib(), path)
			switch {
			case err != nil && answered && errors.Is(err, nvml.ERROR_LIB_RM_VERSION_MISMATCH):
				p.log.Warnf("the NVIDIA driver changed under this process's NVML (%v): starting again to load the new driver's", err)
				stop(fmt.Errorf("%w: %w", ErrDriverChanged, err))
				return
			case err != nil && err.Error() != lastErr:
				p.log.Errorf("generating the CDI spec of the GPUs into %s: %v", path, err)
				lastErr = err.Error()
			case err == nil:
				answered = true
				if wrote {
					p.log.WithField("spec", path).Infof("generated the CDI spec of the GPUs: %s", what)
				}
				lastErr = ""
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(st.cfg.Generate.Interval):
		}
	}
}

// generate discovers the GPUs and the driver's files and writes their
// spec to path unless it holds exactly that already. It returns what the
// spec is of (driver, GPUs, control nodes, files) and whether it wrote.
func (p *Plugin) generate(lib nvml.Interface, path string) (string, bool, error) {
	inv, err := nvidia.Discover(lib)
	if err != nil {
		return "", false, err
	}
	cfg := p.state().cfg
	spec, err := nvidia.Generate(lib, nvidia.Options{DriverRoot: p.inForce.start.DriverRoot, Kind: cfg.DefaultKind, HookPath: p.flags.hookPath, CreateControlNodes: true})
	if err != nil {
		return "", false, err
	}
	if cfg.HookFree {
		if _, err := adjust.WithoutHooks(spec, specs.LibrarySonames(spec)); err != nil {
			return "", false, err
		}
	}
	what := nvidia.Describe(inv, spec, p.inForce.start.DriverRoot)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return "", false, err
	}
	wrote, err := nvidia.Update(spec, path, "yaml")
	return what, wrote, err
}
