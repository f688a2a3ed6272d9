package harness

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// WriteBenchSpecs writes n spec files into dir for the benchmarks: the
// first (kind nvidia.com/gpu) holds 64 devices "0".."63", the others one
// device of a kind of their own. /dev/null stands in for the device nodes.
func WriteBenchSpecs(dir string, n int) error {
	var b strings.Builder
	b.WriteString("cdiVersion: \"0.6.0\"\nkind: nvidia.com/gpu\ncontainerEdits:\n  env: [NVIDIA_VISIBLE_DEVICES=void]\ndevices:\n")
	for i := 0; i < 64; i++ {
		fmt.Fprintf(&b, "  - name: \"%d\"\n    containerEdits:\n      env: [GPU_%d=1]\n      deviceNodes: [{path: /dev/nvidia%d, hostPath: /dev/null}]\n", i, i, i)
	}
	if err := os.WriteFile(filepath.Join(dir, "gpus.yaml"), []byte(b.String()), 0o644); err != nil {
		return err
	}
	for i := 1; i < n; i++ {
		spec := fmt.Sprintf("cdiVersion: \"0.6.0\"\nkind: example.com/dev%d\ndevices:\n  - name: \"0\"\n    containerEdits:\n      env: [DEV%d=1]\n      deviceNodes: [{path: /dev/x%d, hostPath: /dev/null}]\n", i, i, i)
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("other-%04d.yaml", i)), []byte(spec), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// BenchRequest returns a pod annotation value asking for n of those devices.
func BenchRequest(n int) string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprint(i)
	}
	return strings.Join(names, ",")
}
