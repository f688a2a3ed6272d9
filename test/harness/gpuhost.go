package harness

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// NVIDIA's character device majors: 195 for /dev/nvidiaN and /dev/nvidiactl
// (minor 255). The uvm major is dynamic on a real host; FakeUVMMajor
// stands in for it.
const (
	NvidiaMajor  = 195
	NvidiaCtl    = 255
	FakeUVMMajor = 510
)

// GPUHost is a fake GPU host: real character device nodes with NVIDIA's
// numbers, a fake driver library, hooks that record that they ran, and a
// CDI spec describing them.
type GPUHost struct {
	// Root holds dev/, lib/ and bin/ of the fake host.
	Root string
	// SpecDir holds the CDI spec (nvidia.yaml).
	SpecDir string
	// HookLog is where the hooks append a line each time they run.
	HookLog string
	// GPUs is the number of fake GPUs (devices "0".."N-1").
	GPUs int
}

// UUID returns the fake UUID of GPU i, its second CDI name.
func UUID(i int) string { return fmt.Sprintf("GPU-00000000-0000-0000-0000-%012d", i) }

// LibraryContent is what the fake driver library holds.
const LibraryContent = "fake libcuda for nri-gpu e2e\n"

// NewGPUHost creates a fake host with n GPUs under dir. It needs root, to
// make device nodes.
func NewGPUHost(dir string, n int) (*GPUHost, error) {
	h := &GPUHost{
		Root:    filepath.Join(dir, "gpuhost"),
		SpecDir: filepath.Join(dir, "cdi"),
		HookLog: filepath.Join(dir, "gpuhost", "hooks.log"),
		GPUs:    n,
	}
	for _, d := range []string{"dev", "lib", "bin"} {
		if err := os.MkdirAll(filepath.Join(h.Root, d), 0o755); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(h.SpecDir, 0o755); err != nil {
		return nil, err
	}
	if err := mknodGPUs(filepath.Join(h.Root, "dev"), n); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(h.Root, "lib", "libcuda.so.1"), []byte(LibraryContent), 0o644); err != nil {
		return nil, err
	}
	hook := fmt.Sprintf(`#!/bin/sh
# Records the hook point and the container id from the OCI state on stdin,
# and a leak line if the hook sees an LD_PRELOAD.
state=$(cat)
id=${state#*\"id\":\"}
id=${id%%%%\"*}
echo "$1 $id" >> %[1]s
if [ -n "${LD_PRELOAD+set}" ]; then echo "LD_PRELOAD-LEAK $1 $id" >> %[1]s; fi
`, h.HookLog)
	if err := os.WriteFile(h.HookPath(), []byte(hook), 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(h.SpecDir, "nvidia.yaml"), []byte(h.Spec()), 0o644); err != nil {
		return nil, err
	}
	return h, h.writeOddSpecs()
}

// mknodGPUs makes, in dir, the device nodes of n fake GPUs with NVIDIA's
// numbers (nvidia0..N-1, nvidiactl) and a fake nvidia-uvm, readable and
// writable by all.
func mknodGPUs(dir string, n int) error {
	nodes := map[string][2]uint32{
		"nvidiactl":  {NvidiaMajor, NvidiaCtl},
		"nvidia-uvm": {FakeUVMMajor, 0},
	}
	for i := 0; i < n; i++ {
		nodes[fmt.Sprintf("nvidia%d", i)] = [2]uint32{NvidiaMajor, uint32(i)}
	}
	for name, num := range nodes {
		if err := mknod(filepath.Join(dir, name), num[0], num[1]); err != nil {
			return err
		}
	}
	return nil
}

// mknod makes a character device node major:minor at path, readable and
// writable by all.
func mknod(path string, major, minor uint32) error {
	if err := unix.Mknod(path, unix.S_IFCHR|0o666, int(unix.Mkdev(major, minor))); err != nil {
		return fmt.Errorf("mknod %s (needs root): %w", path, err)
	}
	return os.Chmod(path, 0o666)
}

// Kinds of the odd specs beside the GPU spec.
const (
	// BadHookKind's device injects a hook at BadHookPath.
	BadHookKind = "example.com/badhook"
	BadHookPath = "/usr/bin/evil-hook"
	// UntrustedKind's spec file is writable by everyone.
	UntrustedKind = "example.com/untrusted"
)

// writeOddSpecs writes a spec whose device injects a hook nobody allowed,
// and a world-writable spec.
func (h *GPUHost) writeOddSpecs() error {
	node := fmt.Sprintf("      deviceNodes: [{path: /dev/odd0, hostPath: %s}]\n", h.Dev("nvidia0"))
	badHook := fmt.Sprintf("cdiVersion: \"0.6.0\"\nkind: %s\ndevices:\n  - name: \"0\"\n    containerEdits:\n%s      hooks: [{hookName: createContainer, path: %s}]\n",
		BadHookKind, node, BadHookPath)
	if err := os.WriteFile(filepath.Join(h.SpecDir, "badhook.yaml"), []byte(badHook), 0o644); err != nil {
		return err
	}
	untrusted := filepath.Join(h.SpecDir, "untrusted.yaml")
	spec := fmt.Sprintf("cdiVersion: \"0.6.0\"\nkind: %s\ndevices:\n  - name: \"0\"\n    containerEdits:\n%s", UntrustedKind, node)
	if err := os.WriteFile(untrusted, []byte(spec), 0o644); err != nil {
		return err
	}
	return os.Chmod(untrusted, 0o666)
}

// PluginConfig returns an nri-gpu configuration for this host: its spec
// dir (and extraDirs after it), and a policy that allows its hook, with
// the given policy keys (YAML lines indented under policy:) added.
func (h *GPUHost) PluginConfig(extraDirs []string, policy ...string) string {
	dirs := append([]string{h.SpecDir}, extraDirs...)
	return fmt.Sprintf("cdiSpecDirs: [%s]\npolicy:\n  hookPaths: [%s]\n  %s\n",
		strings.Join(dirs, ", "), h.HookPath(), strings.Join(policy, "\n  "))
}

// Dev returns the host path of a fake device node.
func (h *GPUHost) Dev(name string) string { return filepath.Join(h.Root, "dev", name) }

// HookPath is the hook executable named in the spec.
func (h *GPUHost) HookPath() string { return filepath.Join(h.Root, "bin", "record-hook") }

// Spec returns the CDI spec of the fake host: per GPU a device by index and
// one by UUID, an "all" device, and spec-level edits (control nodes, the
// driver library, env, and a createContainer hook with an environment and
// a poststart hook without one) shared by all.
func (h *GPUHost) Spec() string {
	var b strings.Builder
	fmt.Fprintf(&b, `cdiVersion: "0.6.0"
kind: nvidia.com/gpu
containerEdits:
  env:
    - NVIDIA_VISIBLE_DEVICES=void
    - FAKE_DRIVER=1
  deviceNodes:
    - path: /dev/nvidiactl
      hostPath: %[1]s
    - path: /dev/nvidia-uvm
      hostPath: %[2]s
  mounts:
    - hostPath: %[3]s
      containerPath: /usr/lib/libcuda.so.1
      options: [ro, nosuid, nodev, bind]
  hooks:
    - hookName: createContainer
      path: %[4]s
      args: [record-hook, createContainer]
      env: [PATH=/usr/bin:/bin]
    - hookName: poststart
      path: %[4]s
      args: [record-hook, poststart]
devices:
`, h.Dev("nvidiactl"), h.Dev("nvidia-uvm"), filepath.Join(h.Root, "lib", "libcuda.so.1"), h.HookPath())
	writeDevices(&b, h.GPUs, h.Dev, UUID)
	return b.String()
}

// deviceSpec returns the CDI spec of n fake GPUs whose device nodes are
// at dev(name) and whose UUIDs are uuid(i), with nothing but their nodes
// and environment: per GPU a device by index and one by UUID, an "all"
// device, and nvidiactl shared by all.
func deviceSpec(n int, dev func(string) string, uuid func(int) string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "cdiVersion: \"0.6.0\"\nkind: nvidia.com/gpu\ncontainerEdits:\n  deviceNodes:\n    - path: /dev/nvidiactl\n      hostPath: %s\ndevices:\n", dev("nvidiactl"))
	writeDevices(&b, n, dev, uuid)
	return b.String()
}

// writeDevices writes the devices of n fake GPUs into a spec: per GPU a
// device by index and one by UUID (its node at dev(name) and an env
// entry naming its UUID, uuid(i)), and an "all" device.
func writeDevices(b *strings.Builder, n int, dev func(string) string, uuid func(int) string) {
	var all []string
	for i := 0; i < n; i++ {
		node := fmt.Sprintf("        - path: /dev/nvidia%d\n          hostPath: %s\n", i, dev(fmt.Sprintf("nvidia%d", i)))
		all = append(all, node)
		for _, name := range []string{fmt.Sprint(i), uuid(i)} {
			fmt.Fprintf(b, "  - name: %q\n    containerEdits:\n      env: [FAKE_GPU_%d=%s]\n      deviceNodes:\n%s", name, i, uuid(i), node)
		}
	}
	fmt.Fprintf(b, "  - name: all\n    containerEdits:\n      deviceNodes:\n%s", strings.Join(all, ""))
}

// HookRuns returns the lines the hooks wrote: "<hook point> <container id>".
func (h *GPUHost) HookRuns() ([]string, error) {
	data, err := os.ReadFile(h.HookLog)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return strings.Split(strings.TrimSpace(string(data)), "\n"), nil
}
