package nvidia

import (
	"fmt"

	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// NVIDIA's fixed character device major (for /dev/nvidiaN, nvidiactl and
// nvidia-modeset).
const nvidiaMajor = 195

// gpuDevices returns a full GPU's devices, one per name strategy, all with
// its /dev/nvidia<minor>. The node is fully specified (type, major,
// minor), so the spec also holds where the node does not exist yet.
func gpuDevices(r root, g GPU, strategies []string) ([]cdispec.Device, error) {
	path := fmt.Sprintf("/dev/nvidia%d", g.Minor)
	node := &cdispec.DeviceNode{
		Path: path, HostPath: r.host(path),
		Type: "c", Major: nvidiaMajor, Minor: int64(g.Minor),
	}
	var devs []cdispec.Device
	for _, s := range strategies {
		name := fmt.Sprint(g.Index)
		if s == NameUUID {
			name = g.UUID
		}
		devs = append(devs, cdispec.Device{
			Name:           name,
			ContainerEdits: cdispec.ContainerEdits{DeviceNodes: []*cdispec.DeviceNode{node}},
		})
	}
	return devs, nil
}
