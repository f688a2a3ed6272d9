package adjust

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/containerd/nri/pkg/api"
	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// Cache keeps, for one snapshot of the specs, each spec's and each
// device's edits applied by CDI on their own and converted to NRI objects,
// so that a request only merges them. Safe for concurrent use.
type Cache struct {
	mu        sync.Mutex
	snapshot  any
	fragments map[*cdispec.ContainerEdits]*fragment
}

// fragment is one set of edits as NRI objects. It is shared between
// adjustments and never modified.
type fragment struct {
	env     []*api.KeyValue
	devices []*api.LinuxDevice
	rules   []*api.LinuxDeviceCgroup
	mounts  []*api.Mount
	hooks   *api.Hooks
}

// fragment returns the prepared edits e of the given snapshot.
func (c *Cache) fragment(snapshot any, e *cdispec.ContainerEdits, nodes map[string]specs.HostNode) (*fragment, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.snapshot != snapshot || c.fragments == nil {
		c.snapshot, c.fragments = snapshot, map[*cdispec.ContainerEdits]*fragment{}
	}
	if f, ok := c.fragments[e]; ok {
		return f, nil
	}
	scratch := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	rest := *e
	rest.DeviceNodes = nil
	if err := (&cdi.ContainerEdits{ContainerEdits: &rest}).Apply(scratch); err != nil {
		return nil, err
	}
	if err := addDeviceNodes(scratch, e.DeviceNodes, nodes); err != nil {
		return nil, err
	}
	setHookEnv(scratch.Hooks, DefaultHookEnv)
	adj := toAdjustment(scratch)
	f := &fragment{
		env: adj.GetEnv(), devices: adj.GetLinux().GetDevices(), rules: adj.GetLinux().GetResources().GetDevices(),
		mounts: adj.GetMounts(), hooks: adj.GetHooks(),
	}
	c.fragments[e] = f
	return f, nil
}

// BuildCached returns what Build returns, merging edits prepared once per
// snapshot. It falls back to Build for what the preparation does not
// cover: a non-root container user (device owners depend on it), a hook
// environment of the caller's, unsupported edits, and errors.
func BuildCached(c *Cache, snapshot any, devices []*cdi.Device, nodes map[string]specs.HostNode, opts Options) (*Result, error) {
	if opts.UID != 0 || opts.GID != 0 || len(opts.HookEnv) > 0 {
		return Build(devices, nodes, opts)
	}
	m := merger{envIndex: map[string]int{}}
	for _, set := range inOrder(devices, opts.Injected) {
		e := set.edits
		if !expressible(e) {
			return Build(devices, nodes, opts)
		}
		f, err := c.fragment(snapshot, e, nodes)
		if err != nil {
			return Build(devices, nodes, opts) // for Build's error
		}
		m.add(f)
	}
	return &Result{Adjustment: m.adjustment()}, nil
}

// merger merges fragments as one ContainerEdits.Apply would apply their
// edits: a later env value replaces an earlier one in place; a later device
// node or mount of the same path replaces the earlier one and goes last;
// cgroup rules and hooks accumulate; mounts end sorted by depth (stable).
type merger struct {
	env      []*api.KeyValue
	envIndex map[string]int
	devices  []*api.LinuxDevice
	rules    []*api.LinuxDeviceCgroup
	mounts   []*api.Mount
	hooks    api.Hooks
	anyHook  bool
}

func (m *merger) add(f *fragment) {
	for _, kv := range f.env {
		if i, ok := m.envIndex[kv.Key]; ok {
			m.env[i] = kv
			continue
		}
		m.envIndex[kv.Key] = len(m.env)
		m.env = append(m.env, kv)
	}
	for _, d := range f.devices {
		m.devices = slices.DeleteFunc(m.devices, func(o *api.LinuxDevice) bool { return o.Path == d.Path })
		m.devices = append(m.devices, d)
	}
	m.rules = append(m.rules, f.rules...)
	for _, mnt := range f.mounts {
		m.mounts = slices.DeleteFunc(m.mounts, func(o *api.Mount) bool { return o.Destination == mnt.Destination })
		m.mounts = append(m.mounts, mnt)
	}
	if h := f.hooks; h != nil {
		m.anyHook = true
		m.hooks.Prestart = append(m.hooks.Prestart, h.Prestart...)
		m.hooks.CreateRuntime = append(m.hooks.CreateRuntime, h.CreateRuntime...)
		m.hooks.CreateContainer = append(m.hooks.CreateContainer, h.CreateContainer...)
		m.hooks.StartContainer = append(m.hooks.StartContainer, h.StartContainer...)
		m.hooks.Poststart = append(m.hooks.Poststart, h.Poststart...)
		m.hooks.Poststop = append(m.hooks.Poststop, h.Poststop...)
	}
}

func (m *merger) adjustment() *api.ContainerAdjustment {
	adj := &api.ContainerAdjustment{Env: m.env}
	if len(m.devices) > 0 || len(m.rules) > 0 {
		adj.Linux = &api.LinuxContainerAdjustment{Devices: m.devices}
		if len(m.rules) > 0 {
			adj.Linux.Resources = &api.LinuxResources{Devices: m.rules}
		}
	}
	slices.SortStableFunc(m.mounts, func(a, b *api.Mount) int { return depth(a.Destination) - depth(b.Destination) })
	adj.Mounts = m.mounts
	if m.anyHook {
		adj.Hooks = &m.hooks
	}
	return adj
}

// depth is the number of parts of a path, as CDI sorts mounts by.
func depth(p string) int { return strings.Count(filepath.Clean(p), string(os.PathSeparator)) }

// expressible reports whether edits have nothing NRI cannot express.
func expressible(e *cdispec.ContainerEdits) bool {
	return !hasNonRootGID(e.AdditionalGIDs) && e.IntelRdt == nil && len(e.NetDevices) == 0 &&
		!slices.ContainsFunc(e.DeviceNodes, func(n *cdispec.DeviceNode) bool { return n != nil && !grantsReadWrite(n.Permissions) })
}
