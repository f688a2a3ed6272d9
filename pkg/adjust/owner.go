package adjust

import (
	"os"
	"syscall"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// ownDevicesAsHost gives each device node that neither its spec nor a
// non-root container user gave an owner the owner of its host node, so
// that a node appears in the container as it is on the host. (A runtime
// treats a missing owner as root, which is what host GPU nodes have.)
func ownDevicesAsHost(devices []oci.LinuxDevice, nodes []*cdispec.DeviceNode) {
	hostPaths := make(map[string]string, len(nodes))
	for _, n := range nodes {
		if n == nil {
			continue
		}
		host := n.HostPath
		if host == "" {
			host = n.Path
		}
		hostPaths[n.Path] = host
	}
	for i := range devices {
		d := &devices[i]
		if d.UID != nil && d.GID != nil {
			continue
		}
		fi, err := os.Stat(hostPaths[d.Path])
		if err != nil {
			// CDI accepts a fully specified node without a host node; its
			// owner stays unset, as CDI leaves it.
			continue
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			continue
		}
		if d.UID == nil {
			uid := st.Uid
			d.UID = &uid
		}
		if d.GID == nil {
			gid := st.Gid
			d.GID = &gid
		}
	}
}
