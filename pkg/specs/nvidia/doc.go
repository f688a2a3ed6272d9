// Package nvidia discovers NVIDIA GPUs with NVML and generates the CDI spec
// that describes them, for nodes that carry the driver but not the NVIDIA
// Container Toolkit.
//
// NVML comes in as an nvml.Interface, so that tests run on go-nvml's mock
// servers. The work is split by what is described, one file each:
// inventory.go asks NVML what there is, gpu.go and mig.go make the devices,
// driver.go the edits all devices share (control nodes, libraries,
// utilities, firmware, sockets, hooks), and write.go validates and writes
// the spec atomically. The package never logs.
package nvidia
