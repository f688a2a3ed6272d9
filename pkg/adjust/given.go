package adjust

import (
	"slices"
	"strings"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// given completes into what the edits applied to s give a container, as
// CDI edits: nodes are the device nodes as addDeviceNodes gave them, the
// bind mount of one given so (in a user namespace) not listed again.
func given(into *cdispec.ContainerEdits, s *oci.Spec, nodes []*cdispec.DeviceNode) {
	into.DeviceNodes = nodes
	into.Env = slices.Clone(s.Process.Env)
	for _, m := range s.Mounts {
		if slices.ContainsFunc(nodes, func(n *cdispec.DeviceNode) bool { return n.HostPath == m.Source && n.Path == m.Destination }) {
			continue
		}
		into.Mounts = append(into.Mounts, &cdispec.Mount{HostPath: m.Source, ContainerPath: m.Destination, Type: m.Type, Options: m.Options})
	}
	if h := s.Hooks; h != nil {
		//nolint:staticcheck // Prestart is deprecated, but CDI specs may use it.
		for _, point := range []struct {
			name  string
			hooks []oci.Hook
		}{
			{cdi.PrestartHook, h.Prestart}, {cdi.CreateRuntimeHook, h.CreateRuntime}, {cdi.CreateContainerHook, h.CreateContainer},
			{cdi.StartContainerHook, h.StartContainer}, {cdi.PoststartHook, h.Poststart}, {cdi.PoststopHook, h.Poststop},
		} {
			for _, hook := range point.hooks {
				into.Hooks = append(into.Hooks, &cdispec.Hook{HookName: point.name, Path: hook.Path, Args: hook.Args, Env: hook.Env, Timeout: hook.Timeout})
			}
		}
	}
	for host, d := range s.Linux.NetDevices {
		into.NetDevices = append(into.NetDevices, &cdispec.LinuxNetDevice{HostInterfaceName: host, Name: d.Name})
	}
	slices.SortFunc(into.NetDevices, func(a, b *cdispec.LinuxNetDevice) int {
		return strings.Compare(a.HostInterfaceName, b.HostInterfaceName)
	})
	if r := s.Linux.IntelRdt; r != nil {
		into.IntelRdt = &cdispec.IntelRdt{ClosID: r.ClosID, Schemata: r.Schemata, EnableMonitoring: r.EnableMonitoring}
	}
}
