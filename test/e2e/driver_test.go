package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/plugin"
	"github.com/nri-gpu/nri-gpu/test/harness"
)

// cudaProbe dlopens libcuda.so.1 by soname and prints what cuInit of the
// fake driver returns: the driver's major version.
const cudaProbe = `#include <dlfcn.h>
#include <stdio.h>
int main(void) {
	void *h = dlopen("libcuda.so.1", RTLD_NOW);
	if (!h) { printf("dlopen: %s\n", dlerror()); return 1; }
	int (*fn)(unsigned) = (int (*)(unsigned))dlsym(h, "cuInit");
	if (!fn) { printf("dlsym: %s\n", dlerror()); return 1; }
	printf("cuInit=%d\n", fn(0));
	return 0;
}
`

// fakeDriverVersion is one version of the fake driver of TestDriverUpgrade.
type fakeDriverVersion struct {
	version string
	major   int
}

// TestDriverUpgrade: the node's NVIDIA driver is upgraded under a
// running nri-gpu that generates the spec from NVML (a fake driver whose
// libnvidia-ml is a real shared object go-nvml dlopens, its kernel
// module's version in a file; libcuda a real shared object too), as a
// driver installer does it: the new libraries written, libnvidia-ml.so.1
// pointed at the new one, the old ones removed, the module reloaded. The
// NVML nri-gpu has loaded is then the old one, which NVIDIA's refuses to
// run against the new module ("Driver/library version mismatch"), so
// nri-gpu restarts itself in place to load the new one. Containers
// created afterwards load the new driver's libcuda by soname; the one
// created before keeps the old, and its holding; nri-gpu check warns
// about a spec naming the removed files.
func TestDriverUpgrade(t *testing.T) {
	needEnv(t)
	old, upgraded := fakeDriverVersion{"550.54.15", 550}, fakeDriverVersion{"560.35.03", 560}
	dir := filepath.Join(env.dir, "driver-upgrade")
	build, root := filepath.Join(dir, "build"), filepath.Join(dir, "root")
	libDir := filepath.Join(root, "usr", "lib64")
	for _, d := range []string{build, libDir, filepath.Join(root, "dev")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	kernel := filepath.Join(root, "nvidia-module-version")
	for _, v := range []fakeDriverVersion{old, upgraded} {
		src := filepath.Join(build, "cuda-"+v.version+".c")
		if err := os.WriteFile(src, fmt.Appendf(nil, "int cuInit(unsigned f) { (void)f; return %d; }\n", v.major), 0o644); err != nil {
			t.Fatal(err)
		}
		compileC(t, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", filepath.Join(build, "libcuda.so."+v.version), src)
		d := harness.FakeDriver{Version: v.version, KernelVersionFile: kernel, GPUs: 1, UUIDPrefix: "GPU-5d0c8a4e-93b1-4c7a-8e2f-"}
		if _, err := d.BuildNVML(build); err != nil {
			t.Fatal(err)
		}
	}
	probe := filepath.Join(build, "probe.c")
	if err := os.WriteFile(probe, []byte(cudaProbe), 0o644); err != nil {
		t.Fatal(err)
	}
	compileC(t, "-o", filepath.Join(build, "probe"), probe, "-ldl")
	files, err := harness.ProgramFiles(filepath.Join(build, "probe"), "probe")
	if err != nil {
		t.Fatal(err)
	}
	image := filepath.Join(dir, "image.tar")
	if err := harness.BuildImage(env.tools.Busybox, image, files...); err != nil {
		t.Fatal(err)
	}
	for name, minor := range map[string]uint32{"nvidia0": 0, "nvidiactl": 255} {
		if err := unix.Mknod(filepath.Join(root, "dev", name), unix.S_IFCHR|0o666, int(unix.Mkdev(harness.NvidiaMajor, minor))); err != nil {
			t.Fatal(err)
		}
	}
	if err := harness.InstallFakeDriver(build, libDir, kernel, old.version, ""); err != nil {
		t.Fatal(err)
	}

	specDir := filepath.Join(dir, "cdi")
	ctd := extraContainerd(t, "driver-upgrade", harness.Options{Image: image})
	config := filepath.Join(ctd.Dir, "nri-gpu.yaml")
	if err := os.WriteFile(config, fmt.Appendf(nil, "version: v1\ncdiSpecDirs: [%s]\ngenerate: {enabled: true, interval: 200ms}\npolicy:\n  devices: [\"*/*\"]\n  exclusive: true\nstart:\n  driverRoot: %s\n", specDir, root), 0o644); err != nil {
		t.Fatal(err)
	}
	nri, err := ctd.StartPlugin("--config", config)
	if err != nil {
		t.Fatal(err)
	}
	spec := filepath.Join(specDir, plugin.GeneratedSpecName)
	generated := func(v fakeDriverVersion) func() bool {
		return func() bool {
			data, err := os.ReadFile(spec)
			return err == nil && strings.Contains(string(data), "libcuda.so."+v.version)
		}
	}
	testutil.Within(t, 10*time.Second, "the spec of driver "+old.version, generated(old))
	stale, err := os.ReadFile(spec)
	if err != nil {
		t.Fatal(err)
	}
	probeSays := func(id string, v fakeDriverVersion) {
		t.Helper()
		out, err := ctd.Exec(id, "/probe")
		if err != nil || !strings.Contains(out, fmt.Sprintf("cuInit=%d", v.major)) {
			t.Errorf("the container's probe said %q (%v), want libcuda of driver %s (cuInit=%d)", strings.TrimSpace(out), err, v.version, v.major)
		}
	}
	// The spec is read a moment after it is written.
	started := func(podID string, pod harness.Pod) string {
		t.Helper()
		var id string
		var err error
		testutil.Within(t, 10*time.Second, "a container given GPU 0", func() bool {
			id, err = ctd.CreateContainer(podID, pod, harness.Container{Name: "cuda"})
			return err == nil
		})
		if err := ctd.StartContainer(id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	podBefore, before := newPod(t, ctd, map[string]string{"gpus.nri-gpu.io": "0"})
	idBefore := started(podBefore, before)
	probeSays(idBefore, old)

	pid := nri.Pid()
	if err := harness.InstallFakeDriver(build, libDir, kernel, upgraded.version, old.version); err != nil {
		t.Fatal(err)
	}
	upgradedAt := time.Now()
	testutil.Within(t, 20*time.Second, "the spec of driver "+upgraded.version, generated(upgraded))
	t.Logf("the spec of driver %s written %s after the upgrade", upgraded.version, time.Since(upgradedAt).Round(time.Millisecond))
	log := nri.Log()
	if !strings.Contains(log, "version mismatch") {
		t.Errorf("nri-gpu's log does not say why it loaded NVML again:\n%s", log)
	}
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, "driver") || strings.Contains(l, "start") {
			t.Logf("nri-gpu: %s", l)
		}
	}
	if nri.Pid() != pid {
		t.Errorf("nri-gpu is another process (%d, was %d), want the same one, restarted in place", nri.Pid(), pid)
	}

	// The GPU is still held by the container created before: a pod asking
	// for it now is refused; once it is gone, a new one gets the new driver.
	probeSays(idBefore, old)
	podAfter, after := newPod(t, ctd, map[string]string{"gpus.nri-gpu.io": "0"})
	if _, err := ctd.CreateContainer(podAfter, after, harness.Container{Name: "cuda"}); err == nil {
		t.Error("a second pod was given GPU 0 while the pod created before the upgrade holds it")
	}
	if out, err := ctd.Crictl("rmp", "--force", podBefore); err != nil {
		t.Fatalf("removing the pod created before the upgrade: %v\n%s", err, out)
	}
	podAfter, after = newPod(t, ctd, map[string]string{"gpus.nri-gpu.io": "0"})
	probeSays(started(podAfter, after), upgraded)

	// A spec written for the old driver names files that are gone.
	staleDir := filepath.Join(dir, "stale-cdi")
	if err := os.MkdirAll(staleDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(staleDir, "nvidia.yaml"), stale, 0o644); err != nil {
		t.Fatal(err)
	}
	out, _ := nriGPU(t, "check", "--config", config, "--containerd-config", "", "--cdi-spec-dirs", staleDir, "--socket-path", ctd.NRISock, "--state-file", filepath.Join(dir, "none.json"))
	if !strings.Contains(out, "libcuda.so."+old.version) {
		t.Errorf("nri-gpu check on a spec of the removed driver does not name its missing libcuda:\n%s", out)
	}
	// This fake driver answers NOT_SUPPORTED for per-cgroup memory
	// limits, as a driver older than CUDA 13.4's GPUs do: check says the
	// driver cannot bound GPU memory, through a real dlopen of its NVML.
	if !regexp.MustCompile(`WARN +GPU memory limits +the driver cannot bound GPU memory per container here: .*GPU-[0-9a-f-]+: the driver cannot enforce GPU memory limits: reading the memory limits of GPU-[0-9a-f-]+: Not Supported`).MatchString(out) {
		t.Errorf("nri-gpu check on a driver without memory limits does not say so:\n%s", out)
	}
}
