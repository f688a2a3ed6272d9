// Package access keeps, for each container nri-gpu gives devices, an access file
// of exactly what it was given, which the container reads at a fixed path:
// for a supervisor inside the sandbox that confines its workload (Landlock,
// seccomp) to what its devices need, and for nri-gpu access.
//
// An access file is a CDI spec (kind Kind, one device named Device) whose edits
// are what reached the container through nri-gpu, and whose annotations
// name the format's version, the CDI devices and the container. Access files
// live in a directory of the node, one file per container, under a
// directory per pod, and are bind-mounted read-only into their container.
package access

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containerd/nri/pkg/api"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nri-gpu/nri-gpu/internal/perm"
)

const (
	// Path is where a container finds its access file.
	Path = "/run/nri-gpu/access.json"
	// EnvVar names Path in the container's environment.
	EnvVar = "NRI_GPU_ACCESS"
	// Kind is the CDI kind of an access file.
	Kind = "nri-gpu.io/access"
	// Device is the name of an access file's one device, the container: a CDI
	// registry that reads the access file knows it as "nri-gpu.io/access=container".
	Device = "container"
	// FormatAnnotation holds the version of the access file's format, Format.
	FormatAnnotation = "nri-gpu.io/access-format"
	// Format is the version of the format: "v1".
	Format = "v1"
	// DevicesAnnotation lists the CDI devices whose edits the access file
	// holds, qualified names separated by commas.
	DevicesAnnotation = "nri-gpu.io/devices"
	// PodAnnotation is the container's pod, "namespace/name";
	// ContainerAnnotation its name.
	PodAnnotation       = "nri-gpu.io/pod"
	ContainerAnnotation = "nri-gpu.io/container"
	// DefaultDir is where nri-gpu keeps the access files (its --access-dir).
	DefaultDir = "/run/nri-gpu/access"
	// MaxSize bounds an access file, in bytes.
	MaxSize = 256 << 10
)

// Errors a caller may test for with errors.Is.
var (
	// ErrTooLarge is wrapped by the error for an access file over MaxSize.
	ErrTooLarge = errors.New("access file of what the container is given is too large")
	// ErrName is wrapped by the error for a pod or container ID that is
	// not a plain file name.
	ErrName = errors.New("not a plain file name")
)

// mountOptions mount an access file: read-only, and nothing in it runs or is a
// device.
var mountOptions = []string{"bind", "ro", "nosuid", "nodev", "noexec"}

// Container is the container an access file is for.
type Container struct {
	Namespace, Pod, Name string
}

// New returns the access file of what edits give c, holding the edits of
// devices (qualified names), or nil when the edits give nothing. A
// access file for no container (the zero Container) names none.
func New(c Container, devices []string, edits *cdispec.ContainerEdits) (*cdispec.Spec, error) {
	if empty(edits) {
		return nil, nil
	}
	spec := &cdispec.Spec{
		Kind:        Kind,
		Annotations: map[string]string{FormatAnnotation: Format, DevicesAnnotation: strings.Join(devices, ",")},
		Devices:     []cdispec.Device{{Name: Device, ContainerEdits: *edits}},
	}
	if c != (Container{}) {
		spec.Annotations[PodAnnotation] = c.Namespace + "/" + c.Pod
		spec.Annotations[ContainerAnnotation] = c.Name
	}
	version, err := cdispec.MinimumRequiredVersion(spec)
	if err != nil {
		return nil, err
	}
	spec.Version = version
	return spec, nil
}

// empty reports whether edits give nothing.
func empty(e *cdispec.ContainerEdits) bool {
	if e == nil || e.IntelRdt != nil {
		return e == nil
	}
	for _, n := range []int{len(e.Env), len(e.DeviceNodes), len(e.Mounts), len(e.Hooks), len(e.AdditionalGIDs), len(e.NetDevices)} {
		if n != 0 {
			return false
		}
	}
	return true
}

// Dir is the directory of the access files. A nil Dir keeps none:
// writing, removing and pruning do nothing.
type Dir struct {
	path string
}

// Open returns the access files kept in dir.
func Open(dir string) *Dir { return &Dir{path: dir} }

// file returns the path of a container's access file.
func (d *Dir) file(podID, ctrID string) (string, error) {
	for _, id := range []string{podID, ctrID} {
		if id == "" || id == "." || id == ".." || strings.ContainsAny(id, "/\x00") || strings.HasPrefix(id, ".") {
			return "", fmt.Errorf("ID %q: %w", id, ErrName)
		}
	}
	return filepath.Join(d.path, podID, ctrID+".json"), nil
}

// Write keeps spec as the access file of container ctrID of pod podID and
// adds to adj its read-only mount at Path and EnvVar. The file is
// written whole or not at all; an access file over MaxSize is refused.
func (d *Dir) Write(podID, ctrID string, spec *cdispec.Spec, adj *api.ContainerAdjustment) error {
	if d == nil {
		return nil
	}
	path, err := d.file(podID, ctrID)
	if err != nil {
		return err
	}
	data, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return err
	}
	data = append(data, '\n')
	if len(data) > MaxSize {
		return fmt.Errorf("%w: %d bytes, over %d", ErrTooLarge, len(data), MaxSize)
	}
	// Traversable, not listable: the runtime, and in a user namespace
	// the container's root, reaches the file by name.
	if err := perm.MkdirAll(filepath.Dir(path), 0o711); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+ctrID+".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // gone after the rename; removed if it failed
	_, werr := tmp.Write(data)
	if err := errors.Join(werr, tmp.Chmod(0o444), tmp.Close()); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	adj.AddMount(&api.Mount{Source: path, Destination: Path, Type: "bind", Options: slices.Clone(mountOptions)})
	adj.AddEnv(EnvVar, Path)
	return nil
}

// Remove removes the access file of container ctrID of pod podID, if any.
func (d *Dir) Remove(podID, ctrID string) error {
	if d == nil {
		return nil
	}
	path, err := d.file(podID, ctrID)
	if err != nil {
		return err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// RemovePod removes the access files of the containers of pod podID.
func (d *Dir) RemovePod(podID string) error {
	if d == nil {
		return nil
	}
	path, err := d.file(podID, "x")
	if err != nil {
		return err
	}
	return os.RemoveAll(filepath.Dir(path))
}

// Prune removes the access files of every pod but those live says are.
func (d *Dir) Prune(live func(podID string) bool) error {
	if d == nil {
		return nil
	}
	entries, err := os.ReadDir(d.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		if !live(e.Name()) {
			errs = append(errs, os.RemoveAll(filepath.Join(d.path, e.Name())))
		}
	}
	return errors.Join(errs...)
}

// Pod returns the access files of the containers of pod namespace/name, each
// read as a CDI spec, in the order of their files' names.
func (d *Dir) Pod(namespace, name string) ([]*cdi.Spec, error) {
	files, err := filepath.Glob(filepath.Join(d.path, "*", "*.json"))
	if err != nil {
		return nil, err
	}
	var (
		out  []*cdi.Spec
		errs []error
	)
	for _, f := range files {
		spec, err := Read(f)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if spec.Annotations[PodAnnotation] == namespace+"/"+name {
			out = append(out, spec)
		}
	}
	return out, errors.Join(errs...)
}

// Read reads the access file at path, as CDI reads a spec (and validates it),
// refusing one that is not an access file of this format.
func Read(path string) (*cdi.Spec, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if info.Size() > MaxSize {
		return nil, fmt.Errorf("%s: %w: %d bytes, over %d", path, ErrTooLarge, info.Size(), MaxSize)
	}
	spec, err := cdi.ReadSpec(path, 0)
	if err != nil {
		return nil, err
	}
	if spec.Kind != Kind || spec.Annotations[FormatAnnotation] != Format {
		return nil, fmt.Errorf("%s: not an access file of nri-gpu's format %s (kind %q, %s %q)",
			path, Format, spec.Kind, FormatAnnotation, spec.Annotations[FormatAnnotation])
	}
	return spec, nil
}
