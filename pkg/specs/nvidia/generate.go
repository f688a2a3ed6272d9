package nvidia

import (
	"errors"
	"fmt"
	"io"
	"path/filepath"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi"
	"github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi/transform"
	"github.com/NVIDIA/nvidia-container-toolkit/pkg/system/nvdevices"
	"github.com/sirupsen/logrus"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nri-gpu/nri-gpu/pkg/config"
)

// Name strategies: how devices are named in the spec, as nvidia-ctk's
// --device-name-strategy names them.
const (
	// NameIndex names a GPU by its index ("0") and a MIG device by
	// "<gpu>:<mig>" ("0:1").
	NameIndex = nvcdi.DeviceNameStrategyIndex
	// NameUUID names devices by their UUID.
	NameUUID = nvcdi.DeviceNameStrategyUUID
)

// ErrOptions is wrapped by the error for bad Options.
var ErrOptions = errors.New("invalid options")

// Options tune Generate.
type Options struct {
	// DriverRoot is where the driver's files are: "/" on most nodes, or
	// the root of a containerized driver.
	DriverRoot string
	// DevRoot is where the driver's /dev is; empty means DriverRoot.
	DevRoot string
	// Kind is the spec's kind, vendor/class. Default "nvidia.com/gpu".
	Kind string
	// NameStrategies are the names each device gets. Default both.
	NameStrategies []string
	// CreateControlNodes has the control device nodes (nvidiactl,
	// nvidia-modeset, nvidia-uvm, nvidia-uvm-tools) that the loaded driver
	// has but the dev root lacks made first, as the toolkit's
	// create-device-nodes does: /dev/nvidia-uvm, for one, appears only at
	// the first CUDA call, and a spec written before would lack it.
	CreateControlNodes bool
	// HookPath is the CDI hook executable the spec's hooks run, which
	// make the driver libraries loadable by soname in the container:
	// nvidia-cdi-hook, nvidia-ctk (its hooks then run as "nvidia-ctk hook
	// ..."), or nri-gpu itself, which is a CDI hook too.
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
	if o.DevRoot == "" {
		o.DevRoot = o.DriverRoot
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
	if o.HookPath == "" {
		return errors.New("no hook path: the spec's hooks make the driver libraries loadable")
	}
	if !filepath.IsAbs(o.HookPath) {
		return fmt.Errorf("hook path %q is not absolute", o.HookPath)
	}
	return nil
}

// Generate discovers the GPUs with NVML and returns the CDI spec that
// describes them, as NVIDIA's own library (nvcdi, the one behind
// nvidia-ctk cdi generate) writes it: a device per GPU and per MIG device
// under each name strategy, an "all" device, and the edits they share
// (control nodes, the driver's libraries, utilities, firmware, sockets,
// config files, and the hooks that make the libraries loadable).
func Generate(lib nvml.Interface, opts Options) (*cdispec.Spec, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	// NVML's absence gets nri-gpu's own message, before nvcdi's.
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("%w: %w", ErrNVML, ret)
	}
	_ = lib.Shutdown()

	if opts.CreateControlNodes {
		if err := createControlNodes(opts.DevRoot); err != nil {
			return nil, err
		}
	}

	vendor, class, _ := config.ParseKind(opts.Kind)
	var namers []nvcdi.DeviceNamer
	for _, s := range opts.NameStrategies {
		n, err := nvcdi.NewDeviceNamer(s)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrOptions, err)
		}
		namers = append(namers, n)
	}
	quiet := logrus.New()
	quiet.SetOutput(io.Discard)
	cdilib, err := nvcdi.New(
		nvcdi.WithLogger(quiet),
		nvcdi.WithNvmlLib(lib),
		nvcdi.WithMode(nvcdi.ModeNvml),
		nvcdi.WithDriverRoot(opts.DriverRoot),
		nvcdi.WithDevRoot(opts.DevRoot),
		nvcdi.WithVendor(vendor),
		nvcdi.WithClass(class),
		nvcdi.WithDeviceNamers(namers...),
		nvcdi.WithNVIDIACDIHookPath(opts.HookPath),
		// An "all" device, as nvidia-ctk cdi generate adds it.
		nvcdi.WithMergedDeviceOptions(transform.WithName("all"), transform.WithSkipIfExists(true)),
	)
	if err != nil {
		return nil, fmt.Errorf("NVIDIA's CDI library: %w", err)
	}
	spec, err := cdilib.GetSpec()
	if err != nil {
		return nil, fmt.Errorf("generating the CDI spec: %w", err)
	}
	raw := spec.Raw()
	// The lowest CDI version the content needs, so that older readers
	// (containerd 1.7's own CDI) read it too.
	if raw.Version, err = cdi.MinimumRequiredVersion(raw); err != nil {
		return nil, fmt.Errorf("CDI version of the generated spec: %w", err)
	}
	return raw, nil
}

// ControlNodes are the control device nodes of NVIDIA's driver.
var ControlNodes = []string{"nvidiactl", "nvidia-modeset", "nvidia-uvm", "nvidia-uvm-tools"}

// createControlNodes makes, under devRoot, the control nodes whose driver
// module is loaded (its major is in /proc/devices) and that are missing,
// with NVIDIA's own device-node code. A node whose module is not loaded is
// left out.
func createControlNodes(devRoot string) error {
	quiet := logrus.New()
	quiet.SetOutput(io.Discard)
	nodes, err := nvdevices.New(nvdevices.WithLogger(quiet), nvdevices.WithDevRoot(devRoot))
	if err != nil {
		return nil // no NVIDIA driver loaded: nothing to make
	}
	for _, n := range ControlNodes {
		if _, err := nodes.Major(n); err != nil {
			continue
		}
		if err := nodes.CreateNVIDIADevice(n); err != nil {
			return fmt.Errorf("creating /dev/%s under %s: %w", n, devRoot, err)
		}
	}
	return nil
}
