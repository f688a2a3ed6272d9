package doctor_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/doctor"
	"github.com/nri-gpu/nri-gpu/pkg/memlimit"
)

// TestFindings: each thing check looks at, in each state it may be in,
// gives its finding: nri-gpu's configuration file (none, unreadable,
// invalid, valid), the NRI socket, containerd's config (absent, not
// TOML), broken and untrusted specs, and each hook the specs run
// (missing, not executable, not allowed, allowed).
func TestFindings(t *testing.T) {
	dir := testutil.ShortDir(t)
	write := func(name, data string, mode os.FileMode) string {
		t.Helper()
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(data), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		return path
	}
	valid := write("valid.yaml", "policy: {exclusive: true}\n", 0o644)
	invalid := write("invalid.yaml", "policy:\n  alowAll: true\n", 0o644)
	notTOML := write("config.toml", "version = [\n", 0o644)
	plain := write("hooks/plain", "", 0o644)
	exe := write("hooks/exe", "#!/bin/sh\n", 0o755)
	allowed := write("hooks/allowed", "#!/bin/sh\n", 0o755)
	hook := func(path string) string { return "[{hookName: createContainer, path: " + path + "}]" }
	specDir := filepath.Join(dir, "cdi")
	write("cdi/gpu.yaml", "cdiVersion: \"0.6.0\"\nkind: nvidia.com/gpu\ndevices:\n"+
		"  - {name: \"0\", containerEdits: {env: [A=0], hooks: "+hook(filepath.Join(dir, "hooks/missing"))+"}}\n"+
		"  - {name: \"1\", containerEdits: {env: [A=1], hooks: "+hook(plain)+"}}\n"+
		"  - {name: \"2\", containerEdits: {env: [A=2], hooks: "+hook(exe)+"}}\n"+
		"  - {name: \"3\", containerEdits: {env: [A=3], hooks: "+hook(allowed)+"}}\n", 0o644)
	// A driver upgraded since its spec was written: the libraries it
	// mounts are gone, but for one.
	lib := write("driver/libcuda.so.580.1", "", 0o644)
	var mounts []string
	for i := range 7 {
		mounts = append(mounts, fmt.Sprintf("{hostPath: %s/driver/libgone.so.%d, containerPath: /lib/libgone.so.%d}", dir, i, i))
	}
	write("cdi/driver.yaml", "cdiVersion: \"0.6.0\"\nkind: example.com/driver\ncontainerEdits: {mounts: ["+mounts[0]+", {hostPath: "+lib+", containerPath: /lib/libcuda.so}]}\n"+
		"devices: [{name: \"0\", containerEdits: {env: [C=1], mounts: ["+strings.Join(mounts, ", ")+"]}}]\n", 0o644)
	write("cdi/broken.yaml", "cdiVersion: \"0.6.0\"\nkind: broken\n", 0o644)
	write("cdi/open.yaml", "cdiVersion: \"0.6.0\"\nkind: example.com/open\ndevices: [{name: \"0\", containerEdits: {env: [B=1]}}]\n", 0o666)
	if err := os.Chmod(specDir, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.CDISpecDirs = []string{specDir}
	cfg.Policy.HookPaths = []string{allowed}

	type want struct {
		check  string
		status doctor.Status
		detail string
	}
	for _, tc := range []struct {
		name string
		in   doctor.Input
		want []want
	}{
		{
			name: "no config file, no NRI socket, neither runtime's config",
			in:   doctor.Input{SocketPath: filepath.Join(dir, "none.sock"), ContainerdConfig: filepath.Join(dir, "absent.toml"), CRIOConfig: filepath.Join(dir, "absent.conf"), Config: cfg},
			want: []want{
				{"nri-gpu config", doctor.OK, "none given: the defaults apply"},
				{"NRI socket", doctor.Fail, filepath.Join(dir, "none.sock") + " does not answer"},
				{"runtime config", doctor.Warn, "neither " + filepath.Join(dir, "absent.toml") + " nor " + filepath.Join(dir, "absent.conf") + " exists"},
			},
		},
		{
			name: "an unreadable config file, containerd's config no TOML",
			in:   doctor.Input{ConfigFile: filepath.Join(dir, "gone.yaml"), ContainerdConfig: notTOML, Config: cfg},
			want: []want{
				{"nri-gpu config", doctor.Fail, "open " + filepath.Join(dir, "gone.yaml") + ": no such file"},
				{"containerd config", doctor.Fail, notTOML + ": "},
			},
		},
		{
			name: "CRI-O's config no TOML",
			in:   doctor.Input{CRIOConfig: notTOML, Config: cfg},
			want: []want{{"CRI-O config", doctor.Fail, notTOML + ": "}},
		},
		{
			name: "DRA on: its driver found, or not",
			in:   doctor.Input{Config: cfg, DRADriver: &doctor.Program{Path: exe}},
			want: []want{{"DRA driver", doctor.OK, exe + ": nri-gpu starts it"}},
		},
		{
			name: "DRA on, its driver nowhere",
			in:   doctor.Input{Config: cfg, DRADriver: &doctor.Program{Err: errors.New("nri-gpu-dra is neither beside nri-gpu nor on the PATH")}},
			want: []want{{"DRA driver", doctor.Fail, "start.dra.enabled, but nri-gpu-dra is neither beside nri-gpu nor on the PATH"}},
		},
		{
			name: "no NVIDIA driver",
			in:   doctor.Input{Config: cfg, NoNVML: errors.New("NVML: ERROR_LIBRARY_NOT_FOUND")},
			want: []want{{"GPU memory limits", doctor.OK, "no NVIDIA driver to ask (NVML: ERROR_LIBRARY_NOT_FOUND): nothing to limit"}},
		},
		{
			name: "the driver enforces GPU memory limits",
			in:   doctor.Input{Config: cfg, MemoryLimits: &memlimit.Support{GPUs: []memlimit.GPUSupport{{UUID: "GPU-0"}, {UUID: "GPU-1"}}}},
			want: []want{{"GPU memory limits", doctor.OK, "the driver can bound each holder's memory on its 2 GPUs"}},
		},
		{
			name: "the driver cannot enforce them: cgroup v1, a GPU without",
			in: doctor.Input{Config: cfg, MemoryLimits: &memlimit.Support{Cgroup: errors.New("/sys/fs/cgroup is not cgroup v2"),
				GPUs: []memlimit.GPUSupport{{UUID: "GPU-0"}, {UUID: "GPU-1", Err: errors.New("not supported")}}}},
			want: []want{{"GPU memory limits", doctor.Warn, "the driver cannot bound GPU memory per container here: /sys/fs/cgroup is not cgroup v2; GPU-1: not supported"}},
		},
		{
			name: "the driver has the limits, the kernel's dmem controller is not enabled below the root",
			in: doctor.Input{Config: cfg, MemoryLimits: &memlimit.Support{GPUs: []memlimit.GPUSupport{{UUID: "GPU-0"}},
				Dmem: errors.New("the kernel's dmem controller ... is not enabled below /sys/fs/cgroup")}},
			want: []want{{"GPU memory limits", doctor.Warn, "the driver has per-cgroup limits on its 1 GPUs, but the kernel's dmem controller ... is not enabled below /sys/fs/cgroup"}},
		},
		{
			name: "NVML lists no GPU",
			in:   doctor.Input{Config: cfg, MemoryLimits: &memlimit.Support{}},
			want: []want{{"GPU memory limits", doctor.Warn, "the driver cannot bound GPU memory per container here: NVML lists no GPU"}},
		},
		{
			name: "an invalid config file",
			in:   doctor.Input{ConfigFile: invalid, Config: cfg},
			want: []want{{"nri-gpu config", doctor.Fail, invalid + ": line 2: field alowAll not found"}},
		},
		{
			name: "a valid config file; the specs and their hooks",
			in:   doctor.Input{ConfigFile: valid, Config: cfg},
			want: []want{
				{"nri-gpu config", doctor.OK, valid + " is valid"},
				{"spec", doctor.Fail, filepath.Join(specDir, "broken.yaml") + ": "},
				{"spec", doctor.Fail, filepath.Join(specDir, "open.yaml") + ": CDI spec not trusted"},
				{"devices", doctor.OK, "5 devices can be injected"},
				{"spec files", doctor.Warn, filepath.Join(specDir, "driver.yaml") + " mounts files that no longer exist (a driver upgraded or removed since the spec was written?): " +
					filepath.Join(dir, "driver/libgone.so.0") + ", " + filepath.Join(dir, "driver/libgone.so.1") + ", " + filepath.Join(dir, "driver/libgone.so.2") + ", " +
					filepath.Join(dir, "driver/libgone.so.3") + ", " + filepath.Join(dir, "driver/libgone.so.4") + " and 2 more;"},
				{"hook", doctor.OK, allowed + " exists and is allowed"},
				{"hook", doctor.Fail, exe + " (for nvidia.com/gpu=2) is not in policy.hookPaths"},
				{"hook", doctor.Fail, filepath.Join(dir, "hooks/missing") + " (for nvidia.com/gpu=0) does not exist"},
				{"hook", doctor.Fail, plain + " (for nvidia.com/gpu=1) is not executable"},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := doctor.Run(tc.in)
			for _, w := range tc.want {
				found := false
				for _, f := range find(fs, w.check) {
					found = found || (f.Status == w.status && strings.HasPrefix(f.Detail, w.detail))
				}
				if !found {
					t.Errorf("no %s %s %q among %+v", w.status, w.check, w.detail, find(fs, w.check))
				}
			}
			for _, f := range fs {
				if f.Status != doctor.OK && f.Fix == "" {
					t.Errorf("%s %s has no fix", f.Status, f.Check)
				}
			}
		})
	}
}

// TestMemoryLimitsFix: where the driver cannot bound GPU memory, the fix
// says what policy.memoryLimits then does with a shared GPU whose memory
// is counted: refuses it (enforced, the default) or runs it by agreement.
func TestMemoryLimitsFix(t *testing.T) {
	cannot := &memlimit.Support{Cgroup: errors.New("/sys/fs/cgroup is not cgroup v2")}
	for mode, want := range map[config.MemoryLimits]string{
		config.MemoryLimitsEnforced:  "is refused here (policy.memoryLimits: enforced)",
		config.MemoryLimitsAgreement: "run bounded by agreement only (policy.memoryLimits: agreement)",
	} {
		cfg := config.Default()
		cfg.Policy.MemoryLimits = mode
		f := find(doctor.Run(doctor.Input{Config: cfg, MemoryLimits: cannot}), "GPU memory limits")
		if len(f) != 1 || !strings.Contains(f[0].Fix, want) {
			t.Errorf("%s: %+v, want a fix saying %q", mode, f, want)
		}
	}
}
