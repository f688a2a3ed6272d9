package nvidia

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nri-gpu/nri-gpu/pkg/config"
)

// Name strategies: how devices are named in the spec.
const (
	// NameIndex names a GPU by its index ("0") and a MIG device by
	// "<gpu>:<mig>" ("0:1").
	NameIndex = "index"
	// NameUUID names devices by their UUID.
	NameUUID = "uuid"
)

// ErrOptions is wrapped by the error for bad Options.
var ErrOptions = errors.New("invalid options")

// Options tune Generate.
type Options struct {
	// DriverRoot is where the driver's files are: "/" on most nodes, or
	// the root of a containerized driver. Device nodes, libraries and
	// /proc are looked for under it; the container paths are the host's.
	DriverRoot string
	// Kind is the spec's kind, vendor/class. Default "nvidia.com/gpu".
	Kind string
	// NameStrategies are the names each device gets. Default both.
	NameStrategies []string
	// HookPath, when set, is an nvidia-cdi-hook whose update-ldcache and
	// create-symlinks hooks the spec then carries.
	HookPath string
}

func (o *Options) defaults() error {
	if err := o.fill(); err != nil {
		return fmt.Errorf("%w: %w", ErrOptions, err)
	}
	return nil
}

func (o *Options) fill() error {
	if o.DriverRoot == "" {
		o.DriverRoot = config.DefaultDriverRoot
	}
	if o.Kind == "" {
		o.Kind = config.DefaultKind
	}
	if len(o.NameStrategies) == 0 {
		o.NameStrategies = []string{NameIndex, NameUUID}
	}
	for _, s := range o.NameStrategies {
		if s != NameIndex && s != NameUUID {
			return fmt.Errorf("device name strategy %q is neither %q nor %q", s, NameIndex, NameUUID)
		}
	}
	if _, _, err := config.ParseKind(o.Kind); err != nil {
		return err
	}
	if o.HookPath != "" && !filepath.IsAbs(o.HookPath) {
		return fmt.Errorf("hook path %q is not absolute", o.HookPath)
	}
	return nil
}

// Generate discovers the GPUs with NVML and returns the CDI spec that
// describes them: a device per GPU and per MIG device under each name
// strategy, an "all" device, and the edits they share. The spec has the
// lowest CDI version its content needs.
func Generate(lib nvml.Interface, opts Options) (*cdispec.Spec, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	inv, err := Discover(lib)
	if err != nil {
		return nil, err
	}
	return FromInventory(inv, opts)
}

// FromInventory builds the spec of an inventory.
func FromInventory(inv *Inventory, opts Options) (*cdispec.Spec, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	root := hostRoot(opts.DriverRoot)
	migMinors, err := readMIGMinors(root)
	if err != nil {
		return nil, err
	}
	spec := &cdispec.Spec{Kind: opts.Kind}
	var allNodes []*cdispec.DeviceNode
	for _, g := range inv.GPUs {
		devs, err := gpuDevices(root, g, opts.NameStrategies)
		if err != nil {
			return nil, err
		}
		spec.Devices = append(spec.Devices, devs...)
		allNodes = append(allNodes, devs[0].ContainerEdits.DeviceNodes...)
		for _, m := range g.MIGs {
			devs, err := migDevices(root, g, m, migMinors, opts.NameStrategies)
			if err != nil {
				return nil, err
			}
			spec.Devices = append(spec.Devices, devs...)
			allNodes = append(allNodes, devs[0].ContainerEdits.DeviceNodes...)
		}
	}
	if len(spec.Devices) > 0 {
		spec.Devices = append(spec.Devices, cdispec.Device{
			Name:           "all",
			ContainerEdits: cdispec.ContainerEdits{DeviceNodes: uniqueNodes(allNodes)},
		})
	}
	shared, err := sharedEdits(root, inv.DriverVersion, opts.HookPath)
	if err != nil {
		return nil, err
	}
	spec.ContainerEdits = *shared

	if spec.Version, err = cdi.MinimumRequiredVersion(spec); err != nil {
		return nil, fmt.Errorf("CDI version of the generated spec: %w", err)
	}
	return spec, nil
}

// uniqueNodes drops later nodes of a path already listed.
func uniqueNodes(nodes []*cdispec.DeviceNode) []*cdispec.DeviceNode {
	var out []*cdispec.DeviceNode
	for _, n := range nodes {
		if !slices.ContainsFunc(out, func(o *cdispec.DeviceNode) bool { return o.Path == n.Path }) {
			out = append(out, n)
		}
	}
	return out
}

// root maps container paths to host paths under the driver root.
type root string

func hostRoot(driverRoot string) root { return root(filepath.Clean(driverRoot)) }

// host returns the host path of a path of the driver root.
func (r root) host(path string) string { return filepath.Join(string(r), path) }
