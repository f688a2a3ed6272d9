package adjust

import (
	"slices"

	"tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// Access is what a sandbox must be able to reach for some devices, from
// their CDI edits (spec-level ones once per spec): for runtimes that
// confine containers further (Landlock, seccomp, AppArmor) and must open
// exactly these paths. Its JSON form is nri-gpu access's output.
type Access struct {
	// Devices are the qualified names asked for.
	Devices []string `json:"devices"`
	// DeviceNodes are opened read-write.
	DeviceNodes []AccessNode `json:"deviceNodes"`
	// Mounts are host paths mounted into the container.
	Mounts []AccessMount `json:"mounts"`
	// Hooks are the executables the runtime runs for the container.
	Hooks []AccessHook `json:"hooks"`
	// AdditionalGIDs are groups the container's process must have.
	AdditionalGIDs []uint32 `json:"additionalGids"`
	// Env is the environment the devices set.
	Env []string `json:"env"`
}

// AccessNode is a device node.
type AccessNode struct {
	Path     string `json:"path"`
	HostPath string `json:"hostPath"`
	// Type, Major and Minor are the spec's, else the host node's, as
	// CDI completes them.
	Type  string `json:"type,omitempty"`
	Major int64  `json:"major"`
	Minor int64  `json:"minor"`
	// Permissions are the cgroup permissions: the spec's, else "rwm".
	Permissions string `json:"permissions"`
}

// AccessMount is a host path mounted into the container.
type AccessMount struct {
	HostPath      string   `json:"hostPath"`
	ContainerPath string   `json:"containerPath"`
	ReadOnly      bool     `json:"readOnly"`
	Options       []string `json:"options,omitempty"`
}

// AccessHook is a hook executable and where it runs.
type AccessHook struct {
	HookName string   `json:"hookName"`
	Path     string   `json:"path"`
	Args     []string `json:"args,omitempty"`
}

// AccessOf returns what devices need, host nodes as stat'ed at load.
func AccessOf(devices []*cdi.Device, nodes map[string]specs.HostNode) *Access {
	a := &Access{Devices: []string{}, DeviceNodes: []AccessNode{}, Mounts: []AccessMount{}, Hooks: []AccessHook{}, AdditionalGIDs: []uint32{}, Env: []string{}}
	for _, d := range devices {
		a.Devices = append(a.Devices, d.GetQualifiedName())
	}
	for _, set := range inOrder(devices, nil, nil) {
		a.add(set.edits, nodes)
	}
	return a
}

func (a *Access) add(e *cdispec.ContainerEdits, nodes map[string]specs.HostNode) {
	a.Env = append(a.Env, e.Env...)
	for _, n := range e.DeviceNodes {
		if n == nil {
			continue
		}
		filled, hostPath := *n, specs.HostPath(n)
		if host, ok := nodes[hostPath]; ok && host.Err == nil {
			fillFromHost(&filled, host)
		}
		node := AccessNode{Path: n.Path, HostPath: hostPath, Type: filled.Type, Major: filled.Major, Minor: filled.Minor, Permissions: n.Permissions}
		if node.Permissions == "" {
			node.Permissions = "rwm"
		}
		a.DeviceNodes = append(a.DeviceNodes, node)
	}
	for _, m := range e.Mounts {
		if m == nil {
			continue
		}
		ro := false
		for _, o := range m.Options {
			switch o {
			case "ro":
				ro = true
			case "rw":
				ro = false
			}
		}
		a.Mounts = append(a.Mounts, AccessMount{HostPath: m.HostPath, ContainerPath: m.ContainerPath, ReadOnly: ro, Options: m.Options})
	}
	for _, h := range e.Hooks {
		if h != nil {
			a.Hooks = append(a.Hooks, AccessHook{HookName: h.HookName, Path: h.Path, Args: h.Args})
		}
	}
	for _, g := range e.AdditionalGIDs {
		if g != 0 && !slices.Contains(a.AdditionalGIDs, g) {
			a.AdditionalGIDs = append(a.AdditionalGIDs, g)
		}
	}
}
