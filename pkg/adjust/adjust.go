package adjust

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/containerd/nri/pkg/api"
	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// ErrUnsupportedEdit is wrapped by the error for an edit NRI cannot express.
var ErrUnsupportedEdit = errors.New("CDI edit not expressible through NRI")

// Edit names of the CDI edits that NRI cannot express.
const (
	EditAdditionalGIDs = "additionalGids"
	EditIntelRdt       = "intelRdt"
	EditNetDevices     = "netDevices"
)

// Options tune Build.
type Options struct {
	// SkipUnsupported leaves out additionalGids, intelRdt and netDevices
	// edits, reporting them in Result.Skipped, instead of failing.
	SkipUnsupported bool
	// UID and GID are the container process's user and group. CDI gives
	// them to device nodes whose spec sets no owner, as a runtime does.
	UID, GID uint32
	// Injected are devices the runtime itself already injected (its own
	// CDI support, for a cdi.k8s.io annotation): the spec-level edits of
	// their specs are not applied again.
	Injected []*cdi.Device
}

// Skipped is an unsupported edit that Build left out.
type Skipped struct {
	// Device is the qualified name of the device the edit belongs to.
	Device string
	// Edit is the name of the edit, such as "additionalGids".
	Edit string
	// Spec is the spec file, set when the edit is a spec-level one.
	Spec string
}

// Result is what Build returns.
type Result struct {
	// Adjustment is the NRI adjustment that injects the devices.
	Adjustment *api.ContainerAdjustment
	// Skipped lists the unsupported edits left out.
	Skipped []Skipped
}

// Build collects the edits of devices, spec-level edits once per spec,
// applies them as CDI does and returns them as one NRI adjustment. Device
// nodes take their host information from nodes, stat'ed when the specs
// were loaded, so Build does not touch the disk. A hook whose spec gives
// it no environment gets specs.HookEnv. Nothing is returned unless every
// device's edits can be expressed.
func Build(devices []*cdi.Device, nodes map[string]specs.HostNode, opts Options) (*Result, error) {
	var (
		edits   = &cdi.ContainerEdits{ContainerEdits: &cdispec.ContainerEdits{}}
		skipped []Skipped
		errs    []error
		names   []string
	)
	for _, d := range devices {
		names = append(names, d.GetQualifiedName())
	}
	for _, set := range inOrder(devices, opts.Injected) {
		e, s, err := supported(set, opts.SkipUnsupported)
		errs = append(errs, err)
		skipped = append(skipped, s...)
		edits.Append(e)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}

	scratch := &oci.Spec{
		Process: &oci.Process{User: oci.User{UID: opts.UID, GID: opts.GID}},
		Linux:   &oci.Linux{},
	}
	// CDI applies everything but the device nodes (which it would stat);
	// addDeviceNodes does their part of ContainerEdits.Apply from nodes.
	deviceNodes := edits.DeviceNodes
	edits.DeviceNodes = nil
	if err := edits.Apply(scratch); err != nil {
		return nil, fmt.Errorf("applying CDI edits of %s: %w", strings.Join(names, ", "), err)
	}
	if err := addDeviceNodes(scratch, deviceNodes, nodes); err != nil {
		return nil, fmt.Errorf("applying CDI edits of %s: %w", strings.Join(names, ", "), err)
	}
	setHookEnv(scratch.Hooks, []string{specs.HookEnv})
	return &Result{Adjustment: toAdjustment(scratch), Skipped: skipped}, nil
}

// supported returns a set's edits without the unsupported ones when skip
// is true, or an error naming each unsupported edit when it is false. The
// set's edits, which belong to the spec snapshot, are not modified.
func supported(set editSet, skip bool) (*cdi.ContainerEdits, []Skipped, error) {
	where := fmt.Sprintf("device %q", set.device)
	if set.spec != "" {
		where = fmt.Sprintf("device %q (spec-level edits of %s)", set.device, set.spec)
	}
	e := *set.edits
	var (
		skipped []Skipped
		errs    []error
	)
	drop := func(edit string, present bool, clear func()) {
		if !present {
			return
		}
		if skip {
			clear()
			skipped = append(skipped, Skipped{Device: set.device, Edit: edit, Spec: set.spec})
			return
		}
		errs = append(errs, fmt.Errorf("%s: %w: %s (set unsupportedEdits: warn to skip it)",
			where, ErrUnsupportedEdit, edit))
	}
	drop(EditAdditionalGIDs, slices.ContainsFunc(e.AdditionalGIDs, func(g uint32) bool { return g != 0 }), // CDI ignores GID 0
		func() { e.AdditionalGIDs = nil })
	drop(EditIntelRdt, e.IntelRdt != nil, func() { e.IntelRdt = nil })
	drop(EditNetDevices, len(e.NetDevices) > 0, func() { e.NetDevices = nil })
	for _, n := range e.DeviceNodes {
		if n != nil && !grantsReadWrite(n.Permissions) {
			errs = append(errs, fmt.Errorf("%s: %w: device node %q asks for cgroup permissions %q, but NRI grants \"rw\" to every device it adds",
				where, ErrUnsupportedEdit, n.Path, n.Permissions))
		}
	}
	return &cdi.ContainerEdits{ContainerEdits: &e}, skipped, errors.Join(errs...)
}

// setHookEnv gives env to every hook that has no environment of its own.
func setHookEnv(hooks *oci.Hooks, env []string) {
	if hooks == nil {
		return
	}
	//nolint:staticcheck // Prestart is deprecated, but CDI specs may use it.
	for _, point := range [][]oci.Hook{hooks.Prestart, hooks.CreateRuntime, hooks.CreateContainer,
		hooks.StartContainer, hooks.Poststart, hooks.Poststop} {
		for i := range point {
			if len(point[i].Env) == 0 {
				point[i].Env = slices.Clone(env)
			}
		}
	}
}

// grantsReadWrite reports whether CDI permissions include read and write;
// empty permissions mean "rwm".
func grantsReadWrite(perm string) bool {
	return perm == "" || (strings.Contains(perm, "r") && strings.Contains(perm, "w"))
}

// toAdjustment converts what the edits did to an empty OCI spec into an
// NRI adjustment, with NRI's own converters.
func toAdjustment(s *oci.Spec) *api.ContainerAdjustment {
	adj := &api.ContainerAdjustment{}
	for _, kv := range api.FromOCIEnv(s.Process.Env) {
		adj.AddEnv(kv.Key, kv.Value)
	}
	for _, d := range api.FromOCILinuxDevices(s.Linux.Devices) {
		adj.AddDevice(d)
	}
	// NRI derives an "rw" cgroup rule from each device; the rules CDI
	// computes (default "rwm") are passed as well, for runtimes whose NRI
	// applies cgroup rules from adjustments (containerd 2.x).
	if r := api.FromOCILinuxResources(s.Linux.Resources, nil); r != nil && len(r.Devices) > 0 {
		if adj.Linux == nil {
			adj.Linux = &api.LinuxContainerAdjustment{}
		}
		adj.Linux.Resources = &api.LinuxResources{Devices: r.Devices}
	}
	for _, m := range api.FromOCIMounts(s.Mounts) {
		adj.AddMount(m)
	}
	if s.Hooks != nil {
		adj.AddHooks(api.FromOCIHooks(s.Hooks))
	}
	return adj
}
