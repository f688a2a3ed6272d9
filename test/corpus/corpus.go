// Package corpus holds CDI specs that vendors and projects publish
// (specs/, with their provenance in README.md) and installs them for
// tests: each spec as published but for its host paths, moved under a
// root the test owns, and its hooks, replaced by a recording hook.
package corpus

import (
	"embed"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
	"sigs.k8s.io/yaml"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

//go:embed specs
var files embed.FS

// Spec is one published spec.
type Spec struct {
	// File is its file name under specs/.
	File string
	// Spec is its content as published.
	Spec *cdispec.Spec
}

// Specs returns the corpus, in file name order.
func Specs() ([]Spec, error) {
	entries, err := files.ReadDir("specs")
	if err != nil {
		return nil, err
	}
	var out []Spec
	for _, e := range entries {
		data, err := files.ReadFile(path.Join("specs", e.Name()))
		if err != nil {
			return nil, err
		}
		s := &cdispec.Spec{}
		if err := yaml.UnmarshalStrict(data, s); err != nil {
			return nil, fmt.Errorf("corpus spec %s: %w", e.Name(), err)
		}
		out = append(out, Spec{File: e.Name(), Spec: s})
	}
	return out, nil
}

// Devices returns the qualified names of the spec's devices, in order.
func (s Spec) Devices() []string {
	vendor, class := parser.ParseQualifier(s.Spec.Kind)
	var out []string
	for _, d := range s.Spec.Devices {
		out = append(out, parser.QualifiedName(vendor, class, d.Name))
	}
	return out
}

// Install writes the spec into dir, as published but for host paths moved
// under root and hook paths replaced by hook, and makes under root what
// it names: device nodes (mknod, so it needs root; the spec's type and
// numbers, else those of the published path where this machine has that
// character device, else a number of its own; nodes
// under /dev/dri group-owned by video, 0660, as GPU drivers make them) and
// mount sources (empty files). It returns the spec file written.
// Published host paths are only read (stat), never written.
func (s Spec) Install(dir, root, hook string) (string, error) {
	out := &cdispec.Spec{}
	data, err := yaml.Marshal(s.Spec)
	if err != nil {
		return "", err
	}
	if err := yaml.Unmarshal(data, out); err != nil { // a deep copy
		return "", err
	}
	var edits []*cdispec.ContainerEdits
	edits = append(edits, &out.ContainerEdits)
	for i := range out.Devices {
		edits = append(edits, &out.Devices[i].ContainerEdits)
	}
	made := map[string]bool{}
	for _, e := range edits {
		for _, n := range e.DeviceNodes {
			host := n.HostPath
			if host == "" {
				host = n.Path
			}
			n.HostPath = filepath.Join(root, host)
			if !made[n.HostPath] {
				if err := makeNode(n.HostPath, host, n, len(made)); err != nil {
					return "", fmt.Errorf("%s: device node %s: %w", s.File, host, err)
				}
				made[n.HostPath] = true
			}
		}
		for _, m := range e.Mounts {
			m.HostPath = filepath.Join(root, m.HostPath)
			if err := makeFile(m.HostPath); err != nil {
				return "", fmt.Errorf("%s: mount %s: %w", s.File, m.HostPath, err)
			}
		}
		for _, h := range e.Hooks {
			h.Path = hook
		}
	}
	// A node named by its path alone now has a host path, which CDI
	// specs have had since 0.5.0: an older spec gets that version.
	minVersion, err := cdi.MinimumRequiredVersion(out)
	if err != nil {
		return "", err
	}
	if older(out.Version, minVersion) {
		out.Version = minVersion
	}
	data, err = yaml.Marshal(out)
	if err != nil {
		return "", err
	}
	file := filepath.Join(dir, strings.TrimSuffix(s.File, filepath.Ext(s.File))+".yaml")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	return file, os.WriteFile(file, data, 0o644)
}

// older reports whether version a comes before version b.
func older(a, b string) bool {
	pa, pb := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(pa) && i < len(pb); i++ {
		x, _ := strconv.Atoi(pa[i])
		y, _ := strconv.Atoi(pb[i])
		if x != y {
			return x < y
		}
	}
	return len(pa) < len(pb)
}

// localMajor is a character device major reserved for local use, for
// nodes whose spec gives no numbers.
const localMajor = 240

// makeNode makes the host node of n at host. A node the spec gives no
// numbers for takes those of the published host path where this machine
// has that device (/dev/null), else a number of its own.
func makeNode(host, published string, n *cdispec.DeviceNode, index int) error {
	if err := os.MkdirAll(filepath.Dir(host), 0o755); err != nil {
		return err
	}
	typ, major, minor := n.Type, n.Major, n.Minor
	var st unix.Stat_t
	if major == 0 && typ != "p" && unix.Stat(published, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFCHR && typ != "b" {
		typ, major, minor = "c", int64(unix.Major(uint64(st.Rdev))), int64(unix.Minor(uint64(st.Rdev))) //nolint:unconvert // Rdev's type differs between architectures
	}
	if typ == "" {
		typ = "c"
	}
	if major == 0 && typ != "p" {
		major, minor = localMajor, int64(index)
	}
	mode := uint32(0o666)
	gid := 0
	if strings.Contains(host, "/dev/dri/") {
		mode, gid = 0o660, 44 // video
	}
	if n.FileMode != nil {
		mode = uint32(n.FileMode.Perm())
	}
	kind := map[string]uint32{"c": unix.S_IFCHR, "b": unix.S_IFBLK, "p": unix.S_IFIFO}[typ]
	if kind == 0 {
		return fmt.Errorf("unknown type %q", typ)
	}
	_ = os.Remove(host)
	if err := unix.Mknod(host, kind|mode, int(unix.Mkdev(uint32(major), uint32(minor)))); err != nil {
		return err
	}
	if err := os.Chmod(host, os.FileMode(mode)); err != nil { // mknod applies the umask
		return err
	}
	return os.Chown(host, 0, gid)
}

// makeFile makes an empty file at p unless something is there.
func makeFile(p string) error {
	if _, err := os.Lstat(p); err == nil {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	return os.WriteFile(p, nil, 0o644)
}

// Kinds returns the kinds of the corpus's specs, each once.
func Kinds(specs []Spec) []string {
	var out []string
	for _, s := range specs {
		if !slices.Contains(out, s.Spec.Kind) {
			out = append(out, s.Spec.Kind)
		}
	}
	return out
}
