package adjust

import (
	"errors"
	"fmt"
	"os"
	"path"
	"runtime"
	"slices"
	"strings"

	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// ErrHook is wrapped by the error for a hook that hook-free injection
// cannot replace.
var ErrHook = errors.New("OCI hook not replaceable in hook-free mode")

// The commands of NVIDIA's CDI hook (nvidia-cdi-hook, nvidia-ctk hook,
// nri-gpu hook) that hook-free injection knows.
const (
	hookCreateSymlinks     = "create-symlinks"
	hookUpdateLdcache      = "update-ldcache"
	hookSonameSymlinks     = "create-soname-symlinks"
	hookChmod              = "chmod"
	hookCUDACompat         = "enable-cuda-compat"
	hookNoNodeModification = "disable-device-node-modification"
	hookAppProfile         = "update-application-profile"
	hookMemoryLimits       = HookMemoryLimits
)

// HookMemoryLimits is the command of NVIDIA's hook that sets the GPU
// memory limits a container asks in its environment: hook-free injection
// leaves it out, and nri-gpu sets them itself.
const HookMemoryLimits = "apply-cuda-memory-limits"

// LeftOut is a hook that hook-free injection left out, as its work
// cannot be done without it, and what the container then lacks.
type LeftOut struct {
	// Device is the qualified name of the device the hook belongs to.
	Device string
	// Hook is the hook's command ("enable-cuda-compat").
	Hook string
	// Lacks says what the container goes without.
	Lacks string
}

// leftOutLacks says, for each hook left out, what the container lacks.
var leftOutLacks = map[string]string{
	hookCUDACompat: "CUDA forward compatibility: an image's own compat libraries (/usr/local/cuda/compat) are not loaded in place of the driver's",
	hookNoNodeModification: "the driver's ModifyDeviceFiles off in /proc/driver/nvidia/params (runc refuses a plugin's mount over /proc): " +
		"a CUDA program may try to create a missing device node, which the container's device rules refuse",
	hookAppProfile: "the driver's application profile naming the container's GPUs for EGL and Vulkan (EGLVisibleDGPUDevices): " +
		"they enumerate by the device nodes the container has, which are its GPUs' alone",
	hookMemoryLimits: "the hook's GPU memory limits: those a container asks with NVIDIA_GPU_MEMORY_REQUEST and NVIDIA_GPU_MEMORY_LIMIT, which nri-gpu sets itself on the containers it serves (its plugin's StartContainer)",
}

// hookCommand returns the NVIDIA hook command a hook runs and its
// arguments after it ("nvidia-cdi-hook create-symlinks ...", "nvidia-ctk
// hook chmod ...", "nri-gpu hook update-ldcache ..."), or "" when it runs
// none of them.
func hookCommand(h *cdispec.Hook) (string, []string) {
	args := h.Args
	if len(args) > 0 {
		args = args[1:] // argv[0]
	}
	if len(args) > 0 && args[0] == "hook" {
		args = args[1:]
	}
	if len(args) == 0 {
		return "", nil
	}
	switch args[0] {
	case hookCreateSymlinks, hookUpdateLdcache, hookSonameSymlinks, hookChmod, hookCUDACompat, hookNoNodeModification, hookAppProfile, hookMemoryLimits:
		return args[0], args[1:]
	}
	return "", nil
}

// flagValues returns the values of a hook's flag ("--link a::b" and
// "--link=a::b", each time it is given).
func flagValues(args []string, flag string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		switch a := args[i]; {
		case a == "--"+flag && i+1 < len(args):
			out = append(out, args[i+1])
			i++
		case strings.HasPrefix(a, "--"+flag+"="):
			out = append(out, strings.TrimPrefix(a, "--"+flag+"="))
		}
	}
	return out
}

// withoutHooks is what hook-free injection knows of a request's edits:
// what is at each container path, to replace links with.
type withoutHooks struct {
	// mounts and nodes are the mounts and device nodes of every set, by
	// container path; links the links of every create-symlinks hook
	// (their targets made absolute), by link path.
	mounts map[string]*cdispec.Mount
	nodes  map[string]*cdispec.DeviceNode
	links  map[string]string
	// sonames are the sonames of the mounts' host files (Options.Sonames).
	sonames map[string]string
}

// newWithoutHooks indexes the edits of every set of a request.
func newWithoutHooks(sets []editSet, sonames map[string]string) *withoutHooks {
	w := &withoutHooks{mounts: map[string]*cdispec.Mount{}, nodes: map[string]*cdispec.DeviceNode{}, links: map[string]string{}, sonames: sonames}
	for _, set := range sets {
		for _, m := range set.edits.Mounts {
			if m != nil {
				w.mounts[path.Clean(m.ContainerPath)] = m
			}
		}
		for _, n := range set.edits.DeviceNodes {
			if n != nil {
				w.nodes[path.Clean(n.Path)] = n
			}
		}
		for _, h := range set.edits.Hooks {
			if cmd, args := hookCommand(h); cmd == hookCreateSymlinks {
				for _, l := range flagValues(args, "link") {
					if target, link, ok := splitLink(l); ok {
						w.links[link] = target
					}
				}
			}
		}
	}
	// A library's soname in an ldcache folder is what ldconfig links to it.
	for _, set := range sets {
		for _, h := range set.edits.Hooks {
			if cmd, args := hookCommand(h); cmd == hookUpdateLdcache || cmd == hookSonameSymlinks {
				for _, m := range w.sonameMounts(flagValues(args, "folder")) {
					if _, ok := w.links[m.ContainerPath]; !ok {
						w.mounts[m.ContainerPath] = m
					}
				}
			}
		}
	}
	return w
}

// splitLink splits a create-symlinks link "target::link", its target made
// absolute (relative to the link's directory).
func splitLink(l string) (target, link string, ok bool) {
	target, link, ok = strings.Cut(l, "::")
	if !ok || target == "" || !path.IsAbs(link) {
		return "", "", false
	}
	link = path.Clean(link)
	if !path.IsAbs(target) {
		target = path.Join(path.Dir(link), target)
	}
	return path.Clean(target), link, true
}

// maxLinkDepth bounds how many links a link's target is followed through.
const maxLinkDepth = 8

// resolve returns the mount or device node that container path p is, or
// is a link to (through other links), or neither.
func (w *withoutHooks) resolve(p string) (*cdispec.Mount, *cdispec.DeviceNode) {
	for range maxLinkDepth {
		if m := w.mounts[p]; m != nil {
			return m, nil
		}
		if n := w.nodes[p]; n != nil {
			return nil, n
		}
		next, ok := w.links[p]
		if !ok {
			return nil, nil
		}
		p = next
	}
	return nil, nil
}

// sonameMounts returns, for each mount of a library in one of folders
// that has a soname, the same library mounted at its soname: in that
// folder (the link ldconfig would make, unless the file is named so), and,
// for a folder of the machine's own libraries, in the directories every
// family of images' dynamic loader searches without a cache entry
// (loaderDirs), so that it is found by soname whatever the image.
func (w *withoutHooks) sonameMounts(folders []string) []*cdispec.Mount {
	var out []*cdispec.Mount
	for _, cp := range sortedKeys(w.mounts) {
		m := w.mounts[cp]
		soname := w.sonames[m.HostPath]
		dir := path.Dir(cp)
		if soname == "" || !slices.ContainsFunc(folders, func(f string) bool { return path.Clean(f) == dir }) {
			continue
		}
		for _, d := range append([]string{dir}, loaderDirs(dir)...) {
			if at := path.Join(d, soname); at != cp && !slices.ContainsFunc(out, func(o *cdispec.Mount) bool { return o.ContainerPath == at }) {
				out = append(out, &cdispec.Mount{HostPath: m.HostPath, ContainerPath: at, Type: m.Type, Options: slices.Clone(m.Options)})
			}
		}
	}
	return out
}

// multiarch are the Debian multiarch triplets of the 64-bit machines, by
// Go's name for them.
var multiarch = map[string]string{"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu", "ppc64le": "powerpc64le-linux-gnu", "s390x": "s390x-linux-gnu"}

// loaderDirs returns where an image's dynamic loader looks for a library
// that its ld.so.cache does not list, other than dir, when dir holds the
// machine's own (64-bit) libraries: the system directories of glibc on
// Debian and Ubuntu (/usr/lib/<triplet>, and /usr/lib), of glibc on RHEL,
// Fedora, SUSE and Amazon Linux (/usr/lib64), and musl's default path on
// Alpine (/usr/lib). /lib, /lib64 and /lib/<triplet> are links to them on
// every merged-/usr image, and the loaders search both. None for any other
// directory (a 32-bit one, a subdirectory such as vdpau).
func loaderDirs(dir string) []string {
	triplet := multiarch[runtime.GOARCH]
	own := []string{"/usr/lib/" + triplet, "/lib/" + triplet, "/usr/lib64", "/lib64"}
	if triplet == "" || !slices.Contains(own, dir) {
		return nil
	}
	return slices.DeleteFunc([]string{"/usr/lib/" + triplet, "/usr/lib64", "/usr/lib"}, func(d string) bool { return d == dir })
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// replace returns a set's edits with its hooks replaced by edits the
// runtime applies: each link of create-symlinks by what it links to (a
// mount of the same host file at the link's path, or the same device
// node there), update-ldcache's and create-soname-symlinks' soname links
// by mounts at the sonames, chmod of a device node by its mode, chmod 755
// of a directory left out (runc makes a device node's directories 755).
// enable-cuda-compat, disable-device-node-modification,
// update-application-profile and apply-cuda-memory-limits are left out,
// as is a link to nothing the request gives (it would dangle), recorded
// in res.LeftOut. Any other hook is an error naming it.
func (w *withoutHooks) replace(set editSet, res *Result) (*cdispec.ContainerEdits, error) {
	e := *set.edits
	e.Hooks = nil
	e.Mounts = slices.Clone(e.Mounts)
	e.DeviceNodes = slices.Clone(e.DeviceNodes)
	var errs []error
	for _, h := range set.edits.Hooks {
		if h == nil {
			continue
		}
		cmd, args := hookCommand(h)
		switch cmd {
		case hookCreateSymlinks:
			for _, l := range flagValues(args, "link") {
				target, link, ok := splitLink(l)
				if !ok {
					errs = append(errs, fmt.Errorf("%s: %w: %s link %q is not target::/absolute/link", set.where(), ErrHook, cmd, l))
					continue
				}
				switch m, n := w.resolve(target); {
				case m != nil:
					e.Mounts = append(e.Mounts, &cdispec.Mount{HostPath: m.HostPath, ContainerPath: link, Type: m.Type, Options: slices.Clone(m.Options)})
				case n != nil:
					alias := *n
					alias.Path, alias.HostPath = link, specs.HostPath(n)
					e.DeviceNodes = append(e.DeviceNodes, &alias)
				default:
					// The hook would make a dangling link.
					res.LeftOut = append(res.LeftOut, LeftOut{Device: set.device, Hook: cmd, Lacks: fmt.Sprintf("the link %s to %s, which the container is not given", link, target)})
				}
			}
		case hookUpdateLdcache, hookSonameSymlinks:
			e.Mounts = append(e.Mounts, w.sonameMounts(flagValues(args, "folder"))...)
		case hookChmod:
			if err := w.chmod(&e, args); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w: %s: %w", set.where(), ErrHook, cmd, err))
			}
		case hookCUDACompat, hookNoNodeModification, hookAppProfile, hookMemoryLimits:
			res.LeftOut = append(res.LeftOut, LeftOut{Device: set.device, Hook: cmd, Lacks: leftOutLacks[cmd]})
		default:
			errs = append(errs, fmt.Errorf("%s: %w: %s %s is not one of NVIDIA's hook commands nri-gpu replaces; hookFree refuses every other hook",
				set.where(), ErrHook, h.Path, strings.Join(h.Args, " ")))
		}
	}
	return &e, errors.Join(errs...)
}

// WithoutHooks rewrites a spec so that it has no hook, as hook-free
// injection would give its devices: the spec's own edits and each
// device's, their hooks replaced by mounts and device nodes (replace),
// each device's links resolved among its edits and the spec's. sonames
// are its libraries' (specs.LibrarySonames). It returns the hooks left
// out, and fails, changing nothing, on a hook it cannot replace.
func WithoutHooks(spec *cdispec.Spec, sonames map[string]string) ([]LeftOut, error) {
	res := &Result{}
	specSet := editSet{edits: &spec.ContainerEdits, device: spec.Kind, spec: "spec"}
	all := []editSet{specSet}
	for i := range spec.Devices {
		all = append(all, editSet{edits: &spec.Devices[i].ContainerEdits, device: spec.Kind + "=" + spec.Devices[i].Name})
	}
	var (
		errs    []error
		replace []*cdispec.ContainerEdits
	)
	for i, set := range all {
		index := all // the spec's own links may name any device's files
		if i > 0 {
			index = []editSet{specSet, set}
		}
		e, err := newWithoutHooks(index, sonames).replace(set, res)
		errs = append(errs, err)
		replace = append(replace, e)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	spec.ContainerEdits = *replace[0]
	for i := range spec.Devices {
		spec.Devices[i].ContainerEdits = *replace[i+1]
	}
	return res.LeftOut, nil
}

// hooksByRuntime refuses, in hook-free mode, a device the runtime's own
// CDI injected with hooks: they reach the container, and nri-gpu cannot
// take them out.
func hooksByRuntime(opts Options) error {
	var errs []error
	for _, set := range inOrder(opts.Injected, nil, opts.SpecPath) {
		if len(set.edits.Hooks) > 0 {
			errs = append(errs, fmt.Errorf("%s: %w: the runtime's own CDI injected it, with its %d hooks, which nri-gpu cannot take out; have nri-gpu inject it (the door's cdiDevices: nri-gpu, or the runtime's CDI off)",
				set.where(), ErrHook, len(set.edits.Hooks)))
		}
	}
	return errors.Join(errs...)
}

// chmod gives a chmod hook's mode to the device nodes it names; a
// directory made 755 is what runc makes a device node's directory.
func (w *withoutHooks) chmod(e *cdispec.ContainerEdits, args []string) error {
	modes := flagValues(args, "mode")
	if len(modes) != 1 {
		return fmt.Errorf("want one --mode, have %d", len(modes))
	}
	var mode uint32
	if _, err := fmt.Sscanf(modes[0], "%o", &mode); err != nil || mode > 0o777 {
		return fmt.Errorf("mode %q is not an octal permission", modes[0])
	}
	var errs []error
	for _, p := range flagValues(args, "path") {
		p = path.Clean(p)
		i := slices.IndexFunc(e.DeviceNodes, func(n *cdispec.DeviceNode) bool { return n != nil && path.Clean(n.Path) == p })
		switch {
		case i >= 0:
			n := *e.DeviceNodes[i]
			fm := os.FileMode(mode)
			n.FileMode = &fm
			e.DeviceNodes[i] = &n
		case mode == 0o755 && w.holdsNodes(p):
		default:
			errs = append(errs, fmt.Errorf("path %q (mode %s) is neither a device node of the device nor a directory of device nodes made 755", p, modes[0]))
		}
	}
	return errors.Join(errs...)
}

// holdsNodes reports whether some device node of the request lies under
// directory dir.
func (w *withoutHooks) holdsNodes(dir string) bool {
	for p := range w.nodes {
		if strings.HasPrefix(p, dir+"/") {
			return true
		}
	}
	return false
}
