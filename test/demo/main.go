// Command demo shows nri-gpu at work: it starts a throwaway containerd 1.7
// (CDI off, NRI on) with nri-gpu and a fake GPU host in a temp dir, runs a
// pod that asks for a GPU through an annotation, shows what the container
// received, and cleans everything up. `make demo` builds what it needs and
// runs it; it needs root.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/nri-gpu/nri-gpu/test/harness"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "demo: %v\n", err)
		os.Exit(1)
	}
}

func step(format string, args ...any) { fmt.Printf("\n==> "+format+"\n", args...) }

func run() (err error) {
	if os.Geteuid() != 0 {
		return fmt.Errorf("the demo needs root (it makes device nodes and runs containers); run: sudo make demo")
	}
	tools, err := harness.FindTools("")
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("/tmp", "nri-gpu-demo-") // short: it holds unix sockets, whatever TMPDIR is
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	step("Fake GPU host in %s: two GPUs as real char devices (major 195), a driver library, a hook", dir)
	host, err := harness.NewGPUHost(dir, 2)
	if err != nil {
		return err
	}
	fmt.Printf("CDI spec %s defines:\n", filepath.Join(host.SpecDir, "nvidia.yaml"))
	for i := 0; i < host.GPUs; i++ {
		fmt.Printf("  nvidia.com/gpu=%d  nvidia.com/gpu=%s\n", i, harness.UUID(i))
	}

	step("Throwaway containerd 1.7 (enable_cdi = false, NRI on) with a local busybox image")
	image := filepath.Join(dir, "busybox.tar")
	if err := harness.BuildImage(tools.Busybox, image); err != nil {
		return err
	}
	ctd, err := harness.StartContainerd(filepath.Join(dir, "containerd"), tools, harness.Options{Image: image})
	if err != nil {
		return err
	}
	defer func() {
		step("Cleaning up: pods removed, containerd and shims stopped, mounts gone")
		if stopErr := ctd.Stop(); stopErr != nil && err == nil {
			err = stopErr
		}
	}()
	config := filepath.Join(dir, "nri-gpu.yaml")
	if err := os.WriteFile(config, []byte(host.PluginConfig(nil, "exclusive: true")), 0o644); err != nil {
		return err
	}
	plugin, err := ctd.StartPlugin("--config", config)
	if err != nil {
		return err
	}
	fmt.Println("nri-gpu registered with containerd over NRI")

	step("Pod 'agent-1' with annotation gpus.nri-gpu.io: \"1\" (short for nvidia.com/gpu=1)")
	pod := harness.Pod{Name: "agent-1", Namespace: "demo", Annotations: map[string]string{"gpus.nri-gpu.io": "1"}}
	podID, err := ctd.RunPod(pod)
	if err != nil {
		return err
	}
	id, err := ctd.CreateContainer(podID, pod, harness.Container{Name: "worker"})
	if err != nil {
		return err
	}
	if err := ctd.StartContainer(id); err != nil {
		return err
	}

	step("Inside the container: ls -l /dev/nvidia*  (GPU 1 only, not GPU 0)")
	out, err := ctd.Exec(id, "sh", "-c", "ls -l /dev/nvidia*")
	if err != nil {
		return fmt.Errorf("%w: %s", err, out)
	}
	fmt.Println(out)
	if !strings.Contains(out, "/dev/nvidia1") || strings.Contains(out, "/dev/nvidia0") {
		return fmt.Errorf("the container did not get exactly GPU 1")
	}

	step("The edits nri-gpu injected, from `ctr -n k8s.io containers info`")
	spec, err := ctd.ContainerSpec(id)
	if err != nil {
		return err
	}
	for _, d := range spec.Linux.Devices {
		fmt.Printf("device  %s  %s %d:%d\n", d.Path, d.Type, d.Major, d.Minor)
	}
	for _, r := range spec.Linux.Resources.Devices {
		if r.Allow && r.Major != nil && r.Minor != nil {
			fmt.Printf("cgroup  allow %s %d:%d %s\n", r.Type, *r.Major, *r.Minor, r.Access)
		}
	}
	for _, e := range spec.Process.Env {
		if strings.HasPrefix(e, "NVIDIA_") || strings.HasPrefix(e, "FAKE_") {
			fmt.Printf("env     %s\n", e)
		}
	}
	for _, m := range spec.Mounts {
		if strings.HasPrefix(m.Source, host.Root) {
			fmt.Printf("mount   %s -> %s (%s)\n", m.Source, m.Destination, strings.Join(m.Options, ","))
		}
	}
	if spec.Hooks != nil {
		for _, h := range spec.Hooks.CreateContainer {
			fmt.Printf("hook    createContainer %s\n", strings.Join(h.Args, " "))
		}
		for _, h := range spec.Hooks.Poststart {
			fmt.Printf("hook    poststart %s\n", strings.Join(h.Args, " "))
		}
	}
	runs, err := host.HookRuns()
	if err != nil {
		return err
	}
	fmt.Printf("hook runs recorded on the host: %d\n", len(runs))

	step("Pod 'agent-2' asks for the same GPU by UUID: refused, GPU 1 is agent-1's (policy.exclusive)")
	pod2 := harness.Pod{Name: "agent-2", Namespace: "demo", Annotations: map[string]string{"gpus.nri-gpu.io": harness.UUID(1)}}
	pod2ID, err := ctd.RunPod(pod2)
	if err != nil {
		return err
	}
	if _, err := ctd.CreateContainer(pod2ID, pod2, harness.Container{Name: "worker"}); err == nil {
		return fmt.Errorf("agent-2 got agent-1's GPU")
	}

	step("nri-gpu's log of the decisions")
	for _, line := range strings.Split(plugin.Log(), "\n") {
		if strings.Contains(line, "injected devices") || strings.Contains(line, "denied") {
			fmt.Println(line)
		}
	}
	return nil
}
