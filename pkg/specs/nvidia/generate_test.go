package nvidia_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"text/template"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/specs/nvidia"
)

// server returns a DGX A100 mock cut to n GPUs.
func server(n int) *dgxa100.Server {
	s := dgxa100.New()
	s.DeviceGetCountFunc = func() (int, nvml.Return) { return n, nvml.SUCCESS }
	return s
}

// withMIG turns MIG on for GPU 0 of s and gives it two MIG devices, on
// GPU instances 1 and 2 (compute instance 0 each), as the mig-minors file
// of testdata/driver-root lists them. It returns their UUIDs.
func withMIG(s *dgxa100.Server) []string {
	gpu := s.Devices[0].(*dgxa100.Device)
	gpu.MigMode = nvml.DEVICE_MIG_ENABLE
	uuids := []string{"MIG-a0a0a0a0-0000-4000-8000-000000000001", "MIG-a0a0a0a0-0000-4000-8000-000000000002"}
	gpu.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return 7, nvml.SUCCESS }
	gpu.GetMigDeviceHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		if i >= len(uuids) {
			return nil, nvml.ERROR_NOT_FOUND
		}
		return &mock.Device{
			GetUUIDFunc:              func() (string, nvml.Return) { return uuids[i], nvml.SUCCESS },
			GetGpuInstanceIdFunc:     func() (int, nvml.Return) { return i + 1, nvml.SUCCESS },
			GetComputeInstanceIdFunc: func() (int, nvml.Return) { return 0, nvml.SUCCESS },
		}, nvml.SUCCESS
	}
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

func abs(t *testing.T, p string) string {
	t.Helper()
	a, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// golden reads a golden spec, filling in the driver root and the mock's
// UUIDs (random on every run), and parses it.
func golden(t *testing.T, name, root string, uuids []string) *cdispec.Spec {
	t.Helper()
	text, err := os.ReadFile(filepath.Join("testdata", "golden", name))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	tmpl := template.Must(template.New(name).Funcs(template.FuncMap{
		"uuid": func(i int) string { return uuids[i] },
	}).Parse(string(text)))
	if err := tmpl.Execute(&buf, map[string]string{"Root": root}); err != nil {
		t.Fatal(err)
	}
	var spec cdispec.Spec
	if err := yaml.UnmarshalStrict(buf.Bytes(), &spec); err != nil {
		t.Fatal(err)
	}
	return &spec
}

func TestGenerateGolden(t *testing.T) {
	root := abs(t, "testdata/driver-root")
	tests := []struct {
		name   string
		golden string
		mig    bool
		opts   nvidia.Options
	}{
		{
			name:   "two full GPUs, both names, optional nodes, utilities, firmware and sockets present, hooks",
			golden: "full.yaml",
			opts:   nvidia.Options{DriverRoot: root, HookPath: "/usr/bin/nvidia-cdi-hook"},
		},
		{
			name:   "a MIG-enabled GPU with two MIG devices beside a full GPU, index names",
			golden: "mig.yaml",
			mig:    true,
			opts:   nvidia.Options{DriverRoot: root, NameStrategies: []string{nvidia.NameIndex}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := server(2)
			uuids := []string{uuidOf(t, s, 0), uuidOf(t, s, 1)}
			if tc.mig {
				uuids = append(uuids, withMIG(s)...)
			}
			got, err := nvidia.Generate(s, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(golden(t, tc.golden, root, uuids), got); diff != "" {
				t.Errorf("spec (-golden +generated):\n%s", diff)
			}
		})
	}
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

func TestGenerate(t *testing.T) {
	s := server(2)
	u0, u1 := uuidOf(t, s, 0), uuidOf(t, s, 1)
	tests := []struct {
		name       string
		opts       nvidia.Options
		wantNames  []string
		wantMounts []string
		wantNodes  []string
		wantErr    []string
	}{
		{
			name:      "UUID names only",
			opts:      nvidia.Options{DriverRoot: "testdata/minimal-root", NameStrategies: []string{nvidia.NameUUID}},
			wantNames: []string{u0, u1, "all"},
		},
		{
			name:       "optional nodes and files missing: only what is there",
			opts:       nvidia.Options{DriverRoot: "testdata/minimal-root"},
			wantNames:  []string{"0", u0, "1", u1, "all"},
			wantMounts: []string{"/usr/lib64/libcuda.so.550.54.15", "/usr/lib64/libnvidia-ml.so.550.54.15"},
			wantNodes:  []string{},
		},
		{
			name:       "libraries found through the ld cache",
			opts:       nvidia.Options{DriverRoot: "testdata/ldcache-root"},
			wantMounts: []string{"/opt/nvidia/lib/libcuda.so.550.54.15", "/opt/nvidia/lib/libnvidia-ml.so.550.54.15"},
		},
		{
			name:    "a required library of the driver's version missing",
			opts:    nvidia.Options{DriverRoot: t.TempDir()},
			wantErr: []string{"driver library libcuda.so.550.54.15 (the version NVML reports) not found"},
		},
		{
			name:    "a bad kind",
			opts:    nvidia.Options{DriverRoot: "testdata/minimal-root", Kind: "gpu"},
			wantErr: []string{`kind "gpu"`},
		},
		{
			name:    "a bad name strategy",
			opts:    nvidia.Options{DriverRoot: "testdata/minimal-root", NameStrategies: []string{"serial"}},
			wantErr: []string{`device name strategy "serial"`},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := nvidia.Generate(s, tc.opts)
			if len(tc.wantErr) > 0 {
				testutil.ErrorSays(t, err, tc.wantErr...)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.wantNames != nil && !slices.Equal(deviceNames(got), tc.wantNames) {
				t.Errorf("devices %v, want %v", deviceNames(got), tc.wantNames)
			}
			if tc.wantMounts != nil && !slices.Equal(mountPaths(got), tc.wantMounts) {
				t.Errorf("mounts %v, want %v", mountPaths(got), tc.wantMounts)
			}
			if tc.wantNodes != nil && len(got.ContainerEdits.DeviceNodes) != len(tc.wantNodes) {
				t.Errorf("shared nodes %v, want %v", got.ContainerEdits.DeviceNodes, tc.wantNodes)
			}
		})
	}
}

func TestGenerateWithoutNVML(t *testing.T) {
	s := server(2)
	s.InitFunc = func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }
	_, err := nvidia.Generate(s, nvidia.Options{DriverRoot: "testdata/minimal-root"})
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
