package nvidia

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	nvdevice "github.com/NVIDIA/go-nvlib/pkg/nvlib/device"
	"github.com/NVIDIA/go-nvml/pkg/nvml"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// pciAddress writes an NVML bus ID ("00000000:3b:00.0") as sysfs names
// the device ("0000:3b:00.0").
func pciAddress(id string) string {
	domain, rest, ok := strings.Cut(id, ":")
	if !ok || len(domain) <= 4 {
		return id
	}
	return domain[len(domain)-4:] + ":" + rest
}

// ErrNVML is wrapped by the error for NVML being unavailable: no driver,
// or no libnvidia-ml.
var ErrNVML = errors.New("NVML is not available (is the NVIDIA driver installed and loaded?)")

// Inventory is what NVML reports of a node.
type Inventory struct {
	// DriverVersion is the version of the kernel driver, e.g. "550.54.15".
	DriverVersion string
	// GPUs are the full GPUs by index.
	GPUs []GPU
}

// GPU is a full GPU.
type GPU struct {
	Index int
	UUID  string
	// Minor is the minor number of /dev/nvidia<Minor>.
	Minor int
	Model string
	// Brand, Architecture and CUDAComputeCapability ("9.0") are as NVML
	// names them; empty where NVML does not tell.
	Brand, Architecture, CUDAComputeCapability string
	// PCIBusID is the GPU's PCI address ("0000:3b:00.0"); empty where
	// NVML does not tell.
	PCIBusID string
	// MemoryBytes is the total memory.
	MemoryBytes uint64
	// MIGEnabled says whether MIG mode is on (current mode).
	MIGEnabled bool
	MIGs       []MIG
}

// MIG is a MIG device of a GPU.
type MIG struct {
	// Index is its index among its GPU's MIG devices.
	Index int
	UUID  string
	// GI and CI are its GPU and compute instance ids.
	GI, CI int
}

// Discover asks NVML for the driver version and the GPUs with their MIG
// devices. It initialises and shuts down NVML itself.
func Discover(lib nvml.Interface) (*Inventory, error) {
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("%w: %w", ErrNVML, ret)
	}
	defer lib.Shutdown()

	inv := &Inventory{}
	var ret nvml.Return
	if inv.DriverVersion, ret = lib.SystemGetDriverVersion(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("NVML: driver version: %w", ret)
	}
	count, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("NVML: device count: %w", ret)
	}
	for i := 0; i < count; i++ {
		gpu, err := discoverGPU(lib, i)
		if err != nil {
			return nil, err
		}
		inv.GPUs = append(inv.GPUs, gpu)
	}
	return inv, nil
}

func discoverGPU(lib nvml.Interface, i int) (GPU, error) {
	g := GPU{Index: i}
	d, ret := lib.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return g, fmt.Errorf("NVML: GPU %d: %w", i, ret)
	}
	if g.UUID, ret = d.GetUUID(); ret != nvml.SUCCESS {
		return g, fmt.Errorf("NVML: GPU %d: UUID: %w", i, ret)
	}
	if g.Minor, ret = d.GetMinorNumber(); ret != nvml.SUCCESS {
		return g, fmt.Errorf("NVML: GPU %d: minor number: %w", i, ret)
	}
	if g.Model, ret = d.GetName(); ret != nvml.SUCCESS {
		return g, fmt.Errorf("NVML: GPU %d: name: %w", i, ret)
	}
	if mem, ret := d.GetMemoryInfo(); ret == nvml.SUCCESS {
		g.MemoryBytes = mem.Total
	}
	// As NVIDIA's DRA driver names them (go-nvlib's strings).
	if nd, err := nvdevice.New(lib).NewDevice(d); err == nil {
		g.Brand, _ = nd.GetBrandAsString()
		g.Architecture, _ = nd.GetArchitectureAsString()
		g.CUDAComputeCapability, _ = nd.GetCudaComputeCapabilityAsString()
	}
	if pci, ret := d.GetPciInfo(); ret == nvml.SUCCESS {
		g.PCIBusID = pciAddress(busID(pci))
	}
	mode, _, ret := d.GetMigMode()
	switch ret {
	case nvml.SUCCESS:
		g.MIGEnabled = mode == nvml.DEVICE_MIG_ENABLE
	case nvml.ERROR_NOT_SUPPORTED:
	default:
		return g, fmt.Errorf("NVML: GPU %d: MIG mode: %w", i, ret)
	}
	if !g.MIGEnabled {
		return g, nil
	}
	max, ret := d.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return g, fmt.Errorf("NVML: GPU %d: MIG device count: %w", i, ret)
	}
	for j := 0; j < max; j++ {
		m, ret := d.GetMigDeviceHandleByIndex(j)
		if ret == nvml.ERROR_NOT_FOUND || ret == nvml.ERROR_INVALID_ARGUMENT {
			continue
		}
		if ret != nvml.SUCCESS {
			return g, fmt.Errorf("NVML: GPU %d: MIG device %d: %w", i, j, ret)
		}
		mig := MIG{Index: j}
		if mig.UUID, ret = m.GetUUID(); ret != nvml.SUCCESS {
			return g, fmt.Errorf("NVML: GPU %d: MIG device %d: UUID: %w", i, j, ret)
		}
		if mig.GI, ret = m.GetGpuInstanceId(); ret != nvml.SUCCESS {
			return g, fmt.Errorf("NVML: GPU %d: MIG device %d: GPU instance: %w", i, j, ret)
		}
		if mig.CI, ret = m.GetComputeInstanceId(); ret != nvml.SUCCESS {
			return g, fmt.Errorf("NVML: GPU %d: MIG device %d: compute instance: %w", i, j, ret)
		}
		g.MIGs = append(g.MIGs, mig)
	}
	return g, nil
}

// libraryDirs are where NVML's library is looked for under a driver root
// other than "/".
var libraryDirs = []string{
	"/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/lib/x86_64-linux-gnu",
	"/lib/aarch64-linux-gnu", "/lib64", "/usr/lib", "/lib",
}

// Library returns NVML, loaded from the driver root: the system's
// libnvidia-ml.so.1 when the root is "/", else the first found under the
// root's library directories.
func Library(driverRoot string) nvml.Interface {
	root := filepath.Clean(driverRoot)
	if root == "/" || root == "." {
		return nvml.New()
	}
	for _, d := range libraryDirs {
		p := filepath.Join(root, d, "libnvidia-ml.so.1")
		if _, err := os.Stat(p); err == nil {
			return nvml.New(nvml.WithLibraryPath(p))
		}
	}
	return nvml.New()
}

// Describe says what a spec generated from inv under root is of: the
// driver, the GPUs with their MIG devices, the driver's control nodes
// present (nvidia-uvm appears at the first CUDA call) and the number of
// driver files the spec mounts.
func Describe(inv *Inventory, spec *cdispec.Spec, root string) string {
	return fmt.Sprintf("driver %s, GPUs %s, control nodes %s, %d driver files",
		inv.DriverVersion, gpuList(inv), controlNodes(root), len(spec.ContainerEdits.Mounts))
}

// gpuList describes the GPUs and MIG devices of an inventory.
func gpuList(inv *Inventory) string {
	var ids []string
	for _, g := range inv.GPUs {
		id := g.UUID
		for _, m := range g.MIGs {
			id += "+" + m.UUID
		}
		ids = append(ids, id)
	}
	return listOrNone(ids, ", ")
}

// controlNodes lists the driver's control nodes present under root.
func controlNodes(root string) string {
	var present []string
	for _, n := range ControlNodes {
		if _, err := os.Stat(filepath.Join(root, "dev", n)); err == nil {
			present = append(present, n)
		}
	}
	return listOrNone(present, " ")
}

func listOrNone(l []string, sep string) string {
	if len(l) == 0 {
		return "none"
	}
	return strings.Join(l, sep)
}
