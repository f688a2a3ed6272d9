package dra

import (
	"io/fs"

	"github.com/Masterminds/semver/v3"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/deviceattribute"

	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
)

// DeviceOf returns a device's ResourceSlice entry: the attributes NVIDIA's
// DRA driver publishes, under its names, so that DeviceClass selectors
// written for it carry over (type, uuid, parentUUID, profile, index,
// minor, productName, brand, architecture, driverVersion,
// cudaComputeCapability, pcieBusID, Kubernetes' standard pcieRoot), and
// memory as capacity, and Kubernetes' standard pciBusID and pcieRoot,
// the root looked up through deviceattribute in sysfs (nil: the host's
// /sys).
func DeviceOf(i link.Info, sysfs fs.ReadLinkFS) resourceapi.Device {
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
