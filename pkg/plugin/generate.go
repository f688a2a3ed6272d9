package plugin

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

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

// generate writes the spec of the GPUs to path unless it holds exactly
// that already (nvidia.Refresh): with hookFree, without hooks (refused
// where one cannot be replaced). It returns what the spec is of and
// whether it wrote.
func (p *Plugin) generate(lib nvml.Interface, path string) (string, bool, error) {
	cfg := p.state().cfg
	edit := func(spec *cdispec.Spec) error {
		if !cfg.HookFree {
			return nil
		}
		_, err := adjust.WithoutHooks(spec, specs.LibrarySonames(spec))
		return err
	}
	opts := nvidia.Options{DriverRoot: p.inForce.start.DriverRoot, Kind: cfg.DefaultKind, HookPath: p.flags.config.HookPath, CreateControlNodes: true}
	return nvidia.Refresh(lib, path, opts, edit)
}
