package nvidia_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"
	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/adjust"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
	"github.com/nri-gpu/nri-gpu/pkg/specs/nvidia"
)

func TestWrite(t *testing.T) {
	s := server(2)
	spec, err := nvidia.Generate(s, nvidia.Options{DriverRoot: "testdata/minimal-root", HookPath: "/usr/bin/nvidia-cdi-hook"})
	if err != nil {
		t.Fatal(err)
	}
	for _, format := range []string{"yaml", "json"} {
		t.Run(format, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "nvidia.com-gpu."+format)
			if err := nvidia.Write(spec, path, format, nil); err != nil {
				t.Fatal(err)
			}
			entries, _ := os.ReadDir(dir)
			if len(entries) != 1 {
				t.Errorf("dir holds %v, want the spec alone (no temp files left)", entries)
			}
			if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o644 {
				t.Errorf("spec file: %v, %v; want mode 0644 (trusted by nri-gpu)", fi, err)
			}
			// What was written is the spec, as CDI reads it back.
			read, err := cdi.ReadSpec(path, 0)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(spec, read.Spec); diff != "" {
				t.Errorf("written spec (-generated +read):\n%s", diff)
			}
		})
	}

	var out bytes.Buffer
	if err := nvidia.Write(spec, "-", "yaml", &out); err != nil || !bytes.Contains(out.Bytes(), []byte("kind: nvidia.com/gpu")) {
		t.Errorf("to stdout: %v\n%s", err, out.String())
	}

	bad := *spec
	bad.Devices = append(slices.Clone(spec.Devices), cdispec.Device{Name: "bad name!", ContainerEdits: spec.Devices[0].ContainerEdits})
	path := filepath.Join(t.TempDir(), "bad.yaml")
	testutil.ErrorSays(t, nvidia.Write(&bad, path, "yaml", nil), "the generated spec is not valid")
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Error("an invalid spec was written")
	}
}

// TestUpdate: the spec is written when the file is missing or holds
// something else (another driver's spec, an edit), and left alone when it
// holds exactly the spec.
func TestUpdate(t *testing.T) {
	spec, err := nvidia.Generate(server(2), nvidia.Options{DriverRoot: "testdata/minimal-root", HookPath: "/usr/bin/nvidia-cdi-hook"})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "nvidia.com-gpu.yaml")
	for _, step := range []struct {
		name   string
		before func()
		wrote  bool
	}{
		{"missing", func() {}, true},
		{"the same", func() {}, false},
		{"edited", func() {
			if err := os.WriteFile(path, []byte("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: []\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"the same again", func() {}, false},
	} {
		step.before()
		wrote, err := nvidia.Update(spec, path, "yaml")
		if err != nil || wrote != step.wrote {
			t.Errorf("%s: wrote %v, %v; want %v", step.name, wrote, err, step.wrote)
		}
		if read, err := cdi.ReadSpec(path, 0); err != nil || !cmp.Equal(spec, read.Spec) {
			t.Errorf("%s: the file does not hold the spec: %v", step.name, err)
		}
	}
}

// TestGeneratedSpecInjects feeds a generated spec back through nri-gpu's
// own injection path: the spec registry, then the adjustment.
func TestGeneratedSpecInjects(t *testing.T) {
	s := server(2)
	root := gpuRoot(t, 2)
	spec, err := nvidia.Generate(s, nvidia.Options{DriverRoot: root, HookPath: "/usr/bin/nvidia-cdi-hook"})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := nvidia.Write(spec, filepath.Join(dir, "nvidia.com-gpu.yaml"), "yaml", nil); err != nil {
		t.Fatal(err)
	}
	reg, err := specs.Open([]string{dir})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	snap := reg.Snapshot()
	entries, err := snap.Resolve([]string{"nvidia.com/gpu=1", "nvidia.com/gpu=" + uuidOf(t, s, 0)})
	if err != nil {
		t.Fatal(err)
	}
	res, err := adjust.Build([]*cdi.Device{entries[0].Device, entries[1].Device}, snap.HostNodes, adjust.Options{})
	if err != nil {
		t.Fatal(err)
	}
	adj := res.Adjustment
	var got []string
	for _, d := range adj.GetLinux().GetDevices() {
		got = append(got, d.Path)
		if d.Type != "c" || d.Major != 195 {
			t.Errorf("device %+v, want a char device of major 195", d)
		}
	}
	if !slices.Equal(got, []string{"/dev/nvidiactl", "/dev/nvidia1", "/dev/nvidia0"}) {
		t.Errorf("devices %v", got)
	}
	if !slices.ContainsFunc(adj.GetMounts(), func(m *api.Mount) bool { return m.Destination == "/usr/lib64/libcuda.so.550.54.15" }) {
		t.Errorf("mounts %v lack libcuda", adj.GetMounts())
	}
	if !slices.ContainsFunc(adj.GetEnv(), func(kv *api.KeyValue) bool { return kv.Key == "NVIDIA_VISIBLE_DEVICES" && kv.Value == "void" }) {
		t.Errorf("env %v", adj.GetEnv())
	}
}

// gpuRoot makes a driver root with n GPUs' device nodes and nvidiactl
// (real character devices, major 195, so it needs root) and the driver
// libraries of testdata/minimal-root.
func gpuRoot(t *testing.T, n int) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("making device nodes needs root")
	}
	root := t.TempDir()
	nodes := map[string]int{"nvidiactl": 255}
	for i := 0; i < n; i++ {
		nodes[fmt.Sprintf("nvidia%d", i)] = i
	}
	if err := os.MkdirAll(filepath.Join(root, "dev"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, minor := range nodes {
		if err := unix.Mknod(filepath.Join(root, "dev", name), unix.S_IFCHR|0o666, int(unix.Mkdev(195, uint32(minor)))); err != nil {
			t.Fatal(err)
		}
	}
	for _, lib := range []string{"libcuda.so.550.54.15", "libnvidia-ml.so.550.54.15"} {
		if err := os.MkdirAll(filepath.Join(root, "usr/lib64"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, "usr/lib64", lib), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// TestRefresh: the spec of the GPUs is written where it is missing (its
// directory made), not again while it holds exactly that, and not at all
// when edit refuses it; what it is of is said.
func TestRefresh(t *testing.T) {
	s := server(2)
	opts := nvidia.Options{DriverRoot: gpuRoot(t, 2), HookPath: "/usr/bin/nvidia-cdi-hook"}
	path := filepath.Join(t.TempDir(), "cdi", "nvidia.com-gpu.yaml")
	what, wrote, err := nvidia.Refresh(s, path, opts, nil)
	if err != nil || !wrote || !strings.Contains(what, "driver 550.54.15") {
		t.Fatalf("first: %q, wrote %t, %v; want the spec written, saying its driver", what, wrote, err)
	}
	if _, wrote, err := nvidia.Refresh(s, path, opts, nil); err != nil || wrote {
		t.Errorf("again: wrote %t, %v; want the same spec left as it is", wrote, err)
	}
	edited := 0
	edit := func(spec *cdispec.Spec) error {
		edited++
		spec.ContainerEdits.Env = append(spec.ContainerEdits.Env, "EDITED=1")
		return nil
	}
	if _, wrote, err := nvidia.Refresh(s, path, opts, edit); err != nil || !wrote || edited != 1 {
		t.Errorf("edited: wrote %t, %v; want the edited spec written", wrote, err)
	}
	if data, _ := os.ReadFile(path); !strings.Contains(string(data), "EDITED=1") {
		t.Errorf("the spec written lacks the edit:\n%s", data)
	}
	refused, other := errors.New("refused"), filepath.Join(t.TempDir(), "x.yaml")
	if _, wrote, err := nvidia.Refresh(s, other, opts, func(*cdispec.Spec) error { return refused }); !errors.Is(err, refused) || wrote {
		t.Errorf("refused: wrote %t, %v; want nothing written, the refusal", wrote, err)
	}
	if _, err := os.Stat(other); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("refused, yet %s is there (%v)", other, err)
	}
}
