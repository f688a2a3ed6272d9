package specs_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	"tags.cncf.io/container-device-interface/pkg/parser"

	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// migSpec lays out a GPU with MIG on as nvidia-ctk names it: the GPU by
// index and UUID, its MIG devices by "GPU:MIG" and UUID, each the GPU's
// node and the capability nodes of its GPU instance and compute instance
// (/dev/nvidia-caps/nvidia-cap<minor>, minors as the driver's mig-minors
// table gives them: gpu0/gi7/access 66, gi7/ci0 67, gi7/ci1 68,
// gi8/access 75, gi8/ci0 76); a second GPU without MIG; a hand-written
// "all" of both GPUs' nodes and no capability node; and an "all" as
// nvidia-ctk writes it, every node of every device.
const migSpec = `cdiVersion: "0.6.0"
kind: nvidia.com/gpu
devices:
  - name: "0"
    containerEdits: {deviceNodes: [{path: /dev/nvidia0, type: c, major: 195, minor: 0}]}
  - name: GPU-0
    containerEdits: {deviceNodes: [{path: /dev/nvidia0, type: c, major: 195, minor: 0}]}
  - name: "0:0"
    containerEdits: {deviceNodes: [{path: /dev/nvidia0, type: c, major: 195, minor: 0}, {path: /dev/nvidia-caps/nvidia-cap66, type: c, major: 508, minor: 66}, {path: /dev/nvidia-caps/nvidia-cap67, type: c, major: 508, minor: 67}]}
  - name: MIG-0
    containerEdits: {deviceNodes: [{path: /dev/nvidia0, type: c, major: 195, minor: 0}, {path: /dev/nvidia-caps/nvidia-cap66, type: c, major: 508, minor: 66}, {path: /dev/nvidia-caps/nvidia-cap67, type: c, major: 508, minor: 67}]}
  - name: "0:1"
    containerEdits: {deviceNodes: [{path: /dev/nvidia0, type: c, major: 195, minor: 0}, {path: /dev/nvidia-caps/nvidia-cap66, type: c, major: 508, minor: 66}, {path: /dev/nvidia-caps/nvidia-cap68, type: c, major: 508, minor: 68}]}
  - name: "0:2"
    containerEdits: {deviceNodes: [{path: /dev/nvidia0, type: c, major: 195, minor: 0}, {path: /dev/nvidia-caps/nvidia-cap75, type: c, major: 508, minor: 75}, {path: /dev/nvidia-caps/nvidia-cap76, type: c, major: 508, minor: 76}]}
  - name: "1"
    containerEdits: {deviceNodes: [{path: /dev/nvidia1, type: c, major: 195, minor: 1}]}
  - name: all
    containerEdits: {deviceNodes: [{path: /dev/nvidia0, type: c, major: 195, minor: 0}, {path: /dev/nvidia1, type: c, major: 195, minor: 1}]}
  - name: ctk-all
    containerEdits: {deviceNodes: [{path: /dev/nvidia0, type: c, major: 195, minor: 0}, {path: /dev/nvidia1, type: c, major: 195, minor: 1}, {path: /dev/nvidia-caps/nvidia-cap66, type: c, major: 508, minor: 66}, {path: /dev/nvidia-caps/nvidia-cap67, type: c, major: 508, minor: 67}, {path: /dev/nvidia-caps/nvidia-cap68, type: c, major: 508, minor: 68}, {path: /dev/nvidia-caps/nvidia-cap75, type: c, major: 508, minor: 75}, {path: /dev/nvidia-caps/nvidia-cap76, type: c, major: 508, minor: 76}]}
  - name: env-only
    containerEdits: {env: [A=1]}
`

// capsMajor is the capability nodes' major in migSpec, as a host's
// /proc/devices would list it.
const capsMajor = 508

// footprints loads the spec files of a directory on a host whose
// capability nodes have capsMajor, and returns the footprints of their
// trusted devices, by the device part of their names.
func footprints(t *testing.T, files map[string]string) map[string]specs.Device {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		write(t, dir, name, content)
	}
	return trusted(t, dir, capsMajor)
}

// trusted loads the specs of dir on a host whose capability nodes have
// the given majors, and returns the footprints of their trusted devices,
// by the device part of their names.
func trusted(t *testing.T, dir string, majors ...int64) map[string]specs.Device {
	t.Helper()
	snap, err := specs.Load([]string{dir}, specs.WithPartMajors(func() []int64 { return majors }))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]specs.Device{}
	for _, d := range snap.Trusted() {
		_, _, name := parser.ParseDevice(d.Name)
		out[name] = d
	}
	return out
}

// TestGeometry: which devices are one piece of hardware and which share
// hardware, as the pool and the restore check judge it, on a MIG layout
// and on a published spec whose devices list one node in common.
func TestGeometry(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "test", "corpus", "specs", "intel-gaudi.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	devs := footprints(t, map[string]string{"gpu.yaml": migSpec, "gaudi.yaml": string(data)})
	if got := devs["0:0"].Parts; !slices.Equal(got, []string{"c 508:66", "c 508:67"}) {
		t.Errorf("MIG 0:0's parts %v, want its two capability nodes", got)
	}
	if got := devs["0"].Parts; got != nil {
		t.Errorf("GPU 0's parts %v, want none", got)
	}
	tests := []struct {
		a, b     string
		overlaps bool
		same     bool
	}{
		{"0", "GPU-0", true, true},
		{"0:0", "MIG-0", true, true},
		{"0", "1", false, false},
		{"0", "all", true, false},
		{"0", "0:0", true, false},                      // a GPU and its MIG device
		{"0:0", "0:2", false, false},                   // MIG devices of two GPU instances
		{"0:0", "0:1", false, false},                   // two compute instances of one GPU instance
		{"0:0", "all", true, false},                    // "all" without the MIG device's capability nodes
		{"0:2", "ctk-all", true, false},                // "all" with every node
		{"0:0", "1", false, false},                     // a MIG device and another GPU
		{"env-only", "env-only", true, true},           // one name, no nodes
		{"env-only", "0", false, false},                // no nodes: nothing in common
		{"device1", "device2", false, false},           // Gaudi: one InfiniBand node in common
		{"device1", "device1", true, true},             // and itself
		{"all", "ctk-all", true, false},                // each covers the GPUs
		{"device2-blank", "device2-blank", true, true}, // no nodes, one name
	}
	for _, tc := range tests {
		a, b := devs[tc.a], devs[tc.b]
		if a.Name == "" || b.Name == "" {
			t.Fatalf("%s or %s not loaded: %v", tc.a, tc.b, devs)
		}
		if got := a.Overlaps(b); got != tc.overlaps {
			t.Errorf("%s overlaps %s: %v, want %v", tc.a, tc.b, got, tc.overlaps)
		}
		if got := b.Overlaps(a); got != tc.overlaps {
			t.Errorf("%s overlaps %s: %v, want %v", tc.b, tc.a, got, tc.overlaps)
		}
		if got := a.Same(b); got != tc.same {
			t.Errorf("%s is the same hardware as %s: %v, want %v", tc.a, tc.b, got, tc.same)
		}
		if got := specs.OverlapsAny(a, []specs.Device{devs["env-only"], b}); got != (tc.overlaps || a.Name == devs["env-only"].Name) {
			t.Errorf("%s overlaps any of [env-only %s]: %v", tc.a, tc.b, got)
		}
	}
}

// TestAliases: the names a device's hardware goes by are its own and
// those of the trusted devices with its nodes, in numeric order; a device
// the specs do not list goes by its own name, and one of a spec that is
// not trusted goes by none.
func TestAliases(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "gpu.yaml", migSpec)
	write(t, dir, "untrusted.yaml", `cdiVersion: "0.6.0"
kind: example.com/x
devices:
  - name: gpu0
    containerEdits: {deviceNodes: [{path: /dev/nvidia0, type: c, major: 195, minor: 0}]}
`)
	chmod(t, filepath.Join(dir, "untrusted.yaml"), 0o666)
	snap := open(t, dir).Snapshot()
	devs := map[string]specs.Device{}
	for _, d := range snap.Trusted() {
		devs[d.Name] = d
	}
	for _, tc := range []struct {
		d    specs.Device
		want []string
	}{
		{devs["nvidia.com/gpu=GPU-0"], []string{"nvidia.com/gpu=0", "nvidia.com/gpu=GPU-0"}},
		{devs["nvidia.com/gpu=0:0"], []string{"nvidia.com/gpu=0:0", "nvidia.com/gpu=MIG-0"}},
		{devs["nvidia.com/gpu=1"], []string{"nvidia.com/gpu=1"}},
		{devs["nvidia.com/gpu=env-only"], []string{"nvidia.com/gpu=env-only"}},
		{specs.Device{Name: "nvidia.com/gpu=9", Nodes: []string{"c 195:0"}}, []string{"nvidia.com/gpu=0", "nvidia.com/gpu=9", "nvidia.com/gpu=GPU-0"}},
		{specs.Device{Name: "nvidia.com/gpu=9"}, []string{"nvidia.com/gpu=9"}},
	} {
		if got := snap.Aliases(tc.d); !slices.Equal(got, tc.want) {
			t.Errorf("aliases of %s: %v, want %v", tc.d.Name, got, tc.want)
		}
	}
	if n := len(snap.Trusted()); n != 10 {
		t.Errorf("%d trusted devices, want the spec's 10 (all ones too)", n)
	}
}

// TestPartsByDeviceNumbers: a MIG device's capability nodes are its parts
// by their major, wherever its spec puts them: real character devices of
// the capability major in a directory not named nvidia-caps narrow it to
// a part of its GPU, so a hand-written "all" of the GPUs' nodes overlaps
// it; nodes in a directory named nvidia-caps of another major are not
// parts, whatever the directory says; and no major, no parts.
func TestPartsByDeviceNumbers(t *testing.T) {
	nodes := t.TempDir()
	for path, dev := range map[string][2]uint32{
		"gpus/nvidia0": {195, 0}, "gpus/nvidia1": {195, 1},
		"elsewhere/gi1": {capsMajor, 66}, "elsewhere/gi1-ci0": {capsMajor, 67}, "elsewhere/gi1-ci1": {capsMajor, 68},
		"nvidia-caps/other": {240, 3},
	} {
		mknod(t, filepath.Join(nodes, path), dev)
	}
	node := func(path, host string) string {
		return fmt.Sprintf("{path: %s, hostPath: %s}", path, filepath.Join(nodes, host))
	}
	gpu0 := node("/dev/nvidia0", "gpus/nvidia0")
	spec := `cdiVersion: "0.6.0"
kind: nvidia.com/gpu
devices:
  - name: "0:0"
    containerEdits: {deviceNodes: [` + gpu0 + `, ` + node("/dev/nvidia-caps/nvidia-cap66", "elsewhere/gi1") + `, ` + node("/dev/nvidia-caps/nvidia-cap67", "elsewhere/gi1-ci0") + `]}
  - name: "0:1"
    containerEdits: {deviceNodes: [` + gpu0 + `, ` + node("/dev/nvidia-caps/nvidia-cap66", "elsewhere/gi1") + `, ` + node("/dev/nvidia-caps/nvidia-cap68", "elsewhere/gi1-ci1") + `]}
  - name: with-other
    containerEdits: {deviceNodes: [` + gpu0 + `, ` + node("/dev/nvidia-caps/other", "nvidia-caps/other") + `]}
  - name: all
    containerEdits: {deviceNodes: [` + gpu0 + `, ` + node("/dev/nvidia1", "gpus/nvidia1") + `]}
  - name: with-block
    containerEdits: {deviceNodes: [` + gpu0 + `, {path: /dev/blk, type: b, major: ` + fmt.Sprint(capsMajor) + `, minor: 1}]}
`
	dir := t.TempDir()
	write(t, dir, "gpu.yaml", spec)
	caps := fmt.Sprintf("c %d:", capsMajor)
	tests := []struct {
		name             string
		majors           []int64
		parts            []string // of 0:0
		otherParts       []string // of with-other
		migAll, otherAll bool     // 0:0 and all overlap; with-other and all
		siblings         bool     // 0:0 and 0:1 overlap
	}{
		{"capability major", []int64{capsMajor}, []string{caps + "66", caps + "67"}, nil, true, false, false},
		{"the other node's major", []int64{240}, nil, []string{"c 240:3"}, false, true, false},
		{"no major", nil, nil, nil, false, false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			devs := trusted(t, dir, tc.majors...)
			if got := devs["0:0"].Parts; !slices.Equal(got, tc.parts) {
				t.Errorf("0:0's parts %v, want %v", got, tc.parts)
			}
			if got := devs["with-block"].Parts; got != nil {
				t.Errorf("with-block's parts %v: a block device of the capability major is no capability node", got)
			}
			if got := devs["with-other"].Parts; !slices.Equal(got, tc.otherParts) {
				t.Errorf("with-other's parts %v, want %v", got, tc.otherParts)
			}
			if got := devs["0:0"].Overlaps(devs["all"]); got != tc.migAll {
				t.Errorf("0:0 overlaps a hand-written all: %v, want %v", got, tc.migAll)
			}
			if got := devs["with-other"].Overlaps(devs["all"]); got != tc.otherAll {
				t.Errorf("with-other overlaps a hand-written all: %v, want %v", got, tc.otherAll)
			}
			if got := devs["0:0"].Overlaps(devs["0:1"]); got != tc.siblings {
				t.Errorf("two compute instances of one GPU instance overlap: %v, want %v", got, tc.siblings)
			}
		})
	}
}

// TestNVIDIACaps: the capability major is the host's, as /proc/devices
// lists it, and none where the driver has not registered it.
func TestNVIDIACaps(t *testing.T) {
	data, err := os.ReadFile("/proc/devices")
	if err != nil {
		t.Skip("no /proc/devices:", err)
	}
	var want []int64
	for _, line := range strings.Split(string(data), "\n") {
		var major int64
		var name string
		if n, _ := fmt.Sscanf(strings.TrimSpace(line), "%d %s", &major, &name); n == 2 && name == "nvidia-caps" {
			want = append(want, major)
		}
	}
	if got := specs.NVIDIACaps(); !slices.Equal(got, want) {
		t.Errorf("NVIDIACaps() = %v, want %v (this host's /proc/devices)", got, want)
	}
}

func mknod(t *testing.T, path string, dev [2]uint32) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(path, unix.S_IFCHR|0o600, int(unix.Mkdev(dev[0], dev[1]))); err != nil {
		t.Fatal(err)
	}
}
