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

// ErrUserNS is wrapped by the error for a device node a user-namespaced
// container cannot be given on its runtime.
var ErrUserNS = errors.New("device node not expressible in a user namespace")

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
	// UserUnknown says the runtime reports no process user (containerd
	// 1.7's NRI): UID and GID are 0 for want of better, and a node whose
	// spec gives no group keeps its host node's group where that group
	// has access others lack (a 0660 node of group 44) and the spec's
	// additionalGids name it (which NRI cannot give the process), so that
	// a process of that group can use it, as on the host.
	UserUnknown bool
	// AdditionalGIDs are the groups the container's process has already.
	AdditionalGIDs []uint32
	// Injected are devices the runtime itself already injected (its own
	// CDI support, for a cdi.k8s.io annotation): the spec-level edits of
	// their specs are not applied again. Result.Given lists what they
	// gave too; with UserNS, one runc could not create there is refused
	// (see byRuntime).
	Injected []*cdi.Device
	// Runtime is what the connected runtime applies; the zero value
	// applies none of cgroup rules, net devices and RDT.
	Runtime Runtime
	// SpecPath names the file a spec was read from, for messages
	// (specs.Snapshot.SpecPath); nil takes the path CDI knows.
	SpecPath func(*cdi.Spec) string
	// Extra are edits of nri-gpu's own (not of a spec), applied after the
	// devices' as theirs are.
	Extra []Extra
	// UserNS says the container runs in a user namespace of its own,
	// where the runtime cannot create device nodes: runc bind-mounts each
	// from the host path equal to its container path, its owner and group
	// shown as the namespace's nobody. A node whose spec gives another
	// hostPath, or whose host node gives others no read-write access (it
	// is for its owner or group), is given as a read-only bind mount of
	// its hostPath at its path (idmapped for the latter, so that its
	// owner and group are the host's), with its cgroup rule, where the
	// runtime applies cgroup rules; refused where it does not.
	UserNS bool
	// HookFree replaces every hook by edits the runtime applies (see
	// withoutHooks.replace): no hook reaches the container, and a device
	// with a hook that cannot be replaced is refused.
	HookFree bool
	// Sonames are the sonames of the host's shared libraries that specs
	// mount, by host path (specs.Snapshot.Sonames): the links
	// update-ldcache would make, for HookFree.
	Sonames map[string]string
}

// Extra is a set of edits of nri-gpu's own, such as what a client of an
// MPS-shared GPU needs.
type Extra struct {
	// Name says what the edits are for, in messages.
	Name  string
	Edits *cdispec.ContainerEdits
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
	// Unneeded lists the edits the runtime cannot apply that were left
	// out because they change nothing for this container: additional
	// groups for a process that runs as root or has them already.
	Unneeded []Skipped
	// Given is what the adjustment gives the container, as CDI edits: its
	// device nodes (one given as a bind mount in a user namespace with
	// its hostPath, and no mount of its own), mounts, environment, hooks,
	// net devices and RDT, and the additional groups its devices need,
	// which its process has (Unneeded). Edits left out are not in it.
	Given *cdispec.ContainerEdits
	// LeftOut are the hooks HookFree left out, and what the container
	// lacks without them.
	LeftOut []LeftOut
}

// Build collects the edits of devices, spec-level edits once per spec,
// applies them as CDI does and returns them as one NRI adjustment. Device
// nodes take their host information from nodes, stat'ed when the specs
// were loaded, so Build does not touch the disk. A hook whose spec gives
// it no environment gets specs.HookEnv. Nothing is returned unless every
// device's edits can be expressed.
func Build(devices []*cdi.Device, nodes map[string]specs.HostNode, opts Options) (*Result, error) {
	var (
		edits = &cdi.ContainerEdits{ContainerEdits: &cdispec.ContainerEdits{}}
		res   = &Result{Given: &cdispec.ContainerEdits{}}
		errs  []error
		names []string
	)
	for _, d := range devices {
		names = append(names, d.GetQualifiedName())
	}
	var kept []editSet
	sets := inOrder(devices, opts.Injected, opts.SpecPath)
	for _, x := range opts.Extra {
		sets = append(sets, editSet{edits: x.Edits, device: x.Name})
	}
	var free *withoutHooks
	if opts.HookFree {
		free = newWithoutHooks(sets, opts.Sonames)
		errs = append(errs, hooksByRuntime(opts))
	}
	for _, set := range sets {
		if free != nil {
			hookless, err := free.replace(set, res)
			errs = append(errs, err)
			set.edits = hookless
		}
		e, err := supported(set, opts, res)
		errs = append(errs, err)
		edits.Append(e)
		set.edits = e.ContainerEdits
		kept = append(kept, set)
	}
	if !opts.Runtime.CgroupRules {
		errs = append(errs, widened(kept, opts.Runtime))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}

	scratch, givenNodes, err := apply(edits, nodes, opts, res.Given.AdditionalGIDs)
	if err != nil {
		return nil, fmt.Errorf("applying CDI edits of %s: %w", strings.Join(names, ", "), err)
	}
	setHookEnv(scratch.Hooks, []string{specs.HookEnv})
	res.Adjustment = toAdjustment(scratch, opts.Runtime)
	given(res.Given, scratch, givenNodes)
	if err := byRuntime(res, nodes, opts); err != nil {
		return nil, fmt.Errorf("devices the runtime injected: %w", err)
	}
	return res, nil
}

// apply applies edits to an empty spec whose process runs as opts'
// user: CDI applies everything but the device nodes (which it would
// stat); addDeviceNodes does their part of ContainerEdits.Apply from
// hosts, and its nodes as given are returned with the spec. edits is
// left without its device nodes. groups are the additional groups the
// edits give the process (addDeviceNodes).
func apply(edits *cdi.ContainerEdits, hosts map[string]specs.HostNode, opts Options, groups []uint32) (*oci.Spec, []*cdispec.DeviceNode, error) {
	s := &oci.Spec{
		Process: &oci.Process{User: oci.User{UID: opts.UID, GID: opts.GID}},
		Linux:   &oci.Linux{},
	}
	nodes := edits.DeviceNodes
	edits.DeviceNodes = nil
	if err := edits.Apply(s); err != nil {
		return nil, nil, err
	}
	given, err := addDeviceNodes(s, nodes, hosts, opts, groups)
	return s, given, err
}

// supported returns a set's edits less those the runtime cannot apply.
// One whose absence changes nothing for the container is left out and
// recorded in res.Unneeded. Any other is left out and recorded in
// res.Skipped when opts.SkipUnsupported is set, and is an error naming
// the device, the edit and the runtime otherwise; device permissions
// narrower than "rw" are always an error where the runtime applies no
// cgroup rules, as leaving them out would widen access. The set's edits,
// which belong to the spec snapshot, are not modified.
func supported(set editSet, opts Options, res *Result) (*cdi.ContainerEdits, error) {
	where, runtime := set.where(), opts.Runtime.named()
	e := *set.edits
	var errs []error
	unsupported := func(edit string, clear func()) {
		if opts.SkipUnsupported {
			clear()
			res.Skipped = append(res.Skipped, Skipped{Device: set.device, Edit: edit, Spec: set.spec})
			return
		}
		errs = append(errs, fmt.Errorf("%s: %w: %s cannot apply %s (set unsupportedEdits: warn to skip it)",
			where, ErrUnsupportedEdit, runtime, edit))
	}
	if slices.ContainsFunc(e.AdditionalGIDs, func(g uint32) bool { return g != 0 }) { // CDI ignores GID 0
		if opts.UID == 0 || !slices.ContainsFunc(e.AdditionalGIDs, func(g uint32) bool { return lacksGroup(g, opts) }) {
			addGroups(res.Given, e.AdditionalGIDs)
			e.AdditionalGIDs = nil
			res.Unneeded = append(res.Unneeded, Skipped{Device: set.device, Edit: EditAdditionalGIDs, Spec: set.spec})
		} else {
			unsupported(EditAdditionalGIDs, func() { e.AdditionalGIDs = nil })
		}
	}
	if r := e.IntelRdt; r != nil && (!opts.Runtime.RDT || r.L3CacheSchema != "" || r.MemBwSchema != "") {
		// NRI's RDT adjustment has a CLOS, schemata and monitoring, but
		// no L3 cache or memory bandwidth schema of their own.
		unsupported(EditIntelRdt, func() { e.IntelRdt = nil })
	}
	if len(e.NetDevices) > 0 && !opts.Runtime.NetDevices {
		unsupported(EditNetDevices, func() { e.NetDevices = nil })
	}
	return &cdi.ContainerEdits{ContainerEdits: &e}, errors.Join(errs...)
}

// widened returns an error for each device node whose access, as CDI
// computes it over all the devices of the request (the permissions of
// every device naming the node add up), is narrower than the "rw" a
// runtime that applies no cgroup rules of a plugin grants every device
// NRI adds: leaving it out would widen access.
func widened(sets []editSet, rt Runtime) error {
	access := map[string]string{} // by host path
	for _, set := range sets {
		for _, n := range set.edits.DeviceNodes {
			if n != nil {
				access[specs.HostPath(n)] += permissions(n.Permissions)
			}
		}
	}
	var errs []error
	for _, set := range sets {
		for _, n := range set.edits.DeviceNodes {
			if n != nil && !grantsReadWrite(access[specs.HostPath(n)]) {
				errs = append(errs, fmt.Errorf("%s: %w: device node %q asks for cgroup permissions %q, but %s grants \"rw\" to every device NRI adds and applies no cgroup rule of a plugin; "+
					"nri-gpu refuses rather than widen it: run the container on containerd 2.x (its NRI applies nri-gpu's rules), or have the spec give the node \"rw\" if it may be written",
					set.where(), ErrUnsupportedEdit, n.Path, n.Permissions, rt.named()))
			}
		}
	}
	return errors.Join(errs...)
}

// permissions returns CDI permissions as the access they grant: empty
// permissions mean "rwm".
func permissions(perm string) string {
	if perm == "" {
		return "rwm"
	}
	return perm
}

// lacksGroup reports whether the container's process lacks group g.
func lacksGroup(g uint32, opts Options) bool {
	return g != 0 && g != opts.GID && !slices.Contains(opts.AdditionalGIDs, g)
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
	perm = permissions(perm)
	return strings.Contains(perm, "r") && strings.Contains(perm, "w")
}

// beyond returns what NRI's own rule for an allowed device grants beyond
// the rule: NRI grants "rw" to a character device and "rwm" to a block
// device it adds.
func beyond(rule *api.LinuxDeviceCgroup) string {
	if !rule.Allow {
		return ""
	}
	grant := "rw"
	if rule.Type == "b" {
		grant = "rwm"
	}
	return strings.Map(func(r rune) rune {
		if strings.ContainsRune(rule.Access, r) {
			return -1
		}
		return r
	}, grant)
}

// toAdjustment converts what the edits did to an empty OCI spec into an
// NRI adjustment, with NRI's own converters where NRI has them.
func toAdjustment(s *oci.Spec, rt Runtime) *api.ContainerAdjustment {
	adj := &api.ContainerAdjustment{}
	for _, kv := range api.FromOCIEnv(s.Process.Env) {
		adj.AddEnv(kv.Key, kv.Value)
	}
	for _, d := range api.FromOCILinuxDevices(s.Linux.Devices) {
		adj.AddDevice(d)
	}
	// NRI derives an "rw" cgroup rule from each device; the rules CDI
	// computes (default "rwm") are passed as well, for runtimes whose NRI
	// applies cgroup rules from adjustments (containerd 2.x). There, a
	// node whose access is narrower than NRI's own gets, after all the
	// rules, one denying what NRI's rule allowed beyond it, so that the
	// container's access is CDI's: the union of the rules of every device
	// naming the node, as runc applies CDI's rules.
	if r := api.FromOCILinuxResources(s.Linux.Resources, nil); r != nil && len(r.Devices) > 0 {
		if adj.Linux == nil {
			adj.Linux = &api.LinuxContainerAdjustment{}
		}
		var (
			rules []*api.LinuxDeviceCgroup
			nodes []*api.LinuxDeviceCgroup // one union rule per node, in order
		)
		for _, rule := range r.Devices {
			// An allow rule with no access (CDI's permissions "none")
			// allows nothing, and runc refuses it: the deny rule below
			// is all it takes.
			if !rule.Allow || rule.Access != "" {
				rules = append(rules, rule)
			}
			if !rule.Allow {
				continue
			}
			i := slices.IndexFunc(nodes, func(n *api.LinuxDeviceCgroup) bool {
				return n.Type == rule.Type && n.Major.GetValue() == rule.Major.GetValue() && n.Minor.GetValue() == rule.Minor.GetValue()
			})
			if i < 0 {
				nodes = append(nodes, &api.LinuxDeviceCgroup{Allow: true, Type: rule.Type, Major: rule.Major, Minor: rule.Minor})
				i = len(nodes) - 1
			}
			nodes[i].Access += rule.Access
		}
		for _, n := range nodes {
			if deny := beyond(n); rt.CgroupRules && deny != "" {
				rules = append(rules, &api.LinuxDeviceCgroup{Type: n.Type, Major: n.Major, Minor: n.Minor, Access: deny})
			}
		}
		adj.Linux.Resources = &api.LinuxResources{Devices: rules}
	}
	for host, d := range api.FromOCILinuxNetDevices(s.Linux.NetDevices) {
		adj.AddLinuxNetDevice(host, d)
	}
	if r := s.Linux.IntelRdt; r != nil { // no L3 cache or memory bandwidth schema: supported refuses them
		if r.ClosID != "" {
			adj.SetLinuxRDTClosID(r.ClosID)
		}
		if len(r.Schemata) > 0 {
			adj.SetLinuxRDTSchemata(r.Schemata)
		}
		if r.EnableMonitoring {
			adj.SetLinuxRDTEnableMonitoring(true)
		}
	}
	for _, m := range api.FromOCIMounts(s.Mounts) {
		adj.AddMount(m)
	}
	if s.Hooks != nil {
		adj.AddHooks(api.FromOCIHooks(s.Hooks))
	}
	return adj
}
