package harness

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// FakeDriver describes a fake NVIDIA driver whose NVML is a real shared
// object (libnvidia-ml.so.<Version>, soname libnvidia-ml.so.1) that
// go-nvml dlopens and nvcdi generates a spec from, as it would from
// NVIDIA's: its GPUs, its version, and the version of the kernel module
// it finds loaded, read at every nvmlInit from KernelVersionFile, as the
// real one asks the kernel. When the two differ (the module was replaced
// under a process that still has the old library loaded), nvmlInit
// fails with NVML_ERROR_LIB_RM_VERSION_MISMATCH, as NVIDIA's does
// ("Driver/library version mismatch").
type FakeDriver struct {
	// Version is the driver version the library is of ("560.35.03").
	Version string
	// KernelVersionFile holds the loaded kernel module's version (a
	// line); a missing file is NVML_ERROR_DRIVER_NOT_LOADED.
	KernelVersionFile string
	// GPUs is how many GPUs it reports: index i has minor i, UUID
	// UUIDPrefix followed by i in 12 hex digits, and PCI bus 0000:0i:00.0.
	GPUs int
	// UUIDPrefix begins each GPU's UUID: "GPU-" and 24 characters
	// ("GPU-7f3e9c2a-1b4d-4e8f-a6c5-").
	UUIDPrefix string
	// LimitsFile, when set, gives the driver per-cgroup memory limits
	// (nvmlDeviceSetMemoryLimits_v1, nvmlDeviceGetMemoryLimits_v1): each
	// set is a line appended to it, "UUID CGROUP SOFT HARD" (a lift: soft
	// 0, hard NVML_DEVICE_MEMORY_LIMIT_MAX), and a read answers the last
	// set of that GPU and cgroup. While LimitsFile+".not-supported"
	// exists, both answer NVML_ERROR_NOT_SUPPORTED, as a driver without
	// them does; without LimitsFile they always do.
	LimitsFile string
}

// ReadLimits returns the lines of a fake driver's LimitsFile: each set,
// "UUID CGROUP SOFT HARD", in order (none before the first).
func ReadLimits(file string) ([]string, error) {
	data, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	return strings.Split(strings.TrimSuffix(string(data), "\n"), "\n"), err
}

// fakeNVMLImpl is the part of the fake NVML that answers; every other
// function of nvml.h returns NVML_ERROR_NOT_SUPPORTED (fakeNVMLStubs).
const fakeNVMLImpl = `#include <stdio.h>
#include <string.h>
#include "nvml.h"

#define N_GPUS %d
static const char *version = %q;
static const char *kernel_file = %q;
static const char *uuid_prefix = %q;
static const char *limits_file = %q;

static int kernel_matches(void) {
	FILE *f = fopen(kernel_file, "r");
	if (!f) return -1;
	char line[64] = {0};
	if (!fgets(line, sizeof line, f)) line[0] = 0;
	fclose(f);
	line[strcspn(line, "\r\n")] = 0;
	return strcmp(line, version) == 0;
}

static int inits;

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
	(void)flags;
	switch (kernel_matches()) {
	case -1: return NVML_ERROR_DRIVER_NOT_LOADED;
	case 0: return NVML_ERROR_LIB_RM_VERSION_MISMATCH;
	}
	inits++;
	return NVML_SUCCESS;
}
nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlShutdown(void) {
	if (inits == 0) return NVML_ERROR_UNINITIALIZED;
	inits--;
	return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t r) {
	switch (r) {
	case NVML_SUCCESS: return "Success";
	case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
	case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
	case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
	case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
	case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "Driver/library version mismatch";
	default: return "Unknown Error";
	}
}

static nvmlReturn_t copy(char *dst, unsigned int n, const char *src) {
	if (!dst || strlen(src) + 1 > n) return NVML_ERROR_INSUFFICIENT_SIZE;
	strcpy(dst, src);
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned int n) { return copy(v, n, version); }
nvmlReturn_t nvmlSystemGetNVMLVersion(char *v, unsigned int n) { return copy(v, n, "12.560.35.03"); }
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) { *v = 12060; return NVML_SUCCESS; }
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { *v = 12060; return NVML_SUCCESS; }

/* A device handle is its index plus one (go-nvml's nvml.h wraps the
   handle's pointer in a struct, of the same ABI). */
static nvmlDevice_t handle(int i) { nvmlDevice_t d = {(struct nvmlDevice_st *)(long)(i + 1)}; return d; }
static int index_of(nvmlDevice_t d) {
	long i = (long)d.handle - 1;
	return (i >= 0 && i < N_GPUS) ? (int)i : -1;
}
#define DEVICE(d) int i = index_of(d); if (i < 0) return NVML_ERROR_INVALID_ARGUMENT

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) { *n = N_GPUS; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) {
	if (i >= N_GPUS) return NVML_ERROR_INVALID_ARGUMENT;
	*d = handle(i);
	return NVML_SUCCESS;
}
static void uuid_of(int i, char *out) { sprintf(out, "%%s%%012x", uuid_prefix, i); }
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *u, unsigned int n) {
	DEVICE(d);
	char b[96];
	uuid_of(i, b);
	return copy(u, n, b);
}
nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *u, nvmlDevice_t *d) {
	char b[96];
	for (int i = 0; i < N_GPUS; i++) {
		uuid_of(i, b);
		if (strcmp(b, u) == 0) { *d = handle(i); return NVML_SUCCESS; }
	}
	return NVML_ERROR_NOT_FOUND;
}
nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *n) { DEVICE(d); *n = i; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t d, unsigned int *n) { DEVICE(d); *n = i; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *s, unsigned int n) { DEVICE(d); return copy(s, n, "NVIDIA A100-SXM4-40GB"); }
nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t d, nvmlBrandType_t *b) { DEVICE(d); *b = NVML_BRAND_NVIDIA; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t d, nvmlDeviceArchitecture_t *a) { DEVICE(d); *a = NVML_DEVICE_ARCH_AMPERE; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t d, int *ma, int *mi) { DEVICE(d); *ma = 8; *mi = 0; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *p) {
	DEVICE(d);
	memset(p, 0, sizeof *p);
	p->bus = i;
	snprintf(p->busId, sizeof p->busId, "00000000:%%02x:00.0", i);
	snprintf(p->busIdLegacy, sizeof p->busIdLegacy, "0000:%%02x:00.0", i);
	p->pciDeviceId = 0x20b010de;
	return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
	DEVICE(d);
	m->total = 40ULL << 30; m->free = m->total; m->used = 0;
	return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
	DEVICE(d);
	m->total = 40ULL << 30; m->reserved = 0; m->free = m->total; m->used = 0;
	return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *cur, unsigned int *pend) {
	DEVICE(d);
	*cur = *pend = NVML_DEVICE_MIG_DISABLE;
	return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t d, unsigned int *is) { DEVICE(d); *is = 0; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t d, unsigned int *n) { DEVICE(d); *n = 0; return NVML_SUCCESS; }

/* Per-cgroup memory limits, where limits_file is set and no
   limits_file.not-supported exists: sets are lines appended to it. */
static int limits_supported(void) {
	if (!limits_file[0]) return 0;
	char off[4200];
	snprintf(off, sizeof off, "%%s.not-supported", limits_file);
	FILE *f = fopen(off, "r");
	if (f) { fclose(f); return 0; }
	return 1;
}
nvmlReturn_t nvmlDeviceSetMemoryLimits_v1(nvmlDevice_t d, nvmlSetMemoryLimits_v1_t *l) {
	DEVICE(d);
	if (!limits_supported()) return NVML_ERROR_NOT_SUPPORTED;
	if (!l || !l->nameSpace || !l->nameSpace[0]) return NVML_ERROR_INVALID_ARGUMENT;
	FILE *f = fopen(limits_file, "a");
	if (!f) return NVML_ERROR_UNKNOWN;
	char u[96];
	uuid_of(i, u);
	fprintf(f, "%%s %%s %%llu %%llu\n", u, l->nameSpace, l->softLimit, l->hardLimit);
	fclose(f);
	return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMemoryLimits_v1(nvmlDevice_t d, nvmlGetMemoryLimits_v1_t *l) {
	DEVICE(d);
	if (!limits_supported()) return NVML_ERROR_NOT_SUPPORTED;
	if (!l || !l->nameSpace) return NVML_ERROR_INVALID_ARGUMENT;
	char u[96], lu[96], ns[4096];
	unsigned long long soft, hard;
	uuid_of(i, u);
	l->softLimit = 0; l->hardLimit = NVML_DEVICE_MEMORY_LIMIT_MAX; l->currentUsed = 0;
	FILE *f = fopen(limits_file, "r");
	if (!f) return NVML_SUCCESS;
	while (fscanf(f, "%%95s %%4095s %%llu %%llu", lu, ns, &soft, &hard) == 4) {
		if (strcmp(lu, u) == 0 && strcmp(ns, l->nameSpace) == 0) { l->softLimit = soft; l->hardLimit = hard; }
	}
	fclose(f);
	return NVML_SUCCESS;
}
`

// declared matches a function declaration of nvml.h.
var declared = regexp.MustCompile(`(?m)^(?:DEPRECATED\([^)]*\) )?nvmlReturn_t DECLDIR (nvml\w+)\s*\(`)

// implemented matches a function fakeNVMLImpl defines.
var implemented = regexp.MustCompile(`(?m)^nvmlReturn_t (nvml\w+)\(`)

// fakeNVMLStubs returns C that defines, as returning
// NVML_ERROR_NOT_SUPPORTED (3), every function nvml.h declares that the
// answering part does not: go-nvml calls the driver's functions through
// lazily bound symbols, and a missing one would end the process.
func fakeNVMLStubs(header string) string {
	var done []string
	for _, m := range implemented.FindAllStringSubmatch(fakeNVMLImpl, -1) {
		done = append(done, m[1])
	}
	var b strings.Builder
	b.WriteString("/* Every other NVML function: not supported. */\n")
	seen := map[string]bool{}
	for _, m := range declared.FindAllStringSubmatch(header, -1) {
		name := m[1]
		if seen[name] || slices.Contains(done, name) {
			continue
		}
		seen[name] = true
		fmt.Fprintf(&b, "int %s(void) { return 3; }\n", name)
	}
	return b.String()
}

// nvmlHeader returns the path of go-nvml's nvml.h (NVIDIA's header, as
// go-nvml binds it), from the module the project builds with.
func nvmlHeader() (string, error) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/NVIDIA/go-nvml").Output()
	if err != nil {
		return "", fmt.Errorf("finding go-nvml's module: %w", err)
	}
	h := filepath.Join(strings.TrimSpace(string(out)), "pkg", "nvml", "nvml.h")
	if _, err := os.Stat(h); err != nil {
		return "", err
	}
	return h, nil
}

// BuildNVML compiles the fake driver's NVML into dir as
// libnvidia-ml.so.<Version> and returns its path.
func (d FakeDriver) BuildNVML(dir string) (string, error) {
	if d.Version == "" || d.KernelVersionFile == "" || d.GPUs < 1 || len(d.UUIDPrefix) != 28 {
		return "", errors.New("fake driver: a version, a kernel version file, GPUs and a 28-character UUID prefix are needed")
	}
	header, err := nvmlHeader()
	if err != nil {
		return "", err
	}
	h, err := os.ReadFile(header)
	if err != nil {
		return "", err
	}
	src := filepath.Join(dir, "fake-nvml-"+d.Version)
	impl, stubs := src+".c", src+"-stubs.c"
	if err := os.WriteFile(impl, fmt.Appendf(nil, fakeNVMLImpl, d.GPUs, d.Version, d.KernelVersionFile, d.UUIDPrefix, d.LimitsFile), 0o644); err != nil {
		return "", err
	}
	if err := os.WriteFile(stubs, []byte(fakeNVMLStubs(string(h))), 0o644); err != nil {
		return "", err
	}
	lib := filepath.Join(dir, "libnvidia-ml.so."+d.Version)
	cmd := exec.Command("cc", "-shared", "-fPIC", "-Wl,-soname,libnvidia-ml.so.1", "-I", filepath.Dir(header), "-o", lib, impl, stubs)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building the fake NVML: %w\n%s", err, out)
	}
	return lib, nil
}

// FakeDriverEnv names a directory holding a fake driver built ahead
// (BuildFakeDriver of GuestFakeDriver; of ClusterFakeDriver in its
// ClusterFakeDriverDir), for a node that has no compiler: the VM's.
const FakeDriverEnv = "NRI_GPU_FAKE_DRIVER"

// ClusterFakeDriverDir is where, under FakeDriverEnv's directory,
// ClusterFakeDriver of a cluster's first node is built ahead.
const ClusterFakeDriverDir = "cluster"

// ClusterFakeDriver is the fake driver of the cluster node numbered node
// (from 1: its GPUs' UUIDs, Node.UUID's) as the chart's nri-gpu sees it
// from its container: its kernel module's version under the driver root
// the chart mounts (/run/nvidia/driver, where the GPU Operator puts a
// containerized driver's), its limits file in nri-gpu's state directory
// (hostPaths.stateDir, which it writes).
func ClusterFakeDriver(node int) FakeDriver {
	return FakeDriver{Version: "600.10.01", KernelVersionFile: "/run/nvidia/driver/nvidia-module-version", GPUs: 4,
		UUIDPrefix: nodeUUIDPrefix(node), LimitsFile: "/run/nri-gpu/fake-driver-limits"}
}

// GuestFakeDriver is the fake driver built ahead for the VM's node: the
// suite host's four GPUs, its files under /run/nri-gpu-fake-driver.
func GuestFakeDriver() FakeDriver {
	const dir = "/run/nri-gpu-fake-driver"
	return FakeDriver{Version: "600.10.01", KernelVersionFile: dir + "/nvidia-module-version", GPUs: 4,
		UUIDPrefix: strings.TrimSuffix(UUID(0), "000000000000"), LimitsFile: dir + "/limits"}
}

// BuildFakeDriver builds the libraries of fake driver d into build: its
// NVML (BuildNVML) and a libcuda.so.<Version> whose cuInit succeeds.
func BuildFakeDriver(d FakeDriver, build string) error {
	if err := os.MkdirAll(build, 0o755); err != nil {
		return err
	}
	if _, err := d.BuildNVML(build); err != nil {
		return err
	}
	src := filepath.Join(build, "cuda-"+d.Version+".c")
	if err := os.WriteFile(src, []byte("int cuInit(unsigned f) { (void)f; return 0; }\n"), 0o644); err != nil {
		return err
	}
	cmd := exec.Command("cc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", filepath.Join(build, "libcuda.so."+d.Version), src)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building the fake libcuda: %w\n%s", err, out)
	}
	return nil
}

// InstallFakeDriver installs version of a fake driver built in build
// (its libcuda.so.<version> and libnvidia-ml.so.<version>) into libDir
// as a driver installer does: the libraries, libnvidia-ml.so.1 pointed
// at the new NVML, the previous version's libraries removed (none when
// previous is empty), and the kernel module's version written last into
// kernelFile (the module reloaded).
func InstallFakeDriver(build, libDir, kernelFile, version, previous string) error {
	if err := os.MkdirAll(libDir, 0o755); err != nil {
		return err
	}
	libs := []string{"libcuda.so.", "libnvidia-ml.so."}
	for _, lib := range libs {
		data, err := os.ReadFile(filepath.Join(build, lib+version))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(libDir, lib+version), data, 0o755); err != nil {
			return err
		}
	}
	link := filepath.Join(libDir, "libnvidia-ml.so.1")
	if err := os.Symlink("libnvidia-ml.so."+version, link+".new"); err != nil {
		return err
	}
	if err := os.Rename(link+".new", link); err != nil {
		return err
	}
	if previous != "" {
		for _, lib := range libs {
			if err := os.Remove(filepath.Join(libDir, lib+previous)); err != nil {
				return err
			}
		}
	}
	return os.WriteFile(kernelFile, []byte(version+"\n"), 0o644)
}
