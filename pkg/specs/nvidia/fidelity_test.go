package nvidia_test

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
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
// 570.133.20, as Docker's documentation publishes it; a host with driver
// 575.64.03, its graphics libraries and a GPU with DRM nodes, as an
// operator published the spec toolkit 1.17.8 wrote there; the toolkit's
// own expected output of nvidia-ctk cdi generate on its test root), with
// NVML mocked to match, and checks that nri-gpu's spec has every device,
// device node, mount and hook of the real one. What nri-gpu's has beyond it comes
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
		{file: "nvidia-ctk-host-575.yaml", kind: "nvidia.com/gpu", driver: "575.64.03",
			uuid: "GPU-520e01f2-cf30-6396-abef-e8e9a5233b0e", strategies: []string{nvidia.NameIndex, nvidia.NameUUID}},
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

	// The DRM nodes of a GPU whose driver exposes them, as the published
	// spec names them: nodes under /dev/dri, their by-path links, the
	// GPU's PCI address in NVML and sysfs's drm directory for that
	// address, which nvcdi reads from the host's /sys.
	drm := drmNodes(pub)
	busID := ""
	if len(drm) > 0 {
		busID = layOutDRM(t, root, pub, drm)
		gpu := s.Devices[0].(*dgxa100.Device)
		gpu.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
			var info nvml.PciInfo
			for i, c := range "0000" + busID { // NVML's form: a 32-bit domain
				info.BusId[i] = int8(c)
			}
			return info, nvml.SUCCESS
		}
	}
	var got *cdispec.Spec
	withPCIDevices(t, busID, drm, func() error {
		got, err = nvidia.Generate(s, nvidia.Options{DriverRoot: root, HookPath: "/usr/bin/nvidia-cdi-hook", Kind: kind, NameStrategies: strategies})
		return err
	})
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
	// Each device's own hooks (the DRM by-path links), but for the chmod
	// hook of /dev/dri, which toolkit 1.18 turned off by default (a
	// deprecated workaround for runtimes that made /dev/dri 0700).
	for _, d := range pub.Devices {
		i := slices.IndexFunc(got.Devices, func(g cdispec.Device) bool { return g.Name == d.Name })
		if i < 0 {
			continue
		}
		for _, h := range d.ContainerEdits.Hooks {
			if len(h.Args) > 1 && h.Args[1] == "chmod" {
				continue
			}
			// nvcdi writes a by-path link at its path under the dev root
			// (here the test's root; "/" on a node whose /dev holds the
			// GPU's nodes), so that root is taken off before comparing.
			sameLinks := func(g *cdispec.Hook) bool {
				var args []string
				for _, a := range g.Args {
					args = append(args, strings.Replace(a, "::"+root+"/", "::/", 1))
				}
				return slices.Equal(args, h.Args)
			}
			if !slices.ContainsFunc(got.Devices[i].ContainerEdits.Hooks, sameLinks) {
				t.Errorf("device %s: hook %v of the published spec missing from %v", d.Name, h.Args, hookList(got.Devices[i].ContainerEdits.Hooks))
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

// drmNodes returns the /dev/dri nodes the spec's devices name, each once.
func drmNodes(s *cdispec.Spec) []string {
	var out []string
	for _, e := range edits(s) {
		for _, n := range e.DeviceNodes {
			if strings.HasPrefix(n.Path, "/dev/dri/") && !slices.Contains(out, n.Path) {
				out = append(out, n.Path)
			}
		}
	}
	return out
}

// layOutDRM makes, under root, the DRM nodes (226, DRM's major) and the
// by-path links the spec's hooks name. It returns the PCI address of
// those links.
func layOutDRM(t *testing.T, root string, pub *cdispec.Spec, nodes []string) string {
	t.Helper()
	for i, n := range nodes {
		full := filepath.Join(root, n)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mknod(full, unix.S_IFCHR|0o660, int(unix.Mkdev(226, uint32(i)))); err != nil {
			t.Fatal(err)
		}
	}
	busID := ""
	for _, e := range edits(pub) {
		for _, h := range e.Hooks {
			for _, a := range h.Args {
				target, link, ok := strings.Cut(a, "::")
				if !ok || !strings.HasPrefix(link, "/dev/dri/by-path/pci-") {
					continue
				}
				full := filepath.Join(root, link)
				if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
					t.Fatal(err)
				}
				if _, err := os.Lstat(full); err != nil {
					if err := os.Symlink(target, full); err != nil {
						t.Fatal(err)
					}
				}
				name := strings.TrimPrefix(filepath.Base(link), "pci-")
				busID = name[:strings.LastIndex(name, "-")]
			}
		}
	}
	if busID == "" {
		t.Fatal("the spec names DRM nodes but no by-path link giving their PCI address")
	}
	return busID
}

// withPCIDevices runs f with /sys/bus/pci/devices holding, for busID, a
// drm directory with the given nodes (nvcdi finds a GPU's DRM nodes
// there): on an OS thread of its own, in a mount namespace of its own
// where that directory is a tmpfs, so the host's sysfs is neither read
// nor changed. The thread is never unlocked, so it ends with f. With no
// busID, f runs as it is.
func withPCIDevices(t *testing.T, busID string, nodes []string, f func() error) {
	t.Helper()
	if busID == "" {
		if err := f(); err != nil {
			t.Fatal(err)
		}
		return
	}
	done := make(chan error)
	go func() {
		runtime.LockOSThread()
		done <- func() error {
			if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
				return fmt.Errorf("a mount namespace: %w", err)
			}
			if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
				return err
			}
			sys := "/sys/bus/pci/devices"
			if err := unix.Mount("tmpfs", sys, "tmpfs", 0, ""); err != nil {
				return fmt.Errorf("a tmpfs on %s: %w", sys, err)
			}
			for _, n := range nodes {
				if err := os.MkdirAll(filepath.Join(sys, busID, "drm", filepath.Base(n)), 0o755); err != nil {
					return err
				}
			}
			return f()
		}()
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func hookList(hooks []*cdispec.Hook) [][]string {
	var out [][]string
	for _, h := range hooks {
		out = append(out, h.Args)
	}
	return out
}
