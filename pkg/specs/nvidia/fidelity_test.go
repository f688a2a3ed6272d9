package nvidia_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/yaml"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nri-gpu/nri-gpu/pkg/specs/nvidia"
)

// TestFidelity generates the spec of a host laid out as a published
// nvidia-ctk spec describes it (from test/corpus: a Tesla T4 with driver
// 570.133.20, as Docker's documentation publishes it; the toolkit's own
// expected output of nvidia-ctk cdi generate on its test root), with NVML
// mocked to match, and checks that nri-gpu's spec has every device, device
// node, mount and hook of the real one. What nri-gpu's has beyond it comes
// from the toolkit version nri-gpu builds on (v1.20) being newer than the
// one that wrote the published spec, and is listed below.
func TestFidelity(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("making device nodes needs root")
	}
	tests := []struct {
		file, kind, driver, uuid string
		strategies               []string
	}{
		{file: "nvidia-ctk-tesla-t4.yaml", kind: "nvidia.com/gpu", driver: "570.133.20",
			uuid: "GPU-6cf00fa7-59ac-16f2-3e83-d24ccdc56f84", strategies: []string{nvidia.NameIndex, nvidia.NameUUID}},
		{file: "nvidia-ctk-generate.yaml", kind: "example.com/device", driver: "999.88.77", strategies: []string{nvidia.NameIndex}},
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			fidelity(t, tc.file, tc.kind, tc.driver, tc.uuid, tc.strategies)
		})
	}
}

func fidelity(t *testing.T, file, kind, driver, uuid string, strategies []string) {
	data, err := os.ReadFile(filepath.Join("../../../test/corpus/specs", file))
	if err != nil {
		t.Fatal(err)
	}
	pub := &cdispec.Spec{}
	if err := yaml.UnmarshalStrict(data, pub); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	// Every node the spec names, as a character device: NVIDIA's major for
	// the GPU and nvidiactl/modeset, another for the UVM nodes.
	numbers := map[string][2]uint32{
		"/dev/nvidia0": {195, 0}, "/dev/nvidiactl": {195, 255}, "/dev/nvidia-modeset": {195, 254},
		"/dev/nvidia-uvm": {511, 0}, "/dev/nvidia-uvm-tools": {511, 1},
	}
	named := map[string]bool{}
	for _, e := range append([]cdispec.ContainerEdits{pub.ContainerEdits}, edits(pub)...) {
		for _, n := range e.DeviceNodes {
			named[n.Path] = true
		}
	}
	for path, n := range numbers {
		if !named[path] {
			continue
		}
		full := filepath.Join(root, path)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mknod(full, unix.S_IFCHR|0o666, int(unix.Mkdev(n[0], n[1]))); err != nil {
			t.Fatal(err)
		}
	}
	// Every file it mounts; the utilities executable.
	for _, m := range pub.ContainerEdits.Mounts {
		full := filepath.Join(root, m.HostPath)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		mode := os.FileMode(0o644)
		if strings.HasPrefix(m.HostPath, "/usr/bin/") {
			mode = 0o755
		}
		if err := os.WriteFile(full, nil, mode); err != nil {
			t.Fatal(err)
		}
	}
	s := server(1)
	s.SystemGetDriverVersionFunc = func() (string, nvml.Return) { return driver, nvml.SUCCESS }
	if uuid != "" {
		gpu := s.Devices[0].(*dgxa100.Device)
		gpu.UUID = uuid // the published GPU's
		gpu.GetUUIDFunc = func() (string, nvml.Return) { return gpu.UUID, nvml.SUCCESS }
	}

	got, err := nvidia.Generate(s, nvidia.Options{DriverRoot: root, HookPath: "/usr/bin/nvidia-cdi-hook", Kind: kind, NameStrategies: strategies})
	if err != nil {
		t.Fatal(err)
	}
	strip := func(p string) string { return strings.TrimPrefix(p, root) }

	if want, have := deviceNames(pub), deviceNames(got); !slices.Equal(slices.Sorted(slices.Values(want)), have) {
		t.Errorf("devices %v, the published spec's %v", have, want)
	}
	nodes := func(e cdispec.ContainerEdits) []string {
		var out []string
		for _, n := range e.DeviceNodes {
			out = append(out, n.Path)
		}
		return out
	}
	for _, n := range nodes(pub.ContainerEdits) {
		if !slices.Contains(nodes(got.ContainerEdits), n) {
			t.Errorf("shared device node %s of the published spec missing: %v", n, nodes(got.ContainerEdits))
		}
	}
	for _, d := range pub.Devices {
		i := slices.IndexFunc(got.Devices, func(g cdispec.Device) bool { return g.Name == d.Name })
		if i < 0 {
			continue
		}
		for _, n := range nodes(d.ContainerEdits) {
			if !slices.Contains(nodes(got.Devices[i].ContainerEdits), n) {
				t.Errorf("device %s: node %s of the published spec missing", d.Name, n)
			}
		}
	}
	var mounts []string
	for _, m := range got.ContainerEdits.Mounts {
		mounts = append(mounts, m.ContainerPath+" from "+strip(m.HostPath))
	}
	for _, m := range pub.ContainerEdits.Mounts {
		if want := m.ContainerPath + " from " + m.HostPath; !slices.Contains(mounts, want) {
			t.Errorf("mount %s of the published spec missing", want)
		}
	}
	var hooks []string
	for _, h := range got.ContainerEdits.Hooks {
		hooks = append(hooks, fmt.Sprint(h.HookName, h.Path, h.Args))
	}
	for _, h := range pub.ContainerEdits.Hooks {
		if want := fmt.Sprint(h.HookName, h.Path, h.Args); !slices.Contains(hooks, want) {
			t.Errorf("hook %s of the published spec missing from %v", want, hooks)
		}
	}
	// Differences allowed, each the newer toolkit's (or its test root's):
	// mount options rbind
	// and rprivate where the older wrote bind, an env of its own for every
	// hook, the disable-device-node-modification, update-application-
	// profile and (per GPU) apply-cuda-memory-limits hooks, the void mount
	// of NVIDIA_VISIBLE_DEVICES and NVIDIA_CTK_LIBCUDA_DIR. Nothing else.
	allowedHooks := []string{"disable-device-node-modification", "update-application-profile"}
	for _, h := range got.ContainerEdits.Hooks {
		if !slices.ContainsFunc(pub.ContainerEdits.Hooks, func(p *cdispec.Hook) bool { return slices.Equal(p.Args, h.Args) }) &&
			(len(h.Args) < 2 || !slices.Contains(allowedHooks, h.Args[1])) {
			t.Errorf("hook %v beyond the published spec's", h.Args)
		}
	}
	for _, m := range got.ContainerEdits.Mounts {
		if !slices.ContainsFunc(pub.ContainerEdits.Mounts, func(p *cdispec.Mount) bool { return p.ContainerPath == m.ContainerPath }) &&
			m.ContainerPath != "/var/run/nvidia-container-devices/void" {
			t.Errorf("mount %s beyond the published spec's", m.ContainerPath)
		}
	}
}

// edits returns the edits of a spec's devices.
func edits(s *cdispec.Spec) []cdispec.ContainerEdits {
	var out []cdispec.ContainerEdits
	for _, d := range s.Devices {
		out = append(out, d.ContainerEdits)
	}
	return out
}
