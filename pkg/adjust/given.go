package adjust

import (
	"fmt"
	"slices"
	"strings"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// byRuntime completes res.Given with what the devices the runtime
// injected itself (opts.Injected) gave, their edits applied as CDI does.
// In a user namespace runc cannot create their nodes: it binds each from
// the host at its container path. A node whose hostPath differs from its
// path, where the host has no node of its own at that path, would fail
// the container there; and nri-gpu cannot change what the runtime's CDI
// injects (containerd 2.x injects it after the plugins' adjustments):
// the container is refused, saying what to do.
func byRuntime(res *Result, hosts map[string]specs.HostNode, opts Options) error {
	if len(opts.Injected) == 0 {
		return nil
	}
	edits := &cdi.ContainerEdits{ContainerEdits: &cdispec.ContainerEdits{}}
	for _, set := range inOrder(opts.Injected, nil, opts.SpecPath) {
		edits.Append(&cdi.ContainerEdits{ContainerEdits: set.edits})
	}
	nodes := edits.DeviceNodes // apply takes them out
	asRuntime := opts
	asRuntime.UserNS = false // the runtime's CDI gives them as nodes
	scratch, givenNodes, err := apply(edits, hosts, asRuntime, nil)
	if err != nil {
		return err
	}
	for _, n := range nodes {
		if host := specs.HostPath(n); opts.UserNS && host != n.Path {
			at, ok := hosts[n.Path]
			if i := slices.IndexFunc(givenNodes, func(g *cdispec.DeviceNode) bool { return g.Path == n.Path }); !ok || at.Err != nil || i < 0 ||
				at.Type != givenNodes[i].Type || at.Major != givenNodes[i].Major || at.Minor != givenNodes[i].Minor {
				return fmt.Errorf("%w: device node %q (host %q), which the runtime's own CDI injects: in a user namespace runc binds it from %q on the host, which is not that node, and nri-gpu cannot change what the runtime's CDI injects; "+
					"have nri-gpu inject it (its device plugin's and DRA driver's cdiDevices: nri-gpu, or the runtime's CDI off: enable_cdi = false), or run the pod without a user namespace (hostUsers: true)",
					ErrUserNS, n.Path, host, n.Path)
			}
		}
	}
	var theirs cdispec.ContainerEdits
	given(&theirs, scratch, givenNodes)
	res.Given.DeviceNodes = append(res.Given.DeviceNodes, theirs.DeviceNodes...)
	res.Given.Mounts = append(res.Given.Mounts, theirs.Mounts...)
	res.Given.Env = append(res.Given.Env, theirs.Env...)
	res.Given.Hooks = append(res.Given.Hooks, theirs.Hooks...)
	addGroups(res.Given, edits.AdditionalGIDs)
	return nil
}

// addGroups adds to into's additional groups each of gids it lacks, but
// root's, which CDI ignores.
func addGroups(into *cdispec.ContainerEdits, gids []uint32) {
	for _, g := range gids {
		if g != 0 && !slices.Contains(into.AdditionalGIDs, g) {
			into.AdditionalGIDs = append(into.AdditionalGIDs, g)
		}
	}
}

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
