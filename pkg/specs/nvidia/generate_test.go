package nvidia_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"golang.org/x/sys/unix"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/specs/nvidia"
)

// server returns a DGX A100 mock cut to n GPUs.
func server(n int) *dgxa100.Server { return testutil.NVML(n) }

// withMIG turns MIG on for GPU 0 of s and gives it two MIG devices, on
// GPU instances 1 and 2 (compute instance 0 each), as the mig-minors file
// of testdata/driver-root lists them. It returns their UUIDs.
func withMIG(s *dgxa100.Server) []string {
	uuids := []string{"MIG-a0a0a0a0-0000-4000-8000-000000000001", "MIG-a0a0a0a0-0000-4000-8000-000000000002"}
	testutil.WithMIGs(s, 0, testutil.MIG{UUID: uuids[0], GI: 1}, testutil.MIG{UUID: uuids[1], GI: 2})
	return uuids
}

func uuidOf(t *testing.T, s *dgxa100.Server, i int) string {
	t.Helper()
	u, ret := s.Devices[i].GetUUID()
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	return u
}

func deviceNames(s *cdispec.Spec) []string {
	var names []string
	for _, d := range s.Devices {
		names = append(names, d.Name)
	}
	return names
}

func mountPaths(s *cdispec.Spec) []string {
	var paths []string
	for _, m := range s.ContainerEdits.Mounts {
		paths = append(paths, m.ContainerPath)
	}
	return paths
}

func hookArgs(s *cdispec.Spec) [][]string {
	var out [][]string
	for _, h := range s.ContainerEdits.Hooks {
		out = append(out, h.Args)
	}
	return out
}

func TestGenerate(t *testing.T) {
	s := server(2)
	u0, u1 := uuidOf(t, s, 0), uuidOf(t, s, 1)
	root, err := filepath.Abs("testdata/minimal-root")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		opts       nvidia.Options
		wantNames  []string
		wantMounts []string
		wantHooks  [][]string // hooks the spec must have, by their args
		wantErr    []string
	}{
		{
			name:       "index and UUID names, all, the driver's libraries and the hooks that make them load, nri-gpu as the hook",
			opts:       nvidia.Options{DriverRoot: root, HookPath: "/usr/local/bin/nri-gpu"},
			wantNames:  []string{"0", "1", u0, u1, "all"},
			wantMounts: []string{"/usr/lib64/libcuda.so.550.54.15", "/usr/lib64/libnvidia-ml.so.550.54.15"},
			wantHooks: [][]string{
				{"nri-gpu", "create-symlinks", "--link", "libcuda.so.1::/usr/lib64/libcuda.so"},
				{"nri-gpu", "update-ldcache", "--folder", "/usr/lib64"},
			},
		},
		{
			name:      "UUID names only",
			opts:      nvidia.Options{DriverRoot: root, HookPath: "/usr/bin/nvidia-cdi-hook", NameStrategies: []string{nvidia.NameUUID}},
			wantNames: []string{u0, u1, "all"},
			wantHooks: [][]string{{"nvidia-cdi-hook", "update-ldcache", "--folder", "/usr/lib64"}},
		},
		{
			name:      "nvidia-ctk as the hook runs its hook subcommand",
			opts:      nvidia.Options{DriverRoot: root, HookPath: "/usr/bin/nvidia-ctk"},
			wantHooks: [][]string{{"nvidia-ctk", "hook", "update-ldcache", "--folder", "/usr/lib64"}},
		},
		{
			name:    "no hook: the libraries would not load",
			opts:    nvidia.Options{DriverRoot: root},
			wantErr: []string{"no hook path"},
		},
		{
			name:    "a relative hook path",
			opts:    nvidia.Options{DriverRoot: root, HookPath: "nri-gpu"},
			wantErr: []string{`hook path "nri-gpu" is not absolute`},
		},
		{
			name:    "a bad kind",
			opts:    nvidia.Options{DriverRoot: root, HookPath: "/usr/bin/nvidia-cdi-hook", Kind: "gpu"},
			wantErr: []string{`kind "gpu"`},
		},
		{
			name:    "a bad name strategy",
			opts:    nvidia.Options{DriverRoot: root, HookPath: "/usr/bin/nvidia-cdi-hook", NameStrategies: []string{"serial"}},
			wantErr: []string{`device name strategy "serial"`},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := nvidia.Generate(s, tc.opts)
			if len(tc.wantErr) > 0 {
				testutil.ErrorSays(t, err, tc.wantErr...)
				if !errors.Is(err, nvidia.ErrOptions) {
					t.Errorf("error %v does not wrap ErrOptions", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			// nvcdi orders the devices by name.
			if tc.wantNames != nil && !slices.Equal(deviceNames(got), slices.Sorted(slices.Values(tc.wantNames))) {
				t.Errorf("devices %v, want %v", deviceNames(got), tc.wantNames)
			}
			for _, m := range tc.wantMounts {
				if !slices.Contains(mountPaths(got), m) {
					t.Errorf("mounts %v lack %s", mountPaths(got), m)
				}
			}
			for _, h := range tc.wantHooks {
				if !slices.ContainsFunc(hookArgs(got), func(a []string) bool { return slices.Equal(a, h) }) {
					t.Errorf("hooks %q lack %q", hookArgs(got), h)
				}
			}
			for _, hk := range got.ContainerEdits.Hooks {
				if hk.Path != tc.opts.HookPath {
					t.Errorf("hook %v runs %s, not %s", hk.Args, hk.Path, tc.opts.HookPath)
				}
			}
		})
	}
}

func TestGenerateWithoutNVML(t *testing.T) {
	s := server(2)
	s.InitFunc = func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }
	_, err := nvidia.Generate(s, nvidia.Options{DriverRoot: "testdata/minimal-root", HookPath: "/usr/bin/nvidia-cdi-hook"})
	if !errors.Is(err, nvidia.ErrNVML) || !errors.Is(err, nvml.ERROR_LIBRARY_NOT_FOUND) {
		t.Fatalf("error %v, want one wrapping ErrNVML and NVML's return", err)
	}
	testutil.ErrorSays(t, err, "NVML", "NVIDIA driver")
}

func TestDiscover(t *testing.T) {
	s := server(3)
	migs := withMIG(s)
	inv, err := nvidia.Discover(s)
	if err != nil {
		t.Fatal(err)
	}
	if inv.DriverVersion != "550.54.15" || len(inv.GPUs) != 3 {
		t.Fatalf("inventory %+v", inv)
	}
	g := inv.GPUs[0]
	if g.UUID != uuidOf(t, s, 0) || !strings.Contains(g.Model, "A100") || g.MemoryBytes == 0 || !g.MIGEnabled || len(g.MIGs) != 2 || g.MIGs[1].UUID != migs[1] || g.MIGs[1].GI != 2 {
		t.Errorf("GPU 0: %+v", g)
	}
	if inv.GPUs[1].MIGEnabled || len(inv.GPUs[1].MIGs) != 0 {
		t.Errorf("GPU 1: %+v", inv.GPUs[1])
	}
	for i, g := range inv.GPUs {
		if g.Index != i || g.Minor != i {
			t.Errorf("GPU %d: index %d minor %d", i, g.Index, g.Minor)
		}
	}
}

// TestGenerateDevRoot: the GPUs' device nodes are found under the dev
// root given (a containerized driver's /dev apart from its files), and
// named there as the spec's host paths.
func TestGenerateDevRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("making device nodes needs root")
	}
	root, err := filepath.Abs("testdata/minimal-root")
	if err != nil {
		t.Fatal(err)
	}
	devRoot := t.TempDir()
	if err := os.Mkdir(filepath.Join(devRoot, "dev"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, minor := range map[string]int{"nvidia0": 0, "nvidiactl": 255} {
		if err := unix.Mknod(filepath.Join(devRoot, "dev", name), unix.S_IFCHR|0o666, int(unix.Mkdev(195, uint32(minor)))); err != nil {
			t.Fatal(err)
		}
	}
	spec, err := nvidia.Generate(server(1), nvidia.Options{DriverRoot: root, DevRoot: devRoot, HookPath: "/usr/bin/nvidia-cdi-hook"})
	if err != nil {
		t.Fatal(err)
	}
	var hostPaths []string
	for _, d := range spec.Devices {
		for _, n := range d.ContainerEdits.DeviceNodes {
			hostPaths = append(hostPaths, n.HostPath)
		}
	}
	for _, n := range spec.ContainerEdits.DeviceNodes {
		hostPaths = append(hostPaths, n.HostPath)
	}
	for _, want := range []string{filepath.Join(devRoot, "dev", "nvidia0"), filepath.Join(devRoot, "dev", "nvidiactl")} {
		if !slices.Contains(hostPaths, want) {
			t.Errorf("host paths %v lack %s", hostPaths, want)
		}
	}
}
