package adjust

import (
	"cmp"
	"fmt"
	"os"
	"slices"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// addDeviceNodes adds device nodes and their cgroup rules to s exactly as
// CDI's ContainerEdits.Apply does (fillMissingInfo, then the process's
// user as owner, a node replacing one of the same path, a rule with the
// spec's permissions or "rwm"), but with host information stat'ed at spec
// load instead of now. Like CDI, it takes the type, numbers and file
// mode of a node from the host node, never its owner: a node whose spec
// gives no uid or gid gets the container's user, or none (root). It
// returns the nodes as given, for Result.Given. Where the process's
// user is unknown (Options.UserUnknown), a node whose host node is for
// one of groups (the additional groups the edits give the process) keeps
// that group.
func addDeviceNodes(s *oci.Spec, nodes []*cdispec.DeviceNode, hosts map[string]specs.HostNode, opts Options, groups []uint32) ([]*cdispec.DeviceNode, error) {
	var given []*cdispec.DeviceNode
	if s.Linux.Resources == nil {
		s.Linux.Resources = &oci.LinuxResources{}
	}
	for _, raw := range nodes {
		if raw == nil {
			continue
		}
		n := *raw
		n.HostPath = specs.HostPath(raw)
		host, ok := hosts[n.HostPath]
		if !ok {
			host = specs.HostNode{Err: fmt.Errorf("not stat'ed when the specs were loaded")}
		}
		// CDI's fillMissingInfo.
		minimal := n.Type != "" && (n.Major != 0 || n.Type == "p")
		if host.Err != nil && !minimal {
			return nil, fmt.Errorf("failed to stat CDI host device %q: %w", n.HostPath, host.Err)
		}
		if host.Err == nil {
			if n.FileMode == nil {
				mode := host.Mode
				n.FileMode = &mode
			}
			if !minimal {
				if n.Type != "" && n.Type != host.Type {
					return nil, fmt.Errorf("CDI device (%q, %q), host type mismatch (%s, %s)", n.Path, n.HostPath, n.Type, host.Type)
				}
				fillFromHost(&n, host)
			}
		}
		dev := oci.LinuxDevice{Path: n.Path, Type: n.Type, Major: n.Major, Minor: n.Minor, FileMode: n.FileMode, UID: n.UID, GID: n.GID}
		if uid := s.Process.User.UID; dev.UID == nil && uid > 0 {
			dev.UID = &uid
		}
		if gid := s.Process.User.GID; dev.GID == nil && gid > 0 {
			dev.GID = &gid
		}
		if gid := host.GID; opts.UserUnknown && dev.GID == nil && host.Err == nil && slices.Contains(groups, gid) && groupOnly(host.Mode) {
			dev.GID = &gid
		}

		s.Linux.Devices = slices.DeleteFunc(s.Linux.Devices, func(d oci.LinuxDevice) bool { return d.Path == dev.Path })
		given = slices.DeleteFunc(given, func(g *cdispec.DeviceNode) bool { return g.Path == dev.Path })
		record := &cdispec.DeviceNode{Path: dev.Path, Type: dev.Type, Major: dev.Major, Minor: dev.Minor, FileMode: dev.FileMode,
			Permissions: n.Permissions, UID: dev.UID, GID: dev.GID}
		// A node whose mode gives others no read-write access is for its
		// owner or group, which a plain bind shows as the namespace's
		// nobody: it is bound idmapped, its owner and group seen as the
		// host's, read-only so that the namespace's root, seen as its
		// owner, cannot change the host node.
		restricted := host.Err == nil && host.Mode.Perm()&0o006 != 0o006
		if opts.UserNS && (n.HostPath != n.Path || restricted) && (dev.Type == "b" || dev.Type == "c") {
			if !opts.Runtime.CgroupRules {
				return nil, fmt.Errorf("%w: device node %q (host %q): in a user namespace the runtime cannot create it, and a bind mount of it needs a cgroup rule, which %s does not apply from NRI; run the pod without a user namespace (hostUsers: true), or on containerd 2.x",
					ErrUserNS, n.Path, n.HostPath, opts.Runtime.named())
			}
			// Only a device node of the node's type is bound: never a
			// file or a directory a spec's numbers would let through.
			if host.Err != nil || host.Type != dev.Type {
				return nil, fmt.Errorf("%w: device node %q: its host node %q is not a %s device node (%v), which a user-namespaced container is given by a bind mount of it",
					ErrUserNS, n.Path, n.HostPath, dev.Type, cmp.Or[any](host.Err, "type "+host.Type))
			}
			bind := oci.Mount{Destination: n.Path, Source: n.HostPath, Type: "bind", Options: []string{"bind", "ro"}}
			if restricted {
				bind.Options = append(bind.Options, "idmap")
			}
			// Once, as a device node is, when several devices name it.
			s.Mounts = slices.DeleteFunc(s.Mounts, func(m oci.Mount) bool { return m.Destination == bind.Destination && m.Source == bind.Source })
			s.Mounts = append(s.Mounts, bind)
			// The host node, with its mode and owner (as the namespace
			// maps it), is what is seen.
			mode := host.Mode
			record.HostPath, record.FileMode, record.UID, record.GID = n.HostPath, &mode, nil, nil
		} else {
			s.Linux.Devices = append(s.Linux.Devices, dev)
		}
		given = append(given, record)
		if dev.Type == "b" || dev.Type == "c" {
			access := n.Permissions
			switch access {
			case "":
				access = "rwm"
			case cdi.NoPermissions:
				access = ""
			}
			major, minor := dev.Major, dev.Minor
			s.Linux.Resources.Devices = append(s.Linux.Resources.Devices, oci.LinuxDeviceCgroup{
				Allow: true, Type: dev.Type, Major: &major, Minor: &minor, Access: access,
			})
		}
	}
	return given, nil
}

// groupOnly reports whether a mode gives the group read or write access
// that it gives others not.
func groupOnly(mode os.FileMode) bool {
	group, other := (mode.Perm()>>3)&0o6, mode.Perm()&0o6
	return group&^other != 0
}

// fillFromHost completes a device node from its host node as CDI's
// fillMissingInfo does: the type when the spec gives none, the numbers
// when it gives no major (a fifo has none).
func fillFromHost(n *cdispec.DeviceNode, host specs.HostNode) {
	if n.Type == "" {
		n.Type = host.Type
	}
	if n.Type != "p" && n.Major == 0 {
		n.Major, n.Minor = host.Major, host.Minor
	}
}
