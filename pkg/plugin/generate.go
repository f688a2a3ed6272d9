package plugin

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/nri-gpu/nri-gpu/pkg/specs/nvidia"
)

// GeneratedSpecName is the file generateSpecs writes in the last spec dir.
const GeneratedSpecName = "nvidia.com-gpu.yaml"

// keepGenerating, while generateSpecs is on, generates the spec of the
// node's GPUs now and again whenever they change (checked every
// generateInterval), until ctx is done. Injection keeps reading the spec
// dirs as before.
func (p *Plugin) keepGenerating(ctx context.Context) {
	var last, lastErr string
	for {
		st := p.state()
		if !st.cfg.Generate.Enabled {
			select {
			case <-ctx.Done():
				return
			case <-time.After(st.cfg.Generate.Interval):
				continue
			}
		}
		lib := p.hw.lib()
		dir := st.cfg.CDISpecDirs[len(st.cfg.CDISpecDirs)-1]
		path := filepath.Join(dir, GeneratedSpecName)
		fingerprint, err := p.generate(lib, path, last)
		switch {
		case err != nil && err.Error() != lastErr:
			p.log.Errorf("generating the CDI spec of the GPUs into %s: %v", path, err)
			lastErr = err.Error()
		case err == nil && fingerprint != last:
			p.log.WithField("spec", path).Infof("generated the CDI spec of the GPUs: %s", fingerprint)
			last, lastErr = fingerprint, ""
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(st.cfg.Generate.Interval):
		}
	}
}

// generate discovers the GPUs and, when they differ from last or the
// spec file is gone, writes their spec. It returns the GPUs' fingerprint.
func (p *Plugin) generate(lib nvml.Interface, path, last string) (string, error) {
	inv, err := nvidia.Discover(lib)
	if err != nil {
		return "", err
	}
	cfg := p.state().cfg
	fingerprint := fmt.Sprintf("driver %s, GPUs %s, control nodes %s", inv.DriverVersion, gpuList(inv), controlNodes(p.start.DriverRoot))
	if _, err := os.Stat(path); err == nil && fingerprint == last {
		return fingerprint, nil
	}
	spec, err := nvidia.Generate(lib, nvidia.Options{DriverRoot: p.start.DriverRoot, Kind: cfg.DefaultKind, HookPath: p.hookPath, CreateControlNodes: true})
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return "", err
	}
	return fingerprint, nvidia.Write(spec, path, "yaml", nil)
}

// gpuList describes the GPUs and MIG devices of an inventory.
func gpuList(inv *nvidia.Inventory) string {
	var ids []string
	for _, g := range inv.GPUs {
		id := g.UUID
		for _, m := range g.MIGs {
			id += "+" + m.UUID
		}
		ids = append(ids, id)
	}
	if len(ids) == 0 {
		return "none"
	}
	return strings.Join(ids, ", ")
}

// controlNodes lists the driver's control nodes present under root, so
// that one appearing (nvidia-uvm, at the first CUDA call) makes the spec
// be written again.
func controlNodes(root string) string {
	var present []string
	for _, n := range nvidia.ControlNodes {
		if _, err := os.Stat(filepath.Join(root, "dev", n)); err == nil {
			present = append(present, n)
		}
	}
	if len(present) == 0 {
		return "none"
	}
	return strings.Join(present, " ")
}
