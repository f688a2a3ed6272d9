// Package nvidia discovers NVIDIA GPUs with NVML and generates the CDI spec
// that describes them, for nodes that carry the driver but not the NVIDIA
// Container Toolkit.
//
// Generation goes through NVIDIA's own library, nvcdi (the one behind
// nvidia-ctk cdi generate), so the spec is what nvidia-ctk writes for the
// same host. NVML comes in as an nvml.Interface, so that tests run on
// go-nvml's mock servers. inventory.go asks NVML what there is (for nri-gpu
// devices and for noticing that the GPUs changed), generate.go makes the
// spec, and write.go validates and writes it atomically. The package never
// logs.
package nvidia
