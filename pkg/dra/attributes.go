package dra

import (
	"fmt"
	"io/fs"
	"regexp"
	"strings"

	"github.com/Masterminds/semver/v3"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
)

// Device types, as the "type" attribute says them.
const (
	TypeGPU = "gpu"
	TypeMIG = "mig"
)

// Info is what is known of a device: from the spec (its name and device
// nodes) and, where it can be had, NVML. A zero field is unknown, and the
// device then has no such attribute.
type Info struct {
	// Kind and Name are its CDI kind and name within it ("0", "0:1").
	Kind, Name string
	// Type is TypeGPU, TypeMIG or empty (another kind of device).
	Type string
	// Index is the GPU's index (for a MIG device, its parent's); -1 when
	// unknown.
	Index int
	// Minor is the minor number of /dev/nvidia<Minor>; -1 when unknown.
	Minor int
	// UUID is the device's, ParentUUID a MIG device's GPU's.
	UUID, ParentUUID string
	// Profile is a MIG device's profile ("1g.10gb").
	Profile string
	// ProductName, Brand and Architecture are NVML's.
	ProductName, Brand, Architecture string
	// DriverVersion and CUDAComputeCapability are versions ("550.54.15",
	// "9.0").
	DriverVersion, CUDAComputeCapability string
	// PCIBusID is the GPU's PCI address ("0000:3b:00.0").
	PCIBusID string
	// MemoryBytes is the device's memory.
	MemoryBytes uint64
}

// label is what a device name may not have outside [a-z0-9-].
var label = regexp.MustCompile(`[^a-z0-9-]+`)

// DeviceName is the device's name in the ResourceSlice: "gpu-<minor>" for
// a GPU, as NVIDIA's DRA driver names it, else the CDI class and name as
// a DNS label ("gpu-0-1" for MIG device "0:1").
func (i Info) DeviceName() string {
	if i.Type == TypeGPU && i.Minor >= 0 {
		return fmt.Sprintf("gpu-%d", i.Minor)
	}
	_, class, _ := strings.Cut(i.Kind, "/")
	name := strings.Trim(label.ReplaceAllString(strings.ToLower(class+"-"+i.Name), "-"), "-")
	if len(name) > 63 {
		name = strings.TrimRight(name[:63], "-")
	}
	return name
}

// Device returns the device's ResourceSlice entry: the attributes NVIDIA's
// DRA driver publishes, under its names, so that DeviceClass selectors
// written for it carry over (type, uuid, parentUUID, profile, index,
// minor, productName, brand, architecture, driverVersion,
// cudaComputeCapability, pcieBusID, Kubernetes' standard pcieRoot), and
// memory as capacity, and Kubernetes' standard pciBusID and pcieRoot,
// the root looked up through deviceattribute in sysfs (nil: the host's
// /sys).
func (i Info) Device(sysfs fs.ReadLinkFS) resourceapi.Device {
	attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}
	str := func(name, v string) {
		if v != "" {
			attrs[resourceapi.QualifiedName(name)] = resourceapi.DeviceAttribute{StringValue: &v}
		}
	}
	version := func(name, v string) {
		if sv, err := semver.NewVersion(v); err == nil {
			s := sv.String()
			attrs[resourceapi.QualifiedName(name)] = resourceapi.DeviceAttribute{VersionValue: &s}
		}
	}
	num := func(name string, v int) {
		if v >= 0 {
			n := int64(v)
			attrs[resourceapi.QualifiedName(name)] = resourceapi.DeviceAttribute{IntValue: &n}
		}
	}
	str("type", i.Type)
	str("uuid", i.UUID)
	str("parentUUID", i.ParentUUID)
	str("profile", i.Profile)
	num("index", i.Index)
	num("minor", i.Minor)
	str("productName", i.ProductName)
	str("brand", i.Brand)
	str("architecture", i.Architecture)
	version("driverVersion", i.DriverVersion)
	version("cudaComputeCapability", i.CUDAComputeCapability)
	str("pcieBusID", i.PCIBusID)
	if i.PCIBusID != "" {
		if id, err := deviceattribute.GetPCIBusIDAttribute(i.PCIBusID); err == nil {
			attrs[id.Name] = id.Value
		}
		var mods []deviceattribute.MachineModifier
		if sysfs != nil {
			mods = append(mods, deviceattribute.WithFS(sysfs))
		}
		if root, err := deviceattribute.GetPCIeRootAttributeByPCIBusID(i.PCIBusID, mods...); err == nil {
			attrs[root.Name] = root.Value
		}
	}
	dev := resourceapi.Device{Name: i.DeviceName(), Attributes: attrs}
	if i.MemoryBytes > 0 {
		dev.Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			"memory": {Value: *resource.NewQuantity(int64(i.MemoryBytes), resource.BinarySI)},
		}
	}
	return dev
}
