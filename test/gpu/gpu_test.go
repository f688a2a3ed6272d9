// Package gpu checks nri-gpu on a real NVIDIA host (test/gpu/run.sh runs
// it there); elsewhere its test skips and says why.
package gpu

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/nri-gpu/nri-gpu/test/harness"
)

// RealEnv, set to 1 by run.sh, says that the host has an NVIDIA GPU.
const RealEnv = "NRI_GPU_REAL"

// probe loads libcuda.so.1 by soname, as CUDA programs do, and calls
// cuInit and cuDeviceGetCount.
const probe = `#include <dlfcn.h>
#include <stdio.h>
int main(void) {
	void *h = dlopen("libcuda.so.1", RTLD_NOW);
	if (!h) { printf("dlopen libcuda.so.1: %s\n", dlerror()); return 1; }
	int (*init)(unsigned) = (int (*)(unsigned))dlsym(h, "cuInit");
	int (*count)(int *) = (int (*)(int *))dlsym(h, "cuDeviceGetCount");
	if (!init || !count) { printf("dlsym: %s\n", dlerror()); return 1; }
	int n = -1;
	int r = init(0);
	int c = count(&n);
	printf("cuInit=%d cuDeviceGetCount=%d devices=%d\n", r, c, n);
	return r != 0 || c != 0;
}
`

// Containerd2Env names the directory of containerd 2.x's binaries (run.sh
// sets it to make e2e-tools' 2.3.7), which runs the hook-free row.
const Containerd2Env = "NRI_GPU_CONTAINERD2"

// TestRealGPU generates the spec of the host's GPUs with nri-gpu (real
// NVML) and gives GPU 0 to a container that loads libcuda.so.1 by
// soname, calls cuInit and cuDeviceGetCount, and runs nvidia-smi -L,
// printing what it saw: with the spec's hooks on a throwaway containerd
// 1.7, and hook-free (no OCI hook reaches the container) on containerd
// 2.x whose NRI validator refuses every hook a plugin adds.
func TestRealGPU(t *testing.T) {
	if os.Getenv(RealEnv) != "1" {
		t.Skipf("needs an NVIDIA GPU and root: run test/gpu/run.sh on a GPU node (it sets %s=1)", RealEnv)
	}
	for _, tc := range []struct {
		name     string
		hookFree bool
	}{
		{name: "hooks"},
		{name: "hook-free", hookFree: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			files := program(t, dir, "probe", probe)
			// nvidia-smi comes from the spec; the C libraries it needs from here.
			if smi, err := exec.LookPath("nvidia-smi"); err == nil {
				more, err := harness.ProgramFiles(smi, "tmp/nvidia-smi-of-the-host")
				if err != nil {
					t.Fatal(err)
				}
				files = append(files, more[1:]...)
			}
			specDir, ctd := realNode(t, dir, files, tc.hookFree)
			config := filepath.Join(dir, "nri-gpu.yaml")
			if err := os.WriteFile(config, []byte(fmt.Sprintf("cdiSpecDirs: [%s]\nhookFree: %v\n", specDir, tc.hookFree)), 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := ctd.StartPlugin("--config", config); err != nil {
				t.Fatal(err)
			}
			pod := harness.Pod{Name: "gpu", Namespace: "default", Annotations: map[string]string{"gpus.nri-gpu.io": "0"}}
			podID, err := ctd.RunPod(pod)
			if err != nil {
				t.Fatal(err)
			}
			id, err := ctd.CreateContainer(podID, pod, harness.Container{Name: "cuda"})
			if err != nil {
				t.Fatal(err)
			}
			if err := ctd.StartContainer(id); err != nil {
				t.Fatal(err)
			}
			spec, err := ctd.ContainerSpec(id)
			if err != nil {
				t.Fatal(err)
			}
			if h := spec.Hooks; tc.hookFree && h != nil && len(h.CreateRuntime)+len(h.CreateContainer)+len(h.StartContainer)+len(h.Prestart)+len(h.Poststart) > 0 {
				t.Errorf("the hook-free container has OCI hooks: %+v", h)
			}
			out, err := ctd.Exec(id, "/probe")
			t.Logf("the probe in the container:\n%s", out)
			if err != nil || !regexp.MustCompile(`cuInit=0 cuDeviceGetCount=0 devices=[1-9]`).MatchString(out) {
				t.Errorf("CUDA did not load or found no device: %v", err)
			}
			out, err = ctd.Exec(id, "nvidia-smi", "-L")
			t.Logf("nvidia-smi -L in the container:\n%s", out)
			if err != nil || !strings.Contains(out, "GPU 0:") {
				t.Errorf("nvidia-smi -L: %v", err)
			}
		})
	}
}

// program compiles the C source src as name in dir and returns it and
// the C libraries it needs, as files of an image.
func program(t *testing.T, dir, name, src string) []harness.File {
	t.Helper()
	c := filepath.Join(dir, name+".c")
	if err := os.WriteFile(c, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cc", "-o", filepath.Join(dir, name), c, "-ldl").CombinedOutput(); err != nil {
		t.Fatalf("cc: %v\n%s", err, out)
	}
	files, err := harness.ProgramFiles(filepath.Join(dir, name), name)
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// realNode builds an image of busybox and files, generates the spec of
// the host's GPUs with nri-gpu (real NVML) into dir/cdi, and starts a
// throwaway containerd with the image, stopped when the test ends: the
// tools' containerd 1.7, or, with rejectHooks, containerd 2.x from
// $NRI_GPU_CONTAINERD2 with NRI's default validator refusing every OCI
// hook a plugin adds.
func realNode(t *testing.T, dir string, files []harness.File, rejectHooks bool) (specDir string, ctd *harness.Containerd) {
	t.Helper()
	tools, err := harness.FindTools("")
	if err != nil {
		t.Fatal(err)
	}
	if rejectHooks {
		if tools, err = tools.WithContainerd(os.Getenv(Containerd2Env)); err != nil || !tools.Containerd2() {
			t.Fatalf("containerd 2.x in $%s (run.sh sets it): %v", Containerd2Env, err)
		}
	}
	image := filepath.Join(dir, "image.tar")
	if err := harness.BuildImage(tools.Busybox, image, files...); err != nil {
		t.Fatal(err)
	}
	specDir = filepath.Join(dir, "cdi")
	if err := os.MkdirAll(specDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(tools.Path("nri-gpu"), "generate", "--output", filepath.Join(specDir, "nvidia.yaml")).CombinedOutput(); err != nil {
		t.Fatalf("nri-gpu generate: %v\n%s", err, out)
	}
	ctd, err = harness.StartContainerd(filepath.Join(dir, "ctd"), tools, harness.Options{Image: image, RejectHooks: rejectHooks})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ctd.Stop(); err != nil {
			t.Error(err)
		}
	})
	return specDir, ctd
}
