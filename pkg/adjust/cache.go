package adjust

import (
	"errors"
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
	mu       sync.Mutex
	snapshot any
	prepared map[*cdispec.ContainerEdits]*fragment
	// ids numbers the env keys, device paths and mount destinations of
	// the snapshot's fragments, each kind on its own, so that merging
	// finds repeats by number instead of hashing strings.
	ids [3]map[string]int32
}

// Kinds of numbered keys.
const (
	envKey = iota
	pathKey
	mountKey
)

// id returns the number of key of a kind, numbering it if new.
func (c *Cache) id(kind int, key string) int32 {
	i, ok := c.ids[kind][key]
	if !ok {
		i = int32(len(c.ids[kind]))
		c.ids[kind][key] = i
	}
	return i
}

// keys returns the count of the most numerous kind of key.
func (c *Cache) keys() int { return max(len(c.ids[envKey]), len(c.ids[pathKey]), len(c.ids[mountKey])) }

// fragment is one set of edits as NRI objects. It is shared between
// adjustments and never modified.
type fragment struct {
	env     []*api.KeyValue
	devices []*api.LinuxDevice
	rules   []*api.LinuxDeviceCgroup
	mounts  []*api.Mount
	// depths are the mounts' depths, as CDI sorts mounts by.
	depths []int
	hooks  *api.Hooks
	// envIDs, deviceIDs and mountIDs number env's keys, devices' paths and
	// mounts' destinations in the Cache.
	envIDs, deviceIDs, mountIDs []int32
}

// fragments returns the prepared edits of sets, preparing those of the
// snapshot not prepared yet, under one lock.
// It also returns how many keys of a kind are numbered at most. Edits that
// NRI cannot express are not prepared: they are errUnexpressible.
func (c *Cache) fragments(out []*fragment, snapshot any, sets *order, nodes map[string]specs.HostNode) ([]*fragment, int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.snapshot != snapshot || c.prepared == nil {
		c.snapshot, c.prepared = snapshot, map[*cdispec.ContainerEdits]*fragment{}
		for i := range c.ids {
			c.ids[i] = map[string]int32{}
		}
	}
	for set, more := sets.Next(); more; set, more = sets.Next() {
		if !expressible(set.edits) {
			return nil, 0, errUnexpressible
		}
		f, ok := c.prepared[set.edits]
		if !ok {
			var err error
			if f, err = prepare(set.edits, nodes); err != nil {
				return nil, 0, err
			}
			for _, kv := range f.env {
				f.envIDs = append(f.envIDs, c.id(envKey, kv.Key))
			}
			for _, d := range f.devices {
				f.deviceIDs = append(f.deviceIDs, c.id(pathKey, d.Path))
			}
			for _, m := range f.mounts {
				f.mountIDs = append(f.mountIDs, c.id(mountKey, m.Destination))
			}
			c.prepared[set.edits] = f
		}
		out = append(out, f)
	}
	return out, c.keys(), nil
}

// prepare applies edits e on their own, as Build does, and keeps the
// result as NRI objects.
func prepare(e *cdispec.ContainerEdits, nodes map[string]specs.HostNode) (*fragment, error) {
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
	for _, m := range f.mounts {
		f.depths = append(f.depths, depth(m.Destination))
	}
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
	buf := fragmentLists.Get().(*[]*fragment)
	defer func() {
		clear(*buf)
		*buf = (*buf)[:0]
		fragmentLists.Put(buf)
	}()
	// A device gives at most two sets of edits: its spec's and its own.
	o := inOrder(devices, opts.Injected)
	frags, keys, err := c.fragments(slices.Grow((*buf)[:0], 2*len(devices)), snapshot, &o, nodes)
	*buf = frags
	if err != nil {
		return Build(devices, nodes, opts) // for Build's error, or its handling of unsupported edits
	}
	seen := seenTables.Get().(*[]int32)
	defer seenTables.Put(seen)
	if len(*seen) < keys {
		*seen = make([]int32, keys)
	}
	return &Result{Adjustment: merge(frags, *seen)}, nil
}

// errUnexpressible is the error of fragments for edits that NRI cannot
// express, which Build reports or skips.
var errUnexpressible = errors.New("edits not expressible through NRI")

// fragmentLists are lists of fragments for BuildCached to reuse.
var fragmentLists = sync.Pool{New: func() any { return new([]*fragment) }}

// seenTables are tables for merge to reuse, all zero between uses.
var seenTables = sync.Pool{New: func() any { return new([]int32) }}

// merge merges fragments as one ContainerEdits.Apply would apply their
// edits: a later env value replaces an earlier one in place; a later device
// node or mount of the same path replaces the earlier one and goes last;
// cgroup rules and hooks accumulate; mounts end sorted by depth (stable).
// Each list is allocated once, at its final size or just above. seen, as
// long as the keys are numerous and all zero, records where a key went
// (its place plus one); merge leaves it all zero again.
func merge(frags []*fragment, seen []int32) *api.ContainerAdjustment {
	var nEnv, nDevices, nRules, nMounts int
	var hooks *api.Hooks
	for _, f := range frags {
		nEnv, nDevices, nRules, nMounts = nEnv+len(f.env), nDevices+len(f.devices), nRules+len(f.rules), nMounts+len(f.mounts)
		if f.hooks != nil && hooks == nil {
			hooks = &api.Hooks{}
		}
	}
	// forget sets seen back to zero for the keys of one kind.
	forget := func(ids func(*fragment) []int32) {
		for _, f := range frags {
			for _, id := range ids(f) {
				seen[id] = 0
			}
		}
	}

	adj := &api.ContainerAdjustment{}
	if nEnv > 0 {
		adj.Env = make([]*api.KeyValue, 0, nEnv)
		for _, f := range frags {
			for j, kv := range f.env {
				if at := seen[f.envIDs[j]]; at > 0 {
					adj.Env[at-1] = kv
					continue
				}
				adj.Env = append(adj.Env, kv)
				seen[f.envIDs[j]] = int32(len(adj.Env))
			}
		}
		forget(func(f *fragment) []int32 { return f.envIDs })
	}
	if nDevices > 0 || nRules > 0 {
		adj.Linux = &api.LinuxContainerAdjustment{}
	}
	if nDevices > 0 {
		// The last node of each path wins and takes its place: walk back
		// keeping the first of each path seen, then turn the list around.
		devices := make([]*api.LinuxDevice, 0, nDevices)
		for i := len(frags) - 1; i >= 0; i-- {
			f := frags[i]
			for j := len(f.devices) - 1; j >= 0; j-- {
				if id := f.deviceIDs[j]; seen[id] == 0 {
					seen[id] = 1
					devices = append(devices, f.devices[j])
				}
			}
		}
		forget(func(f *fragment) []int32 { return f.deviceIDs })
		slices.Reverse(devices)
		adj.Linux.Devices = devices
	}
	if nRules > 0 {
		rules := make([]*api.LinuxDeviceCgroup, 0, nRules)
		for _, f := range frags {
			rules = append(rules, f.rules...)
		}
		adj.Linux.Resources = &api.LinuxResources{Devices: rules}
	}
	if nMounts > 0 {
		type placed struct {
			m     *api.Mount
			depth int
		}
		mounts := make([]placed, 0, nMounts)
		for i := len(frags) - 1; i >= 0; i-- {
			f := frags[i]
			for j := len(f.mounts) - 1; j >= 0; j-- {
				if id := f.mountIDs[j]; seen[id] == 0 {
					seen[id] = 1
					mounts = append(mounts, placed{f.mounts[j], f.depths[j]})
				}
			}
		}
		forget(func(f *fragment) []int32 { return f.mountIDs })
		slices.Reverse(mounts)
		slices.SortStableFunc(mounts, func(a, b placed) int { return a.depth - b.depth })
		adj.Mounts = make([]*api.Mount, len(mounts))
		for i, p := range mounts {
			adj.Mounts[i] = p.m
		}
	}
	if hooks != nil {
		for _, f := range frags {
			if h := f.hooks; h != nil {
				hooks.Prestart = append(hooks.Prestart, h.Prestart...)
				hooks.CreateRuntime = append(hooks.CreateRuntime, h.CreateRuntime...)
				hooks.CreateContainer = append(hooks.CreateContainer, h.CreateContainer...)
				hooks.StartContainer = append(hooks.StartContainer, h.StartContainer...)
				hooks.Poststart = append(hooks.Poststart, h.Poststart...)
				hooks.Poststop = append(hooks.Poststop, h.Poststop...)
			}
		}
		adj.Hooks = hooks
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
