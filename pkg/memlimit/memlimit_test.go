package memlimit_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/memlimit"
)

const mib = 1 << 20

// TestAsked: a container's environment lowers what it was granted, never
// raises it; a malformed value is refused naming it.
func TestAsked(t *testing.T) {
	for _, tc := range []struct {
		name    string
		granted uint64
		env     []string
		want    memlimit.Bounds
		err     string
	}{
		{"nothing asked", 4096 * mib, []string{"PATH=/bin"}, memlimit.Bounds{Soft: 4096 * mib, Hard: 4096 * mib}, ""},
		{"less asked", 4096 * mib, []string{memlimit.RequestEnv + "=1024", memlimit.LimitEnv + "=2048"}, memlimit.Bounds{Soft: 1024 * mib, Hard: 2048 * mib}, ""},
		{"more asked", 4096 * mib, []string{memlimit.RequestEnv + "=8192", memlimit.LimitEnv + "=16384"}, memlimit.Bounds{Soft: 4096 * mib, Hard: 4096 * mib}, ""},
		{"a lower limit lowers the soft one too", 4096 * mib, []string{memlimit.LimitEnv + "=1024"}, memlimit.Bounds{Soft: 1024 * mib, Hard: 1024 * mib}, ""},
		{"the last value counts", 4096 * mib, []string{memlimit.LimitEnv + "=1", memlimit.LimitEnv + "=2"}, memlimit.Bounds{Soft: 2 * mib, Hard: 2 * mib}, ""},
		{"not a number", 4096 * mib, []string{memlimit.LimitEnv + "=4Gi"}, memlimit.Bounds{}, `NVIDIA_GPU_MEMORY_LIMIT="4Gi": not a whole number of MiB`},
		{"negative", 4096 * mib, []string{memlimit.RequestEnv + "=-1"}, memlimit.Bounds{}, `NVIDIA_GPU_MEMORY_REQUEST="-1"`},
		{"overflowing", 4096 * mib, []string{memlimit.LimitEnv + "=18446744073709551615"}, memlimit.Bounds{}, "not a whole number of MiB"},
		{"request over limit", 4096 * mib, []string{memlimit.RequestEnv + "=2048", memlimit.LimitEnv + "=1024"}, memlimit.Bounds{}, "NVIDIA_GPU_MEMORY_REQUEST is more than NVIDIA_GPU_MEMORY_LIMIT"},
		{"long value cut", 1, []string{memlimit.LimitEnv + "=" + strings.Repeat("x", 4096)}, memlimit.Bounds{}, "not a whole number"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := memlimit.Asked(tc.granted, tc.env)
			if tc.err != "" {
				if !errors.Is(err, memlimit.ErrAsked) || !strings.Contains(err.Error(), tc.err) || len(err.Error()) > 200 {
					t.Fatalf("Asked: %v, want ErrAsked saying %q, short", err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("Asked = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

// TestCgroupOf: a container's process is found in its cgroup v2
// directory; cgroup v1, another container's process, one whose cgroup
// this process's cgroup namespace shows only relative to its own, or a
// missing one are not taken.
func TestCgroupOf(t *testing.T) {
	const id = "4f1c9a0e2b7d"
	for _, tc := range []struct {
		name, cgroup, want, err string
		unenforceable           bool
	}{
		{"systemd", "0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-" + id + ".scope\n", "/sys/fs/cgroup/kubepods.slice/kubepods-pod1.slice/cri-containerd-" + id + ".scope", "", false},
		{"cgroupfs", "0::/kubepods/besteffort/pod1/" + id + "\n", "/sys/fs/cgroup/kubepods/besteffort/pod1/" + id, "", false},
		{"outside this cgroup namespace (never taken for a path of the root's)", "0::/../../etc/" + id + "\n", "", "outside this process's cgroup namespace", false},
		{"cgroup v1", "12:devices:/kubepods/pod1/" + id + "\n0::/\n", "", "cgroup v1", true},
		{"hybrid's v1 line first", "1:name=systemd:/x/" + id + "\n", "", "cgroup v1", true},
		{"another container", "0::/kubepods/pod1/0123456789ab\n", "", "is not in container " + id, false},
		{"no process", "", "", "no such file", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			proc := t.TempDir()
			if tc.cgroup != "" {
				if err := os.MkdirAll(filepath.Join(proc, "42"), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(proc, "42", "cgroup"), []byte(tc.cgroup), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, err := memlimit.Cgroups{Proc: proc, Root: "/sys/fs/cgroup"}.Of(42, id)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || errors.Is(err, memlimit.ErrUnenforceable) != tc.unenforceable {
					t.Fatalf("Of: %v, want an error saying %q (unenforceable %v)", err, tc.err, tc.unenforceable)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("Of = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// TestCgroupV2: a cgroup v2 mount is one, any other directory is not.
func TestCgroupV2(t *testing.T) {
	if err := (memlimit.Cgroups{Root: t.TempDir()}).V2(); !errors.Is(err, memlimit.ErrUnenforceable) || !strings.Contains(err.Error(), "is not cgroup v2") {
		t.Fatalf("V2 of a plain directory: %v, want ErrUnenforceable", err)
	}
	if err := (memlimit.Cgroups{Root: testutil.Cgroup2(t)}).V2(); err != nil {
		t.Fatalf("V2 of a cgroup v2 mount: %v", err)
	}
}

// set is one SetMemoryLimits_v1 call the mock driver saw.
type set struct {
	uuid, cgroup string
	soft, hard   uint64
}

// driver is a mock NVML of GPUs by UUID whose calls answer ret (and
// MIG says which are MIG devices); missing leaves out the symbol.
func driver(ret nvml.Return, mig map[string]bool, missing bool, calls *[]set) memlimit.Driver {
	lib := &mock.Interface{
		InitFunc:           func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc:       func() nvml.Return { return nvml.SUCCESS },
		DeviceGetCountFunc: func() (int, nvml.Return) { return 0, nvml.SUCCESS },
		ExtensionsFunc: func() nvml.ExtendedInterface {
			return &mock.ExtendedInterface{LookupSymbolFunc: func(name string) error {
				if missing || name != "nvmlDeviceSetMemoryLimits_v1" {
					return errors.New("undefined symbol")
				}
				return nil
			}}
		},
		DeviceGetHandleByUUIDFunc: func(uuid string) (nvml.Device, nvml.Return) {
			if !strings.HasPrefix(uuid, "GPU-") && !strings.HasPrefix(uuid, "MIG-") {
				return nil, nvml.ERROR_NOT_FOUND
			}
			return &mock.Device{
				IsMigDeviceHandleFunc: func() (bool, nvml.Return) { return mig[uuid], nvml.SUCCESS },
				SetMemoryLimits_v1Func: func(cgroup string, soft, hard uint64) nvml.Return {
					*calls = append(*calls, set{uuid, cgroup, soft, hard})
					return ret
				},
				GetMemoryLimits_v1Func: func(cgroup string) (nvml.MemoryLimits_v1, nvml.Return) {
					return nvml.MemoryLimits_v1{NameSpace: cgroup, SoftLimit: 1 * mib, HardLimit: 2 * mib, CurrentUsed: 3 * mib}, ret
				},
			}, nvml.SUCCESS
		},
	}
	return memlimit.Driver{Lib: lib}
}

// TestDriver: limits are set and lifted on the GPU and cgroup asked; a
// driver without the call, a MIG device or NOT_SUPPORTED are
// unenforceable, saying why; other failures are errors of their own.
func TestDriver(t *testing.T) {
	const cg = "/sys/fs/cgroup/kubepods/pod1/4f1c9a0e2b7d"
	for _, tc := range []struct {
		name          string
		uuid          string
		ret           nvml.Return
		missing       bool
		err           string
		unenforceable bool
		calls         []set
	}{
		{"set and lifted", "GPU-1", nvml.SUCCESS, false, "", false, []set{{"GPU-1", cg, 1 * mib, 2 * mib}, {"GPU-1", cg, 0, memlimit.Unlimited}}},
		{"not supported", "GPU-1", nvml.ERROR_NOT_SUPPORTED, false, "the driver has no per-cgroup memory limits", true, []set{{"GPU-1", cg, 1 * mib, 2 * mib}}},
		{"older driver", "GPU-1", nvml.SUCCESS, true, "has no nvmlDeviceSetMemoryLimits_v1", true, nil},
		{"MIG device", "MIG-1", nvml.SUCCESS, false, "MIG-1 is a MIG device", true, nil},
		{"no such GPU", "gpu0", nvml.SUCCESS, false, "GPU gpu0: ", false, nil},
		{"no cgroup", "GPU-1", nvml.ERROR_OPERATING_SYSTEM, false, "setting the memory limits of GPU-1", false, []set{{"GPU-1", cg, 1 * mib, 2 * mib}}},
		{"a cgroup without dmem", "GPU-1", nvml.ERROR_NOT_FOUND, false, "on " + cg + ": ERROR_NOT_FOUND (the cgroup is gone, or has no dmem controller: each of its parents' cgroup.subtree_control needs +dmem", false, []set{{"GPU-1", cg, 1 * mib, 2 * mib}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var calls []set
			d := driver(tc.ret, map[string]bool{"MIG-1": true}, tc.missing, &calls)
			err := d.Set(tc.uuid, cg, memlimit.Bounds{Soft: 1 * mib, Hard: 2 * mib})
			if err == nil {
				err = d.Lift(tc.uuid, cg)
			}
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("Set, Lift: %v, want %q", err, tc.err)
			}
			if errors.Is(err, memlimit.ErrUnenforceable) != tc.unenforceable {
				t.Errorf("Set: %v, unenforceable %v, want %v", err, !tc.unenforceable, tc.unenforceable)
			}
			if len(calls) != len(tc.calls) || len(calls) > 0 && calls[0] != tc.calls[0] || len(calls) > 1 && calls[1] != tc.calls[1] {
				t.Errorf("the driver was asked %+v, want %+v", calls, tc.calls)
			}
			b, used, err := d.Get(tc.uuid, cg)
			if tc.err == "" && (err != nil || b != (memlimit.Bounds{Soft: 1 * mib, Hard: 2 * mib}) || used != 3*mib) {
				t.Errorf("Get = %+v, %d, %v", b, used, err)
			}
			if tc.err != "" && err == nil {
				t.Errorf("Get: no error where Set failed with %q", tc.err)
			}
		})
	}
}

// TestBoundsNone: only a soft limit of 0 with the largest hard one is no
// limit.
func TestBoundsNone(t *testing.T) {
	for b, want := range map[memlimit.Bounds]bool{
		{Soft: 0, Hard: memlimit.Unlimited}: true,
		{Soft: 0, Hard: 1}:                  false,
		{Soft: 1, Hard: memlimit.Unlimited}: false,
	} {
		if b.None() != want {
			t.Errorf("%+v.None() = %v", b, !want)
		}
	}
}

// TestProbe: the node can enforce limits only with cgroup v2, the
// driver's call, and GPUs that answer; each failing part says why.
func TestProbe(t *testing.T) {
	gpus := func(rets ...nvml.Return) *mock.Interface {
		return &mock.Interface{
			InitFunc:     func() nvml.Return { return nvml.SUCCESS },
			ShutdownFunc: func() nvml.Return { return nvml.SUCCESS },
			ExtensionsFunc: func() nvml.ExtendedInterface {
				return &mock.ExtendedInterface{LookupSymbolFunc: func(string) error { return nil }}
			},
			DeviceGetCountFunc: func() (int, nvml.Return) { return len(rets), nvml.SUCCESS },
			DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) {
				return &mock.Device{GetUUIDFunc: func() (string, nvml.Return) { return "GPU-" + string(rune('0'+i)), nvml.SUCCESS }}, nvml.SUCCESS
			},
			DeviceGetHandleByUUIDFunc: func(uuid string) (nvml.Device, nvml.Return) {
				ret := rets[uuid[len(uuid)-1]-'0']
				return &mock.Device{
					IsMigDeviceHandleFunc:  func() (bool, nvml.Return) { return false, nvml.SUCCESS },
					GetMemoryLimits_v1Func: func(string) (nvml.MemoryLimits_v1, nvml.Return) { return nvml.MemoryLimits_v1{}, ret },
				}, nvml.SUCCESS
			},
		}
	}
	v2 := memlimit.Cgroups{Root: testutil.Cgroup2(t)}
	for _, tc := range []struct {
		name     string
		lib      nvml.Interface
		c        memlimit.Cgroups
		enforced bool
		says     string
	}{
		{"every GPU", gpus(nvml.SUCCESS, nvml.SUCCESS), v2, true, ""},
		{"a GPU without", gpus(nvml.SUCCESS, nvml.ERROR_NOT_SUPPORTED), v2, false, "GPU-1: the driver cannot enforce"},
		{"the root has no limits to read (dmem)", gpus(nvml.ERROR_NOT_FOUND), v2, true, ""},
		{"cgroup v1", gpus(nvml.SUCCESS), memlimit.Cgroups{Root: t.TempDir()}, false, "is not cgroup v2"},
		{"no GPU", gpus(), v2, false, "NVML lists no GPU"},
		{"older driver", driver(nvml.SUCCESS, nil, true, nil).Lib, v2, false, "has no nvmlDeviceSetMemoryLimits_v1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := memlimit.Probe(tc.lib, tc.c)
			if err != nil {
				t.Fatal(err)
			}
			if s.Enforced() != tc.enforced {
				t.Fatalf("Probe = %+v, enforced %v, want %v", s, !tc.enforced, tc.enforced)
			}
			said := s.Why()
			if !strings.Contains(strings.Join(said, "; "), tc.says) {
				t.Errorf("Probe says %q, want %q", said, tc.says)
			}
		})
	}
}

// TestDmem: where the kernel has the dmem controller (the root's
// cgroup.controllers), the root must enable it for its children
// (cgroup.subtree_control), or no container's cgroup can be bounded
// through it; a kernel without it needs nothing.
func TestDmem(t *testing.T) {
	for _, tc := range []struct {
		name, controllers, enabled string
		warns                      bool
	}{
		{"no dmem in the kernel", "cpu memory pids", "cpu memory pids", false},
		{"dmem enabled below the root", "cpu dmem memory", "cpu dmem memory", false},
		{"dmem not enabled below the root", "cpu dmem memory", "cpu memory", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			for name, text := range map[string]string{"cgroup.controllers": tc.controllers, "cgroup.subtree_control": tc.enabled} {
				if err := os.WriteFile(filepath.Join(root, name), []byte(text+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			err := memlimit.Cgroups{Root: root}.Dmem()
			if (err != nil) != tc.warns || err != nil && !strings.Contains(err.Error(), "dmem controller") {
				t.Errorf("Dmem = %v, want a warning %v", err, tc.warns)
			}
			// Not cgroup v2 (a plain directory): that says it all, and
			// nothing of dmem is said beside it.
			s, err := memlimit.Probe(driver(nvml.SUCCESS, nil, false, nil).Lib, memlimit.Cgroups{Root: root})
			if err != nil || s.Cgroup == nil || s.Dmem != nil {
				t.Errorf("Probe of a root that is not cgroup v2: %+v, %v; want its Cgroup only", s, err)
			}
		})
	}
}

// TestProbeWithoutNVML: an NVML that does not open is Probe's error,
// naming NVML and its code, and nothing is asked of it.
func TestProbeWithoutNVML(t *testing.T) {
	lib := &mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }}
	_, err := memlimit.Probe(lib, memlimit.Cgroups{Root: testutil.Cgroup2(t)})
	if !errors.Is(err, nvml.ERROR_LIBRARY_NOT_FOUND) || !strings.Contains(err.Error(), "NVML") {
		t.Fatalf("Probe = %v, want NVML's ERROR_LIBRARY_NOT_FOUND", err)
	}
	if n := len(lib.ShutdownCalls()); n != 0 {
		t.Errorf("an NVML that did not open was shut %d times", n)
	}
}

// TestOfContainer: where the runtime tells no pid (CRI-O), a container's
// cgroup is the one its cgroupsPath names: systemd's "slice:prefix:name"
// (the slice expanded as systemd does, the unit prefix-name.scope) or
// cgroupfs' absolute path, under the cgroup v2 root, existing, naming the
// container; with a pid, its process's.
func TestOfContainer(t *testing.T) {
	const id = "0123456789abcdef"
	root := testutil.Cgroup2(t)
	scope := "/nrigputest.slice/nrigputest-pod_x.slice/crio-" + id + ".scope"
	plain := "/nri-gpu-test-" + id
	for _, dir := range []string{"/nrigputest.slice", "/nrigputest.slice/nrigputest-pod_x.slice", scope, plain} {
		if err := os.Mkdir(root+dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, dir := range []string{plain, scope, "/nrigputest.slice/nrigputest-pod_x.slice", "/nrigputest.slice"} {
			_ = os.Remove(root + dir)
		}
	})
	proc := t.TempDir()
	for pid, cgroup := range map[string]string{"1": "/kubepods/" + id, "7": "/kubepods/" + id, "9": "/../../kubepods/" + id} {
		if err := os.MkdirAll(filepath.Join(proc, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(proc, pid, "cgroup"), []byte("0::"+cgroup+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	c := memlimit.Cgroups{Proc: proc, Root: root}
	for _, tc := range []struct {
		name, path string
		pid        int
		want, err  string
	}{
		{name: "systemd", path: "nrigputest-pod_x.slice:crio:" + id, want: root + scope},
		{name: "cgroupfs", path: plain, want: root + plain},
		{name: "the cgroupsPath before the process's", pid: 7, path: plain, want: root + plain},
		{name: "the process's, without a cgroupsPath", pid: 7, want: root + "/kubepods/" + id},
		{name: "process 1's (a container's init in the host's pid namespace)", pid: 1, want: root + "/kubepods/" + id},
		{name: "a process outside nri-gpu's cgroup namespace", pid: 9, err: "outside this process's cgroup namespace"},
		{name: "another container's", path: "nrigputest-pod_x.slice:crio:fedcba9876543210", err: "does not name it"},
		{name: "not there", path: "nrigputest-pod_x.slice:cri-containerd:" + id, err: "not a directory"},
		{name: "a bad slice", path: "pod/x.slice:crio:" + id, err: "invalid slice name"},
		{name: "relative", path: "kubepods/" + id, err: "does not name it"},
		{name: "none", err: "does not name it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := c.OfContainer(tc.pid, id, tc.path)
			if tc.err != "" {
				testutil.ErrorSays(t, err, tc.err)
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("%q: %q, %v; want %q", tc.path, got, err, tc.want)
			}
		})
	}
	if _, err := (memlimit.Cgroups{Proc: proc, Root: t.TempDir()}).OfContainer(0, id, plain); !errors.Is(err, memlimit.ErrUnenforceable) {
		t.Errorf("not cgroup v2: %v, want ErrUnenforceable", err)
	}
}
