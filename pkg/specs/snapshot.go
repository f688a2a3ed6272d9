package specs

import (
	"debug/elf"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// Snapshot is the state of the specs at one load. It is never modified
// once published.
type Snapshot struct {
	dirs    []string
	devices map[string]*Entry
	paths   map[*cdi.Spec]string
	// Problems are, by spec file, why it or some of its devices are not
	// used: parse and validation errors, conflicts, no trust.
	Problems map[string][]error
	// HostNodes are the host device nodes the devices name, by host path
	// (each node's hostPath, and its path), as stat'ed at load.
	HostNodes map[string]HostNode
	// Sonames are the sonames of the shared libraries that the specs
	// with hooks mount, by host path, as read at load: what a hook
	// running ldconfig would link them by (for hook-free injection).
	Sonames map[string]string
}

// Entry is a device of a snapshot.
type Entry struct {
	// Device is the device as CDI read it.
	Device *cdi.Device
	// Spec is the file its spec was read from.
	Spec string
	// Footprint is its name and own host device nodes.
	Footprint Device
	// Hooks are the hook executables its edits and its spec's inject.
	Hooks []string
	// Untrusted says why its spec is not trusted; nil when it is.
	Untrusted error
}

// HostNode is a host device node as stat'ed at load.
type HostNode struct {
	// Type is "c", "b" or "p".
	Type         string
	Major, Minor int64
	// Mode holds the permission bits.
	Mode os.FileMode
	// GID is the node's group.
	GID uint32
	// Err is why the node could not be stat'ed, or is not a device.
	Err error
}

// load reads the specs of dirs and builds a snapshot of them, the nodes
// of a major parts gives their devices' parts.
func load(dirs []string, parts PartMajors) *Snapshot {
	l := readDirs(dirs)
	majors := parts()
	s := &Snapshot{
		dirs:      dirs,
		devices:   map[string]*Entry{},
		paths:     l.paths,
		Problems:  l.problems,
		HostNodes: map[string]HostNode{},
		Sonames:   map[string]string{},
	}
	for name, d := range l.devices {
		spec := d.GetSpec()
		if len(hooks(d)) > 0 {
			addSonames(s.Sonames, &spec.ContainerEdits, &d.ContainerEdits)
		}
		for _, edits := range []*cdispec.ContainerEdits{&spec.ContainerEdits, &d.ContainerEdits} {
			for _, n := range edits.DeviceNodes {
				// And the host's node at its container path, where runc
				// binds it from in a user namespace.
				for _, host := range []string{HostPath(n), n.Path} {
					if _, ok := s.HostNodes[host]; host != "" && !ok {
						s.HostNodes[host] = statNode(host)
					}
				}
			}
		}
		s.devices[name] = &Entry{Device: d, Spec: l.paths[spec], Footprint: footprint(d, s.HostNodes, majors), Hooks: hooks(d), Untrusted: l.untrusted[spec]}
	}
	return s
}

// SpecPath returns the file a spec of the snapshot was read from.
func (s *Snapshot) SpecPath(spec *cdi.Spec) string { return s.paths[spec] }

// problemHint says how many spec files are not used, if any, naming the
// first: an error for every name a request asks for carries it, so it
// stays short however many specs are broken (the log and nri-gpu check
// say why each is not used).
func (s *Snapshot) problemHint() string {
	switch paths := slices.Sorted(maps.Keys(s.Problems)); len(paths) {
	case 0:
		return ""
	case 1:
		// The file's path is said once: a long one would leave no room
		// for the reason in the truncated problem.
		why := strings.ReplaceAll(errors.Join(s.Problems[paths[0]]...).Error(), paths[0], "it")
		return fmt.Sprintf(" (it may be in %s, which is not used: %v)", paths[0], truncate(why))
	default:
		return fmt.Sprintf(" (it may be in one of %d spec files not used, such as %s; nri-gpu check says why)", len(paths), paths[0])
	}
}

// truncate shortens s for an error message.
func truncate(s string) string {
	const max = 256
	if len(s) <= max {
		return s
	}
	return s[:max] + "..."
}

// hooks returns the hook executables a device's edits, and its spec's,
// inject.
func hooks(d *cdi.Device) []string {
	var paths []string
	for _, h := range append(slices.Clone(d.GetSpec().ContainerEdits.Hooks), d.ContainerEdits.Hooks...) {
		if h != nil && !slices.Contains(paths, h.Path) {
			paths = append(paths, h.Path)
		}
	}
	return paths
}

// LibrarySonames returns the sonames of the shared libraries a spec
// mounts (its own edits' and its devices'), by host path, read from their
// ELF files ("" for one that has none): what ldconfig links them by.
func LibrarySonames(spec *cdispec.Spec) map[string]string {
	out := map[string]string{}
	addSonames(out, &spec.ContainerEdits)
	for i := range spec.Devices {
		addSonames(out, &spec.Devices[i].ContainerEdits)
	}
	return out
}

// addSonames adds to sonames those of the libraries edits mount that it
// lacks.
func addSonames(sonames map[string]string, edits ...*cdispec.ContainerEdits) {
	for _, e := range edits {
		for _, m := range e.Mounts {
			if m == nil || !isLibrary(m.HostPath) {
				continue
			}
			if _, ok := sonames[m.HostPath]; !ok {
				sonames[m.HostPath] = soname(m.HostPath)
			}
		}
	}
}

// isLibrary reports whether a file's name is a shared library's
// ("libcuda.so", "libcuda.so.570.86.15").
func isLibrary(p string) bool {
	base := filepath.Base(p)
	return strings.HasSuffix(base, ".so") || strings.Contains(base, ".so.")
}

// soname returns the soname of the shared library at p, or "" when it has
// none or is not one.
func soname(p string) string {
	f, err := elf.Open(p)
	if err != nil {
		return ""
	}
	defer f.Close()
	names, err := f.DynString(elf.DT_SONAME)
	if err != nil || len(names) != 1 || strings.Contains(names[0], "/") {
		return ""
	}
	return names[0]
}

// HostPath returns the host path of a device node: its hostPath, or its
// path when hostPath is empty, as CDI reads it ("" for a nil node).
func HostPath(n *cdispec.DeviceNode) string {
	if n == nil {
		return ""
	}
	if n.HostPath != "" {
		return n.HostPath
	}
	return n.Path
}

// statNode reads a host device node as CDI does (lstat: a link is not a
// device node).
func statNode(path string) HostNode {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return HostNode{Err: err}
	}
	var typ string
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFBLK:
		typ = "b"
	case unix.S_IFCHR:
		typ = "c"
	case unix.S_IFIFO:
		typ = "p"
	default:
		return HostNode{Err: errors.New("not a device node")}
	}
	rdev := uint64(st.Rdev) //nolint:unconvert // Rdev's type differs between architectures.
	return HostNode{
		Type:  typ,
		Major: int64(unix.Major(rdev)), Minor: int64(unix.Minor(rdev)),
		// The raw mode bits less the type, as CDI takes them.
		Mode: os.FileMode(st.Mode &^ unix.S_IFMT),
		GID:  st.Gid,
	}
}
