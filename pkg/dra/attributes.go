package dra

import (
	"io/fs"

	"github.com/Masterminds/semver/v3"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/utils/ptr"

	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
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
	if i.Offer != nil {
		offer(&dev, *i.Offer)
	}
	return dev
}

// Capacities a shared device offers claims, as NVIDIA's DRA driver names
// them.
const (
	CapacityShares resourceapi.QualifiedName = "shares"
	CapacityMemory resourceapi.QualifiedName = "memory"
)

// offer makes dev a device several claims may be allocated
// (allowMultipleAllocations) up to what c offers: "shares" (one per
// claim by default) and, where the memory is known, "memory" (the
// default, minimum, maximum and step of c), as the API server validates
// them: a step only where one fits between the minimum and the value.
func offer(dev *resourceapi.Device, c policy.Capacity) {
	dev.AllowMultipleAllocations = ptr.To(true)
	one := *resource.NewQuantity(1, resource.DecimalSI)
	shares := *resource.NewQuantity(int64(c.Shares), resource.DecimalSI)
	dev.Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
		CapacityShares: {Value: shares, RequestPolicy: &resourceapi.CapacityRequestPolicy{
			Default:    &one,
			ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: &one, Max: &shares, Step: ptr.To(one.DeepCopy())},
		}},
	}
	if c.Shares < 2 {
		dev.Capacity[CapacityShares].RequestPolicy.ValidRange.Step = nil
	}
	if c.Memory == 0 {
		return
	}
	q := func(b int64) *resource.Quantity { return resource.NewQuantity(b, resource.BinarySI) }
	r := &resourceapi.CapacityRequestPolicyRange{Min: q(c.Minimum), Max: q(c.Maximum)}
	if c.Minimum+c.Step <= c.Memory {
		r.Step = q(c.Step)
	}
	dev.Capacity[CapacityMemory] = resourceapi.DeviceCapacity{Value: *q(c.Memory), RequestPolicy: &resourceapi.CapacityRequestPolicy{Default: q(c.Default), ValidRange: r}}
}

// Taints returns the taints of a device the driver of cfg offers: none
// for a healthy one (h nil), else one keyed by the driver's name and the
// problem ("gpu.nri-gpu.io/xid", value the Xid error, as NVIDIA's DRA
// driver keys them) with the configured effect.
func Taints(cfg config.DRA, h *link.Health) []resourceapi.DeviceTaint {
	if h == nil {
		return nil
	}
	return []resourceapi.DeviceTaint{{Key: cfg.DriverName + "/" + h.Problem, Value: h.Value, Effect: resourceapi.DeviceTaintEffect(cfg.UnhealthyTaint)}}
}
