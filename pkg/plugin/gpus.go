package plugin

import (
	"regexp"
	"strconv"
	"strings"

	"tags.cncf.io/container-device-interface/pkg/parser"

	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
	"github.com/nri-gpu/nri-gpu/pkg/specs/nvidia"
)

// gpuInfo is what NVML says of a GPU.
type gpuInfo struct {
	nvidia.GPU
	driverVersion string
}

var (
	gpuNode = regexp.MustCompile(`^/dev/nvidia([0-9]+)$`)
	migName = regexp.MustCompile(`^([0-9]+):([0-9]+)$`)
)

// gpus returns what NVML says of the GPUs (asked once), by minor; nil
// where NVML cannot be had.
func (p *Plugin) gpus() map[int]gpuInfo {
	p.gpusOnce.Do(func() {
		inv, err := nvidia.Discover(p.nvmlLib(p.state().cfg))
		if err != nil {
			p.log.Infof("GPU facts from the CDI specs only (%v)", err)
			return
		}
		p.gpuFacts = map[int]gpuInfo{}
		for _, g := range inv.GPUs {
			p.gpuFacts[g.Minor] = gpuInfo{g, inv.DriverVersion}
		}
	})
	return p.gpuFacts
}

// minorOf returns the minor of the NVIDIA GPU node (/dev/nvidiaN) the
// named device's spec gives it, or -1.
func minorOf(snap *specs.Snapshot, name string) int {
	minor := -1
	if e, err := snap.Lookup(name); err == nil {
		for _, n := range e.Device.ContainerEdits.DeviceNodes {
			if m := gpuNode.FindStringSubmatch(n.Path); m != nil {
				minor, _ = strconv.Atoi(m[1])
			}
		}
	}
	return minor
}

// uuidOf returns the UUID a device is named by (GPU-..., MIG-...), its
// own name or that of a candidate of the same hardware, or "".
func uuidOf(d specs.Device, cands []specs.Device) string {
	uuid := func(dev specs.Device) string {
		_, _, n := parser.ParseDevice(dev.Name)
		if strings.HasPrefix(n, "GPU-") || strings.HasPrefix(n, "MIG-") {
			return n
		}
		return ""
	}
	if u := uuid(d); u != "" {
		return u
	}
	for _, o := range cands {
		if len(o.Nodes) == len(d.Nodes) && policy.Overlaps(o, []specs.Device{d}) {
			if u := uuid(o); u != "" {
				return u
			}
		}
	}
	return ""
}
