package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/containerd/nri/pkg/api"
	"golang.org/x/sys/unix"

	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/memlimit"
	"github.com/nri-gpu/nri-gpu/pkg/plugin"
	"github.com/nri-gpu/nri-gpu/test/harness"
)

// memoryBounds times a container's creation and start in process with
// and without the driver's memory bounds: a GPU time-slicing shares with
// its memory counted (bounded at start: NVML opened, the container's
// cgroup found, the limit set) against the same GPU with its memory not
// counted (nothing set). The driver is a fake NVML that go-nvml dlopens
// as it would NVIDIA's, writing each limit to a file; a real driver's
// own work in the call is not in it.
func (r *report) memoryBounds() {
	dir, err := os.MkdirTemp("/tmp", "nri-gpu-bench-bounds-")
	must(err)
	defer os.RemoveAll(dir)
	host, err := harness.NewGPUHost(dir, 2)
	must(err)
	root, lib := filepath.Join(dir, "root"), filepath.Join(dir, "root", "usr", "lib64")
	d := harness.GuestFakeDriver()
	d.KernelVersionFile, d.LimitsFile, d.GPUs = filepath.Join(root, "nvidia-module-version"), filepath.Join(dir, "limits"), 2
	must(harness.BuildFakeDriver(d, filepath.Join(dir, "build")))
	must(harness.InstallFakeDriver(filepath.Join(dir, "build"), lib, d.KernelVersionFile, d.Version, ""))
	cg := memlimit.Cgroups{Proc: filepath.Join(dir, "proc"), Root: filepath.Join(dir, "cgroup")}
	must(os.MkdirAll(filepath.Join(cg.Proc, "1001"), 0o755))
	must(os.MkdirAll(cg.Root, 0o755))
	must(unix.Mount("nri-gpu-bench", cg.Root, "cgroup2", 0, ""))
	defer unix.Unmount(cg.Root, unix.MNT_DETACH)
	must(os.WriteFile(filepath.Join(cg.Proc, "1001", "cgroup"), []byte("0::/bench/timed\n"), 0o644))

	build := func(memory string) *plugin.Plugin {
		cfg, err := config.Parse([]byte(host.PluginConfig(nil, `sharing: [{devices: ["nvidia.com/gpu=0"], replicas: 2`+memory+`}]`)))
		must(err)
		p, err := plugin.New(cfg, quiet(), plugin.WithNVML(nvml.New(nvml.WithLibraryPath(filepath.Join(lib, "libnvidia-ml.so.1")))), plugin.WithCgroups(cg))
		must(err)
		_, err = p.Synchronize(context.Background(), nil, nil)
		must(err)
		return p
	}
	variants := []struct {
		name string
		p    *plugin.Plugin
	}{{"memory not counted (no bound)", build("")}, {"memory counted (bounded at start)", build(", memory: 40Gi")}}
	pod := &api.PodSandbox{Id: "timed", Name: "timed", Namespace: "ns", Annotations: map[string]string{"gpus.nri-gpu.io": "0"}}
	ctr := &api.Container{Id: "timed", PodSandboxId: "timed", Name: "c", Pid: 1001, Linux: &api.LinuxContainer{}}
	const blocks = 20
	times := make([][]time.Duration, len(variants))
	for b := -1; b < blocks; b++ {
		for i, v := range variants {
			runtime.GC()
			for range samples / blocks {
				start := time.Now()
				_, _, err := v.p.CreateContainer(context.Background(), pod, ctr)
				must(err)
				must(v.p.StartContainer(context.Background(), pod, ctr))
				if b >= 0 {
					times[i] = append(times[i], time.Since(start))
				}
			}
		}
	}
	for _, v := range variants {
		v.p.Close()
	}
	set, err := harness.ReadLimits(d.LimitsFile)
	must(err)
	if len(set) < samples {
		must(fmt.Errorf("the bounded variant set %d limits, want one per start", len(set)))
	}
	r.printf("## GPU memory bounds\n\nnri-gpu's `CreateContainer` and `StartContainer` in process, one container of a pod given GPU 0, which time-slicing shares two ways, %d times each with its memory not counted (nothing to bound) and counted (40Gi: at each start NVML is opened, the container's cgroup read from /proc and the limit set), interleaved in blocks of %d. The driver is a fake NVML loaded by go-nvml's dlopen, as NVIDIA's is, that appends each limit to a file; a real driver's own work in the call is not in it.\n\n", samples, samples/blocks)
	r.printf("| GPU memory | p50 | p99 |\n|---|---|---|\n")
	for i, v := range variants {
		r.printf("| %s | %s | %s |\n", v.name, us(percentile(times[i], 50)), us(percentile(times[i], 99)))
	}
	r.printf("\n")
	ratio := float64(percentile(times[1], 50)) / float64(percentile(times[0], 50))
	r.results = append(r.results, target{"create and start p50, memory bounded / not", "≤ 1.5", fmt.Sprintf("%.3f", ratio), ratio <= 1.5,
		"opening NVML and the call into the driver at each start: a real driver's call is not measured here"})
}
