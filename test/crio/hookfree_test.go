package crio

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// hookFreeSpec is shaped like nvidia-ctk's output: a node, a library
// mount and NVIDIA's create-symlinks hook making a development link to
// it (%s is the library's host path).
const hookFreeSpec = `cdiVersion: "0.6.0"
kind: example.com/gpu
devices:
  - name: "0"
    containerEdits:
      deviceNodes:
        - {path: /dev/examplegpu0, hostPath: /dev/null}
      mounts:
        - {hostPath: %s, containerPath: /usr/lib/x86_64-linux-gnu/libexample.so.570.1, options: [ro, nosuid, nodev, bind]}
      hooks:
        - {hookName: createContainer, path: /usr/bin/nvidia-cdi-hook, args: [nvidia-cdi-hook, create-symlinks, --link, libexample.so.570.1::/usr/lib/x86_64-linux-gnu/libexample.so]}
`

// TestHookFreeOnCRIO: with hookFree, a device whose spec carries
// NVIDIA's create-symlinks hook reaches a CRI-O container with no OCI
// hook at all (CRI-O 1.34 asks plugins no validation, so none refuses a
// hook; none is there to refuse): its node, its library, and the link the
// hook would make as a mount of the library, readable inside. The spec
// names a hook program this host lacks, so the container could not
// start had the hook reached runc.
func TestHookFreeOnCRIO(t *testing.T) {
	needEnv(t)
	dir := filepath.Join(env.dir, "hookfree")
	specDir := filepath.Join(dir, "cdi")
	if err := os.MkdirAll(specDir, 0o755); err != nil {
		t.Fatal(err)
	}
	lib := filepath.Join(dir, "libexample.so.570.1")
	if err := os.WriteFile(lib, []byte("the example driver library\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(specDir, "example.yaml"), []byte(fmt.Sprintf(hookFreeSpec, lib)), 0o644); err != nil {
		t.Fatal(err)
	}
	rt := startCRIO(t, "hookfree-crio", nil)
	config := filepath.Join(dir, "nri-gpu.yaml")
	if err := os.WriteFile(config, []byte(fmt.Sprintf("cdiSpecDirs: [%s]\nhookFree: true\npolicy:\n  devices: [\"example.com/gpu=*\"]\n", specDir)), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.StartPlugin("--config", config); err != nil {
		t.Fatal(err)
	}
	run, err := corpusContainer(t, rt, map[string]string{"gpus.nri-gpu.io": "example.com/gpu=0"}, nil)
	if err != nil {
		t.Fatalf("the hook-free container: %v\nCRI-O's log:\n%s", err, rt.LogTail(20))
	}
	if h := run.Spec.Hooks; h != nil && len(h.Prestart)+len(h.CreateRuntime)+len(h.CreateContainer)+len(h.StartContainer)+len(h.Poststart)+len(h.Poststop) > 0 {
		t.Errorf("the hook-free container's spec has hooks: %+v", h)
	}
	out, err := rt.Exec(run.ID, "sh", "-c", "ls /dev/examplegpu0 && cat /usr/lib/x86_64-linux-gnu/libexample.so")
	if err != nil || !strings.Contains(out, "/dev/examplegpu0") || !strings.Contains(out, "the example driver library") {
		t.Errorf("in the hook-free container, its node and the link create-symlinks would make: %v\n%s", err, out)
	}
}
