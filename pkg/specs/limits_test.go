package specs_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// TestWhatIsRead: only .json and .yaml files are specs, both are read,
// and what is not a spec (a note, a directory named like a spec) neither
// stops the files after it nor is reported.
func TestWhatIsRead(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cdi")
	write(t, dir, "a-notes.txt", "not a spec")
	write(t, dir, "b.json", `{"cdiVersion": "0.6.0", "kind": "example.com/json", "devices": [{"name": "0", "containerEdits": {"env": ["J=1"]}}]}`)
	write(t, dir, "c.yaml", gpuSpec("A=1"))
	if err := os.Mkdir(filepath.Join(dir, "d.yaml"), 0o755); err != nil {
		t.Fatal(err)
	}
	snap, err := specs.Load([]string{dir})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := snap.Resolve([]string{"example.com/json=0", "nvidia.com/gpu=0"}); err != nil {
		t.Errorf("the JSON and YAML specs: %v", err)
	}
	if len(snap.Problems) != 0 {
		t.Errorf("problems %v for files that are no specs", snap.Problems)
	}
}

// TestConflictKeepsTheRest: a device two specs of one directory define is
// refused, but their other devices are not.
func TestConflictKeepsTheRest(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cdi")
	two := func(env string) string {
		return gpuSpec("X="+env) + "  - name: \"" + env + "\"\n    containerEdits: {env: [\"ONLY=" + env + "\"]}\n"
	}
	write(t, dir, "a.yaml", two("a"))
	write(t, dir, "b.yaml", two("b"))
	snap, err := specs.Load([]string{dir})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := snap.Resolve([]string{"nvidia.com/gpu=a", "nvidia.com/gpu=b"}); err != nil {
		t.Errorf("devices only one spec defines: %v", err)
	}
	if _, err := snap.Lookup("nvidia.com/gpu=0"); err == nil {
		t.Error("the device both define resolved")
	}
}

// TestSpecSizeLimit: a spec file of exactly 8 MiB is read; one byte more
// is refused, saying so.
func TestSpecSizeLimit(t *testing.T) {
	const limit = 8 << 20
	// The spec comes last, without a final newline: a byte short of it
	// is no spec.
	spec := strings.TrimSuffix(gpuSpec("A=1"), "\n")
	pad := func(n int) string { return "#" + strings.Repeat("x", n-len(spec)-2) + "\n" + spec }
	dir := filepath.Join(t.TempDir(), "cdi")
	write(t, dir, "gpu.yaml", pad(limit))
	snap, err := specs.Load([]string{dir})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := snap.Lookup("nvidia.com/gpu=0"); err != nil {
		t.Errorf("a spec of exactly %d bytes: %v", limit, err)
	}
	write(t, dir, "gpu.yaml", pad(limit+1))
	if snap, err = specs.Load([]string{dir}); err != nil {
		t.Fatal(err)
	}
	if errs := snap.Problems[filepath.Join(dir, "gpu.yaml")]; !strings.Contains(errors.Join(errs...).Error(), "more than 8388608") {
		t.Errorf("a spec of %d bytes: problems %v", limit+1, errs)
	}
}

// TestCandidatesOfAKind: Candidates lists the devices of one vendor and
// class, in natural order (gpu=2 before gpu=10, names without numbers by
// their bytes), not those of another class or vendor.
func TestCandidatesOfAKind(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cdi")
	dev := func(kind string, names ...string) string {
		s := "cdiVersion: \"0.6.0\"\nkind: " + kind + "\ndevices:\n"
		for _, n := range names {
			s += "  - name: \"" + n + "\"\n    containerEdits: {env: [\"X=" + n + "\"]}\n"
		}
		return s
	}
	write(t, dir, "gpu.yaml", dev("nvidia.com/gpu", "10", "2", "1a", "a", "ab", "b", "all"))
	write(t, dir, "class.yaml", dev("nvidia.com/other", "0"))
	write(t, dir, "vendor.yaml", dev("example.com/gpu", "0"))
	snap, err := specs.Load([]string{dir})
	if err != nil {
		t.Fatal(err)
	}
	// Map order differs from call to call: "all" met early or late never
	// hides the devices after it.
	for range 100 {
		var got []string
		for _, c := range snap.Candidates("nvidia.com/gpu") {
			got = append(got, strings.TrimPrefix(c.Name, "nvidia.com/gpu="))
		}
		if want := []string{"1a", "2", "10", "a", "ab", "b"}; !slices.Equal(got, want) {
			t.Fatalf("candidates %q, want %q", got, want)
		}
	}
}

// TestCloseLetsGo: a closed registry holds no file descriptor (its
// directory watch): a plugin reloading its configuration many times does
// not run out of inotify instances or descriptors.
func TestCloseLetsGo(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cdi")
	write(t, dir, "gpu.yaml", gpuSpec("A=1"))
	fds := func() int {
		entries, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Skip("no /proc/self/fd")
		}
		return len(entries)
	}
	before := fds()
	for i := 0; i < 20; i++ {
		r, err := specs.Open([]string{dir})
		if err != nil {
			t.Fatal(err)
		}
		r.Close()
	}
	if after := fds(); after > before {
		t.Errorf("%d descriptors open after 20 registries were opened and closed, %d before", after, before)
	}
}
