package nvidia

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"sigs.k8s.io/yaml"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// marshal renders a spec as "yaml" or "json".
func marshal(spec *cdispec.Spec, format string) ([]byte, error) {
	switch format {
	case "yaml":
		return yaml.Marshal(spec)
	case "json":
		data, err := json.MarshalIndent(spec, "", "  ")
		return append(data, '\n'), err
	}
	return nil, fmt.Errorf("format %q is neither yaml nor json", format)
}

// Update writes a spec to path as Write does unless the file there
// already holds exactly it; it says whether it wrote.
func Update(spec *cdispec.Spec, path, format string) (bool, error) {
	data, err := marshal(spec, format)
	if err != nil {
		return false, err
	}
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		return false, nil
	}
	return true, Write(spec, path, format, nil)
}

// Write validates a spec with the CDI library and writes it to path
// atomically (a temp file in the same directory, then a rename), or to w
// when path is "-". Nothing is written unless the spec is valid.
func Write(spec *cdispec.Spec, path, format string, w io.Writer) error {
	data, err := marshal(spec, format)
	if err != nil {
		return err
	}
	dir := filepath.Dir(path)
	if path == "-" {
		dir = ""
	}
	tmp, err := os.CreateTemp(dir, ".nri-gpu-spec-*."+format)
	if err != nil {
		return fmt.Errorf("writing the spec: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("writing the spec: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("writing the spec: %w", err)
	}
	// CDI reads only .yaml and .json files, and validates as it reads.
	if _, err := cdi.ReadSpec(tmp.Name(), 0); err != nil {
		return fmt.Errorf("the generated spec is not valid: %w", err)
	}
	if path == "-" {
		_, err := w.Write(data)
		return err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return fmt.Errorf("writing the spec: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("writing the spec: %w", err)
	}
	return nil
}

// Refresh discovers the GPUs and the driver's files through lib and
// writes their spec (Generate, with opts) to path as YAML, making its
// directory, unless the file holds exactly it already; edit, when set,
// rewrites the spec, or refuses it, before it is written. It returns
// what the spec is of (Describe: driver, GPUs, control nodes, files) and
// whether it wrote.
func Refresh(lib nvml.Interface, path string, opts Options, edit func(*cdispec.Spec) error) (string, bool, error) {
	inv, err := Discover(lib)
	if err != nil {
		return "", false, err
	}
	spec, err := Generate(lib, opts)
	if err != nil {
		return "", false, err
	}
	if edit != nil {
		if err := edit(spec); err != nil {
			return "", false, err
		}
	}
	what := Describe(inv, spec, opts.DriverRoot)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return "", false, err
	}
	wrote, err := Update(spec, path, "yaml")
	return what, wrote, err
}
