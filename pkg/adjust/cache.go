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
	mu       sync.Mutex
	snapshot any
	prepared map[*cdispec.ContainerEdits]*fragment
}

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
}

// fragments returns the prepared edits of sets, preparing those of the
// snapshot not prepared yet, under one lock.
func (c *Cache) fragments(out []*fragment, snapshot any, sets *order, nodes map[string]specs.HostNode) ([]*fragment, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.snapshot != snapshot || c.prepared == nil {
		c.snapshot, c.prepared = snapshot, map[*cdispec.ContainerEdits]*fragment{}
	}
	for set, more := sets.Next(); more; set, more = sets.Next() {
		f, ok := c.prepared[set.edits]
		if !ok {
			var err error
			if f, err = prepare(set.edits, nodes); err != nil {
				return nil, err
			}
			c.prepared[set.edits] = f
		}
		out = append(out, f)
	}
	return out, nil
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
	n := 0
	o := inOrder(devices, opts.Injected)
	for set, ok := o.Next(); ok; set, ok = o.Next() {
		if !expressible(set.edits) {
			return Build(devices, nodes, opts)
		}
		n++
	}
	buf := fragmentLists.Get().(*[]*fragment)
	defer func() {
		clear(*buf)
		*buf = (*buf)[:0]
		fragmentLists.Put(buf)
	}()
	o = inOrder(devices, opts.Injected)
	frags, err := c.fragments(slices.Grow((*buf)[:0], n), snapshot, &o, nodes)
	*buf = frags
	if err != nil {
		return Build(devices, nodes, opts) // for Build's error
	}
	return &Result{Adjustment: merge(frags)}, nil
}

// fragmentLists are lists of fragments for BuildCached to reuse.
var fragmentLists = sync.Pool{New: func() any { return new([]*fragment) }}

// merge merges fragments as one ContainerEdits.Apply would apply their
// edits: a later env value replaces an earlier one in place; a later device
// node or mount of the same path replaces the earlier one and goes last;
// cgroup rules and hooks accumulate; mounts end sorted by depth (stable).
// Each list is allocated once, at its final size or just above.
func merge(frags []*fragment) *api.ContainerAdjustment {
	var nEnv, nDevices, nRules, nMounts int
	var hooks *api.Hooks
	for _, f := range frags {
		nEnv, nDevices, nRules, nMounts = nEnv+len(f.env), nDevices+len(f.devices), nRules+len(f.rules), nMounts+len(f.mounts)
		if f.hooks != nil && hooks == nil {
			hooks = &api.Hooks{}
		}
	}
	var seen index
	seen.init(max(nEnv, nDevices, nMounts))
	defer seen.free()

	adj := &api.ContainerAdjustment{}
	if nEnv > 0 {
		adj.Env = make([]*api.KeyValue, 0, nEnv)
		for _, f := range frags {
			for _, kv := range f.env {
				if i, ok := seen.get(kv.Key); ok {
					adj.Env[i] = kv
					continue
				}
				seen.put(kv.Key, len(adj.Env))
				adj.Env = append(adj.Env, kv)
			}
		}
	}
	if nDevices > 0 || nRules > 0 {
		adj.Linux = &api.LinuxContainerAdjustment{}
	}
	if nDevices > 0 {
		// The last node of each path wins and takes its place: walk back
		// keeping the first of each path seen, then turn the list around.
		seen.reset()
		devices := make([]*api.LinuxDevice, 0, nDevices)
		for i := len(frags) - 1; i >= 0; i-- {
			for j := len(frags[i].devices) - 1; j >= 0; j-- {
				if d := frags[i].devices[j]; seen.add(d.Path) {
					devices = append(devices, d)
				}
			}
		}
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
		seen.reset()
		type placed struct {
			m     *api.Mount
			depth int
		}
		mounts := make([]placed, 0, nMounts)
		for i := len(frags) - 1; i >= 0; i-- {
			for j := len(frags[i].mounts) - 1; j >= 0; j-- {
				if m := frags[i].mounts[j]; seen.add(m.Destination) {
					mounts = append(mounts, placed{m, frags[i].depths[j]})
				}
			}
		}
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

// index finds strings seen before without allocating: the few of most
// requests in a list, more in a pooled map.
type index struct {
	keys [smallIndex]string
	pos  [smallIndex]int
	n    int
	m    map[string]int
}

// smallIndex is the number of keys up to which a list is searched.
const smallIndex = 16

var indexMaps = sync.Pool{New: func() any { return map[string]int{} }}

// init readies x for up to n keys.
func (x *index) init(n int) {
	if n > smallIndex {
		x.m = indexMaps.Get().(map[string]int)
	}
}

func (x *index) get(k string) (int, bool) {
	if x.m != nil {
		i, ok := x.m[k]
		return i, ok
	}
	if i := slices.Index(x.keys[:x.n], k); i >= 0 {
		return x.pos[i], true
	}
	return 0, false
}

// put records k at i; init made room for it.
func (x *index) put(k string, i int) {
	if x.m != nil {
		x.m[k] = i
		return
	}
	x.keys[x.n], x.pos[x.n] = k, i
	x.n++
}

// add records k and reports whether it is new.
func (x *index) add(k string) bool {
	if _, ok := x.get(k); ok {
		return false
	}
	x.put(k, 0)
	return true
}

func (x *index) reset() {
	clear(x.m)
	x.n = 0
}

// free returns the map, if any, to the pool.
func (x *index) free() {
	if x.m != nil {
		clear(x.m)
		indexMaps.Put(x.m)
		x.m = nil
	}
}

// depth is the number of parts of a path, as CDI sorts mounts by.
func depth(p string) int { return strings.Count(filepath.Clean(p), string(os.PathSeparator)) }

// expressible reports whether edits have nothing NRI cannot express.
func expressible(e *cdispec.ContainerEdits) bool {
	return !hasNonRootGID(e.AdditionalGIDs) && e.IntelRdt == nil && len(e.NetDevices) == 0 &&
		!slices.ContainsFunc(e.DeviceNodes, func(n *cdispec.DeviceNode) bool { return n != nil && !grantsReadWrite(n.Permissions) })
}
