package cluster

import (
	"crypto/md5"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/test/harness"
)

// hookFreeDriver is the version of the driver libraries TestHookFreeNode
// puts under each node's driver root.
const hookFreeDriver = "560.35.03"

// hookFreeLibs are the sonames of the libraries TestHookFreeNode builds,
// each a real shared object of that soname (libnvidia-ml is not among
// them: nri-gpu would load it, from the driver root, as its NVML).
var hookFreeLibs = []string{"libcuda.so.1", "libnvidia-ptxjitcompiler.so.1"}

// hookFreeEdits are the edits TestHookFreeNode adds to node-b's spec, of
// the shape nvidia-ctk writes (test/corpus nvidia-ctk-generate.yaml): the
// libraries mounted from the driver root into /usr/lib64 (a RHEL-like
// host), and the hooks that make them loadable.
func hookFreeEdits() string {
	var b strings.Builder
	b.WriteString("  mounts:\n")
	for _, l := range hookFreeLibs {
		lib := strings.TrimSuffix(l, ".1") + "." + hookFreeDriver
		fmt.Fprintf(&b, "    - hostPath: %s/usr/lib64/%s\n      containerPath: /usr/lib64/%s\n      options: [ro, nosuid, nodev, rbind, rprivate]\n", nodeDriverRoot, lib, lib)
	}
	b.WriteString("  hooks:\n")
	for _, args := range [][]string{
		{"create-symlinks", "--link", "libcuda.so.1::/usr/lib64/libcuda.so"},
		{"enable-cuda-compat", "--host-driver-version=" + hookFreeDriver},
		{"update-ldcache", "--folder", "/usr/lib64"},
		{"disable-device-node-modification"},
	} {
		fmt.Fprintf(&b, "    - hookName: createContainer\n      path: /usr/bin/nvidia-cdi-hook\n      args: [nvidia-cdi-hook, %s]\n      env: [NVIDIA_CTK_DEBUG=false]\n", strings.Join(args, ", "))
	}
	return b.String()
}

// TestHookFreeNode: node-b (containerd 2.3.7, its own CDI on) with the
// default validator's reject_oci_hook_adjustment, and a spec whose
// driver libraries come with NVIDIA's hooks (create-symlinks,
// enable-cuda-compat, update-ldcache, disable-device-node-modification).
// nri-gpu's default injection is refused by the runtime, naming the
// hooks; with the chart's ci/hookfree-values.yaml, a pod of each door
// (an annotation, the device plugin, a DRA claim: created one after
// another, as the slice follows the pool) runs with its one GPU,
// no OCI hook in its container, and each library, under its file name,
// its soname (where each loader family looks) and its create-symlinks
// link, the same bytes as the driver's file.
func TestHookFreeNode(t *testing.T) {
	needCluster(t)
	n, both := env.b, env.nodes

	// The driver's libraries, real shared objects with their sonames, on
	// both nodes (nri-gpu's pods mount the driver root on each).
	build := filepath.Join(env.dir, "hookfree-libs")
	if err := os.MkdirAll(build, 0o755); err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(build, "lib.c")
	if err := os.WriteFile(src, []byte("int cuInit(void) { return 42; }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	sums := map[string]string{} // soname: md5 of its library
	for _, node := range both {
		lib64 := filepath.Join(onNode(node, nodeDriverRoot), "usr", "lib64")
		if err := os.MkdirAll(lib64, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, l := range hookFreeLibs {
			out := filepath.Join(lib64, strings.TrimSuffix(l, ".1")+"."+hookFreeDriver)
			if b, err := exec.Command("cc", "-shared", "-fPIC", "-nostdlib", "-Wl,-soname,"+l, "-o", out, src).CombinedOutput(); err != nil {
				t.Fatalf("cc (make test needs one for cgo too): %v\n%s", err, b)
			}
			data, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			sum := md5.Sum(data)
			sums[l] = hex.EncodeToString(sum[:])
		}
	}
	t.Cleanup(func() {
		for _, node := range both {
			if err := os.RemoveAll(onNode(node, nodeDriverRoot)); err != nil {
				t.Error(err)
			}
		}
	})

	// node-b's spec, with the libraries and their hooks.
	specPath := filepath.Join(n.Dir, "run", "cdi", "nvidia.yaml")
	orig, err := os.ReadFile(specPath)
	if err != nil {
		t.Fatal(err)
	}
	hooked := strings.Replace(string(orig), "containerEdits:\n  deviceNodes:", "containerEdits:\n"+hookFreeEdits()+"  deviceNodes:", 1)
	if hooked == string(orig) {
		t.Fatalf("%s: no top-level containerEdits to add to", specPath)
	}
	if err := os.WriteFile(specPath, []byte(hooked), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.WriteFile(specPath, orig, 0o644); err != nil {
			t.Error(err)
		}
	})

	// node-b's containerd refuses every OCI hook a plugin adds.
	rejectHooks(t, n, true)
	t.Cleanup(func() { rejectHooks(t, n, false) })

	driverRoot := valuesFile(t, "hookfree-driverroot.yaml", "config:\n  driverRoot: "+nodeDriverRoot+"\n")
	restartWith(t, both, driverName, env.values, driverRoot)
	t.Cleanup(func() { restartWith(t, both, driverName, env.values) })
	createPod(t, gpuPod("default", "hooked", 0, map[string]string{"gpu-count.nri-gpu.io": "1"}, n.Name))
	refusedWith(t, "default", "hooked", "attempted restricted OCI hook injection")
	deletePod(t, "default", "hooked")

	restartWith(t, both, driverName, env.values, chartDir+"/ci/hookfree-values.yaml", driverRoot)
	createTemplate(t, "default", "hookfree-gpu", harness.ClaimSpec(driverName, 1))
	doors := []struct {
		door, ctr string
		pod       *corev1.Pod
	}{
		{"annotation", "main", gpuPod("default", "hookfree-annotation", 0, map[string]string{"gpu-count.nri-gpu.io": "1"}, n.Name)},
		{"device plugin", "main", scheduledOn(n, gpuPod("default", "hookfree-device-plugin", 1, nil, ""))},
		{"DRA", "gpu", claimPod("default", "hookfree-dra", n, "hookfree-gpu", "")},
	}
	seen := map[string]string{} // GPU: the door whose pod sees it
	for _, d := range doors {
		if d.door == "DRA" {
			// The scheduler allocates a claim from the slice, which
			// follows the pool: once it no longer offers the GPUs the
			// other doors' pods hold, the claim gets another.
			var held []int
			for g := range seen {
				i, err := strconv.Atoi(strings.TrimPrefix(g, "nvidia"))
				if err != nil {
					t.Fatalf("GPU %q: %v", g, err)
				}
				held = append(held, i)
			}
			waitSlice(t, n, gpuNames(n, held...)...)
		}
		createPod(t, d.pod)
		p := waitAllRunning(t, "default", d.pod.Name)
		id := containerID(t, p, d.ctr)
		spec, err := n.Ctd.ContainerSpec(id)
		if err != nil {
			t.Fatal(err)
		}
		if h := spec.Hooks; h != nil && len(h.Prestart)+len(h.CreateRuntime)+len(h.CreateContainer)+len(h.StartContainer)+len(h.Poststart)+len(h.Poststop) > 0 {
			t.Errorf("%s: the container has OCI hooks %+v, want none", d.door, *h)
		}
		gpus := gpusIn(t, n, id, p.Name)
		if len(gpus) != 1 {
			t.Errorf("%s: the container sees GPUs %v, want one", d.door, gpus)
		}
		for _, g := range gpus {
			if other, ok := seen[g]; ok {
				t.Errorf("%s: the container sees %s, which the %s pod sees too", d.door, g, other)
			}
			seen[g] = d.door
		}
		for _, f := range hookFreeFiles() {
			out, err := n.Ctd.Exec(id, "sh", "-c", "md5sum "+f.path)
			if got, _, _ := strings.Cut(strings.TrimSpace(out), " "); err != nil || got != sums[f.soname] {
				t.Errorf("%s: %s in the container: %q (%v), want the driver's %s (md5 %s)", d.door, f.path, strings.TrimSpace(out), err, f.soname, sums[f.soname])
			}
		}
		t.Logf("%s: %s runs hook-free with %v and the driver's libraries at %d paths", d.door, p.Name, gpus, len(hookFreeFiles()))
	}
	if !t.Failed() {
		t.Logf("no OCI hook in any container; GPUs %v", seen)
	}
}

// hookFreeFiles are the paths at which a hook-free container of
// TestHookFreeNode is to have the driver's libraries, by soname: each
// library's file name, its soname in each loader family's system
// directory (docs/hook-free.md), and libcuda's create-symlinks link.
func hookFreeFiles() []struct{ path, soname string } {
	var files []struct{ path, soname string }
	for _, l := range hookFreeLibs {
		for _, p := range []string{
			"/usr/lib64/" + strings.TrimSuffix(l, ".1") + "." + hookFreeDriver,
			"/usr/lib64/" + l, "/usr/lib/x86_64-linux-gnu/" + l, "/usr/lib/" + l,
		} {
			files = append(files, struct{ path, soname string }{p, l})
		}
	}
	return append(files, struct{ path, soname string }{"/usr/lib64/libcuda.so", "libcuda.so.1"})
}

// rejectHooks turns node n's default validator's
// reject_oci_hook_adjustment on or off, restarts its containerd and waits
// until nri-gpu is connected to it again.
func rejectHooks(t *testing.T, n *harness.Node, on bool) {
	t.Helper()
	cfg := n.Ctd.ConfigPath()
	data, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	from, to := fmt.Sprintf("reject_oci_hook_adjustment = %t", !on), fmt.Sprintf("reject_oci_hook_adjustment = %t", on)
	if !strings.Contains(string(data), from) {
		t.Fatalf("%s has no %q", cfg, from)
	}
	if err := os.WriteFile(cfg, []byte(strings.Replace(string(data), from, to, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	connected := strings.Count(nriLog(t, n), "connected to runtime")
	if err := n.Ctd.Restart(); err != nil {
		t.Fatal(err)
	}
	if err := n.WaitReady(podWait); err != nil {
		t.Fatal(err)
	}
	testutil.Within(t, podWait, n.Name+": nri-gpu connected to the restarted containerd", func() bool {
		return strings.Count(nriLog(t, n), "connected to runtime") > connected
	})
}
