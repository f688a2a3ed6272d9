package access_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"
	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nri-gpu/nri-gpu/pkg/access"
)

var gpu0 = &cdispec.ContainerEdits{
	Env:         []string{"NVIDIA_VISIBLE_DEVICES=void"},
	DeviceNodes: []*cdispec.DeviceNode{{Path: "/dev/nvidia0", Type: "c", Major: 195, Minor: 0}},
	Mounts:      []*cdispec.Mount{{HostPath: "/usr/lib/libcuda.so.1", ContainerPath: "/usr/lib/libcuda.so.1", Options: []string{"ro", "bind"}}},
}

var ctr = access.Container{Namespace: "tenant", Pod: "a", Name: "c"}

// TestAccessFile: an access file is a CDI spec that CDI's own registry reads from
// the directory it is in, as the device nri-gpu.io/access=container,
// whose edits, applied by CDI, are what the container was given; its
// annotations name the format, the devices and the container. Edits that
// give nothing make no access file.
func TestAccessFile(t *testing.T) {
	rec, err := access.New(ctr, []string{"nvidia.com/gpu=0"}, gpu0)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	adj := &api.ContainerAdjustment{}
	if err := access.Open(dir).Write("pod1", "ctr1", rec, adj); err != nil {
		t.Fatal(err)
	}
	if len(adj.GetMounts()) != 1 || adj.GetMounts()[0].Destination != access.Path {
		t.Fatalf("mounts %v, want the access file's at %s", adj.GetMounts(), access.Path)
	}
	file := adj.GetMounts()[0].Source

	// As a supervisor would: a CDI cache over the access file's directory.
	cache, err := cdi.NewCache(cdi.WithSpecDirs(filepath.Dir(file)), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	if _, err := cache.InjectDevices(spec, access.Kind+"="+access.Device); err != nil {
		t.Fatalf("CDI injecting the access file's device: %v (errors: %v)", err, cache.GetErrors())
	}
	if !slices.Contains(spec.Process.Env, "NVIDIA_VISIBLE_DEVICES=void") || len(spec.Mounts) != 1 || len(spec.Linux.Devices) != 1 || spec.Linux.Devices[0].Major != 195 {
		t.Errorf("CDI applied the access file as %+v, %+v, %+v; want what the container was given", spec.Process.Env, spec.Mounts, spec.Linux.Devices)
	}
	got, err := access.Read(file)
	if err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]string{access.FormatAnnotation: access.Format, access.DevicesAnnotation: "nvidia.com/gpu=0",
		access.PodAnnotation: "tenant/a", access.ContainerAnnotation: "c"} {
		if got.Annotations[key] != want {
			t.Errorf("annotation %s = %q, want %q", key, got.Annotations[key], want)
		}
	}
	if got.Version != "0.6.0" { // annotations came with 0.6.0
		t.Errorf("cdiVersion %q, want the least that expresses the access file, 0.6.0", got.Version)
	}

	if rec, err := access.New(ctr, nil, &cdispec.ContainerEdits{}); rec != nil || err != nil {
		t.Errorf("edits that give nothing: %v, %v; want no access file", rec, err)
	}
}

// TestWriteRefuses: an access file over MaxSize, or a pod or container ID that
// is not a plain file name, is refused and nothing is written or mounted.
func TestWriteRefuses(t *testing.T) {
	big := &cdispec.ContainerEdits{Env: []string{"X=" + strings.Repeat("x", access.MaxSize)}}
	for _, tc := range []struct {
		name, pod, ctr string
		edits          *cdispec.ContainerEdits
		want           error
	}{
		{name: "too large", pod: "p", ctr: "c", edits: big, want: access.ErrTooLarge},
		{name: "pod ID with a slash", pod: "../p", ctr: "c", edits: gpu0, want: access.ErrName},
		{name: "container ID dot-dot", pod: "p", ctr: "..", edits: gpu0, want: access.ErrName},
		{name: "empty container ID", pod: "p", ctr: "", edits: gpu0, want: access.ErrName},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec, err := access.New(ctr, nil, tc.edits)
			if err != nil {
				t.Fatal(err)
			}
			dir := filepath.Join(t.TempDir(), "access")
			adj := &api.ContainerAdjustment{}
			err = access.Open(dir).Write(tc.pod, tc.ctr, rec, adj)
			if !errors.Is(err, tc.want) {
				t.Errorf("error %v, want %v", err, tc.want)
			}
			if len(adj.GetMounts())+len(adj.GetEnv()) > 0 {
				t.Errorf("adjusted %v, %v; want nothing", adj.GetMounts(), adj.GetEnv())
			}
			if _, err := os.Stat(dir); !os.IsNotExist(err) {
				t.Errorf("access file directory: %v, want nothing written", err)
			}
		})
	}
}

// TestLifecycle: access files go with their container, with their pod, and
// with pods no longer live; Pod finds a pod's access files by its name.
func TestLifecycle(t *testing.T) {
	dir := t.TempDir()
	d := access.Open(dir)
	write := func(pod, id, name string) {
		t.Helper()
		rec, err := access.New(access.Container{Namespace: "ns", Pod: pod, Name: name}, []string{"nvidia.com/gpu=0"}, gpu0)
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Write("id-"+pod, id, rec, &api.ContainerAdjustment{}); err != nil {
			t.Fatal(err)
		}
	}
	names := func(pod string) []string {
		t.Helper()
		recs, err := d.Pod("ns", pod)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, r := range recs {
			out = append(out, r.Annotations[access.ContainerAnnotation])
		}
		return out
	}
	write("a", "c1", "main")
	write("a", "c2", "side")
	write("b", "c3", "main")
	write("c", "c4", "main")
	if got := names("a"); !slices.Equal(got, []string{"main", "side"}) {
		t.Errorf("pod a's access files: %v, want main and side", got)
	}
	if err := d.Remove("id-a", "c2"); err != nil {
		t.Fatal(err)
	}
	if err := d.Remove("id-a", "c2"); err != nil {
		t.Errorf("removing an access file twice: %v", err)
	}
	if got := names("a"); !slices.Equal(got, []string{"main"}) {
		t.Errorf("pod a's access files after removing side: %v", got)
	}
	if err := d.RemovePod("id-b"); err != nil {
		t.Fatal(err)
	}
	if got := names("b"); len(got) > 0 {
		t.Errorf("pod b's access files after its removal: %v", got)
	}
	if err := d.Prune(func(id string) bool { return id == "id-a" }); err != nil {
		t.Fatal(err)
	}
	if a, c := names("a"), names("c"); len(a) != 1 || len(c) > 0 {
		t.Errorf("after keeping pod a alone: a %v, c %v", a, c)
	}
	if err := access.Open(filepath.Join(t.TempDir(), "none")).Prune(func(string) bool { return false }); err != nil {
		t.Errorf("keeping in a directory not made yet: %v", err)
	}
	// A file that is no access file among them: Pod says so, and still
	// returns the access files it read.
	if err := os.WriteFile(filepath.Join(dir, "id-a", "broken.json"), []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	if recs, err := d.Pod("ns", "a"); err == nil || len(recs) != 1 {
		t.Errorf("pod a's access files beside a broken file: %d, %v; want 1 and an error", len(recs), err)
	}
}

// TestReadRefuses: Read refuses a file that is no access file of this format
// (another CDI spec) and one over MaxSize.
func TestReadRefuses(t *testing.T) {
	dir := t.TempDir()
	other := filepath.Join(dir, "other.yaml")
	if err := os.WriteFile(other, []byte("cdiVersion: 0.6.0\nkind: nvidia.com/gpu\ndevices: [{name: \"0\", containerEdits: {env: [A=1]}}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := access.Read(other); err == nil || !strings.Contains(err.Error(), "not an access file of nri-gpu's format v1") {
		t.Errorf("reading another spec: %v", err)
	}
	// The right kind, another version of the format.
	v2 := filepath.Join(dir, "v2.yaml")
	if err := os.WriteFile(v2, []byte("cdiVersion: 0.6.0\nkind: nri-gpu.io/access\nannotations: {nri-gpu.io/access-format: v2}\ndevices: [{name: container, containerEdits: {env: [A=1]}}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := access.Read(v2); err == nil || !strings.Contains(err.Error(), `nri-gpu.io/access-format "v2"`) {
		t.Errorf("reading an access file of format v2: %v", err)
	}
	big := filepath.Join(dir, "big.json")
	if err := os.WriteFile(big, make([]byte, access.MaxSize+1), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := access.Read(big); !errors.Is(err, access.ErrTooLarge) {
		t.Errorf("reading a file over MaxSize: %v", err)
	}
}

// TestNewGivesAnything: edits that give any one thing make an access file;
// none, or nil, make none.
func TestNewGivesAnything(t *testing.T) {
	for _, tc := range []struct {
		name  string
		edits *cdispec.ContainerEdits
		want  bool
	}{
		{"nil", nil, false},
		{"nothing", &cdispec.ContainerEdits{Env: []string{}}, false},
		{"env", &cdispec.ContainerEdits{Env: []string{"A=1"}}, true},
		{"device node", &cdispec.ContainerEdits{DeviceNodes: gpu0.DeviceNodes}, true},
		{"mount", &cdispec.ContainerEdits{Mounts: gpu0.Mounts}, true},
		{"hook", &cdispec.ContainerEdits{Hooks: []*cdispec.Hook{{HookName: "createContainer", Path: "/bin/true"}}}, true},
		{"group", &cdispec.ContainerEdits{AdditionalGIDs: []uint32{44}}, true},
		{"net device", &cdispec.ContainerEdits{NetDevices: []*cdispec.LinuxNetDevice{{HostInterfaceName: "eth9", Name: "net0"}}}, true},
		{"RDT", &cdispec.ContainerEdits{IntelRdt: &cdispec.IntelRdt{ClosID: "gold"}}, true},
	} {
		rec, err := access.New(ctr, nil, tc.edits)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if (rec != nil) != tc.want {
			t.Errorf("%s: access file %v, want one: %v", tc.name, rec, tc.want)
		}
	}
}

// TestSizeBound: an access file of exactly MaxSize bytes is written, mounted
// and read back; one byte more is refused.
func TestSizeBound(t *testing.T) {
	sized := func(n int) *cdispec.Spec {
		t.Helper()
		rec, err := access.New(ctr, nil, &cdispec.ContainerEdits{Env: []string{"X=" + strings.Repeat("x", n)}})
		if err != nil {
			t.Fatal(err)
		}
		return rec
	}
	probe := filepath.Join(t.TempDir(), "probe")
	if err := access.Open(probe).Write("p", "c", sized(0), &api.ContainerAdjustment{}); err != nil {
		t.Fatal(err)
	}
	info, err := os.Stat(filepath.Join(probe, "p", "c.json"))
	if err != nil {
		t.Fatal(err)
	}
	pad := access.MaxSize - int(info.Size()) // each x is one byte of the file
	d := access.Open(t.TempDir())
	adj := &api.ContainerAdjustment{}
	if err := d.Write("p", "exact", sized(pad), adj); err != nil {
		t.Fatalf("an access file of exactly MaxSize: %v", err)
	}
	file := adj.GetMounts()[0].Source
	if info, err := os.Stat(file); err != nil || info.Size() != access.MaxSize {
		t.Fatalf("access file file %v, %v; want %d bytes", info, err, access.MaxSize)
	}
	if _, err := access.Read(file); err != nil {
		t.Errorf("reading an access file of exactly MaxSize: %v", err)
	}
	if err := d.Write("p", "over", sized(pad+1), &api.ContainerAdjustment{}); !errors.Is(err, access.ErrTooLarge) {
		t.Errorf("an access file one byte over MaxSize: %v, want ErrTooLarge", err)
	}
}

// TestFiles: an access file is read-only for all, in a directory others may
// pass through but not list; removing one that is not a file fails.
func TestFiles(t *testing.T) {
	rec, err := access.New(ctr, nil, gpu0)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	adj := &api.ContainerAdjustment{}
	if err := access.Open(dir).Write("p", "c", rec, adj); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]os.FileMode{adj.GetMounts()[0].Source: 0o444, filepath.Join(dir, "p"): 0o711} {
		if info, err := os.Stat(path); err != nil || info.Mode().Perm() != want {
			t.Errorf("%s: %v, %v; want mode %#o", path, info, err, want)
		}
	}
	// Something else at an access file's path: a directory with a file in it.
	if err := os.MkdirAll(filepath.Join(dir, "p", "d.json", "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := access.Open(dir).Remove("p", "d"); err == nil {
		t.Error("removing a non-empty directory at an access file's path: no error")
	}
}

// TestNoDir: where containers get no access file (no Dir), writing,
// removing and pruning do nothing and give the container nothing.
func TestNoDir(t *testing.T) {
	var d *access.Dir
	adj := &api.ContainerAdjustment{}
	if err := d.Write("pod", "ctr", &cdispec.Spec{}, adj); err != nil || len(adj.GetMounts()) > 0 || len(adj.GetEnv()) > 0 {
		t.Errorf("write: %v, mounts %v, env %v; want nothing", err, adj.GetMounts(), adj.GetEnv())
	}
	if err := errors.Join(d.Remove("pod", "ctr"), d.RemovePod("pod"), d.Prune(func(string) bool { return false })); err != nil {
		t.Errorf("remove, remove the pod's, prune: %v; want nothing done", err)
	}
}
