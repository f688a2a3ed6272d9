package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/test/harness"
)

// TestUserNamespacePod: a pod in a user namespace of its own (CRI's
// userns_options, as kubelet asks for hostUsers: false) asking for GPU 0
// by annotation. The fake GPUs' specs give each node a hostPath other
// than its path, which runc cannot create in a user namespace (it
// bind-mounts the host's node at the container path, which is not there:
// containerd's own CDI fails the same way). On containerd 2.x nri-gpu
// gives such a node as a bind mount of its hostPath, with its cgroup
// rule: the container runs as its namespace's root and opens its GPU
// (ENXIO: allowed by the device cgroup, no driver behind the fake node).
// containerd 1.7 does not run the pod's sandbox in a user namespace here
// at all: the runtime refuses it, before nri-gpu is asked.
func TestUserNamespacePod(t *testing.T) {
	needEnv(t)
	pod := harness.Pod{Name: "userns", Namespace: "e2e", Annotations: map[string]string{"gpus.nri-gpu.io": "0"}, UserNS: true}
	id, err := env.ctd.RunPod(pod)
	if !env.tools.Containerd2() {
		if err == nil {
			_, _ = env.ctd.Crictl("rmp", "--force", id)
			t.Fatalf("containerd %s ran a user-namespaced sandbox; this test expects its refusal", env.tools.ContainerdVersion)
		}
		if !strings.Contains(err.Error(), "operation not permitted") {
			t.Fatalf("containerd %s: %v, want the runtime's refusal", env.tools.ContainerdVersion, err)
		}
		t.Logf("containerd %s refuses a user-namespaced sandbox: %s", env.tools.ContainerdVersion, harness.LastLine(err.Error()))
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = env.ctd.Crictl("rmp", "--force", id) })
	cid, spec := runContainer(t, env.ctd, id, pod, harness.Container{Name: "gpu"})
	if slices.Contains(devicePaths(spec), "/dev/nvidia0") {
		t.Errorf("/dev/nvidia0 is a device node for runc to create (%v); in a user namespace it cannot", devicePaths(spec))
	}
	if !slices.ContainsFunc(spec.Mounts, func(m oci.Mount) bool {
		return m.Destination == "/dev/nvidia0" && m.Source == env.host.Dev("nvidia0") && m.Type == "bind"
	}) {
		t.Errorf("no bind mount of %s at /dev/nvidia0 in %v", env.host.Dev("nvidia0"), spec.Mounts)
	}
	if !allowed(spec, 195, 0) {
		t.Errorf("no cgroup rule allows /dev/nvidia0 (195:0): %v", spec.Linux.Resources.Devices)
	}
	out := inContainer(t, cid, "sh", "-c", "id -u; head -n 1 /proc/self/uid_map; head -c 1 /dev/nvidia0 2>&1; head -c 1 /dev/nvidia1 2>&1; true")
	if !strings.Contains(out, "/dev/nvidia0: No such device or address") {
		t.Errorf("opening /dev/nvidia0 in the user namespace: %q, want ENXIO (allowed by the device cgroup, no driver)", out)
	}
	if !strings.Contains(out, "/dev/nvidia1: No such file or directory") {
		t.Errorf("/dev/nvidia1, not asked for: %q, want it absent", out)
	}
	if fields := strings.Fields(out); len(fields) < 3 || fields[0] != "0" || fields[2] == "0" {
		t.Errorf("id and uid map %q, want root of a namespace mapped to another host uid", out)
	}
	t.Logf("user-namespaced container: %s", strings.Join(strings.Fields(out), " "))

	// As a user other than the namespace's root.
	user := int64(1000)
	cid, _ = runContainer(t, env.ctd, id, pod, harness.Container{Name: "user", User: &user})
	out = inContainer(t, cid, "sh", "-c", "id -u; head -c 1 /dev/nvidia0 2>&1; grep -c nvidia.com/gpu=0 $NRI_GPU_ACCESS; true")
	if f := strings.Fields(out); len(f) < 2 || f[0] != "1000" || !strings.Contains(out, "/dev/nvidia0: No such device or address") || !strings.HasSuffix(strings.TrimSpace(out), "1") {
		t.Errorf("as uid 1000 in the user namespace: %q, want its GPU opened (ENXIO) and named by its record", out)
	}
	t.Logf("as uid 1000: %s", strings.Join(strings.Fields(out), " "))
}

// TestUserNamespaceRuntimeCDI: containerd's own CDI (enable_cdi on, the
// default on 2.x, as the device plugin's cdi.k8s.io annotations and DRA's
// CRI CDI devices reach it) cannot start a user-namespaced container whose
// spec gives a node a hostPath other than its path, where the host has no
// node at that path: runc binds the container path from the host. nri-gpu
// cannot change what the runtime's CDI injects (containerd injects it
// after the plugins' adjustments): beside it, the container is refused at
// creation saying what to do, instead of failing in runc; the same device
// asked of nri-gpu itself (a pod annotation) runs.
func TestUserNamespaceRuntimeCDI(t *testing.T) {
	needEnv(t)
	if !env.tools.Containerd2() {
		t.Skipf("containerd %s runs no user-namespaced sandbox here (TestUserNamespacePod)", env.tools.ContainerdVersion)
	}
	asked := harness.Container{Name: "gpu", Annotations: map[string]string{"cdi.k8s.io/dp": "nvidia.com/gpu=0"}}
	for _, withPlugin := range []bool{false, true} {
		ctd := extraContainerd(t, fmt.Sprintf("userns-cdi-%v", withPlugin), harness.Options{EnableCDI: true, CDISpecDirs: []string{env.host.SpecDir}})
		if withPlugin {
			startPlugin(t, ctd, "devices: [nvidia.com/gpu=*]")
		}
		pod := harness.Pod{Name: "userns-cdi", Namespace: "e2e", UserNS: true}
		podID, err := ctd.RunPod(pod)
		if err != nil {
			t.Fatal(err)
		}
		id, err := ctd.CreateContainer(podID, pod, asked)
		if withPlugin {
			testutil.ErrorSays(t, err, "/dev/nvidiactl", "which the runtime's own CDI injects", "enable_cdi = false", "hostUsers: true")
			t.Logf("with nri-gpu: %s", harness.LastLine(err.Error()))
			byPlugin := harness.Pod{Name: "userns-nri", Namespace: "e2e", UserNS: true, Annotations: map[string]string{"gpus.nri-gpu.io": "0"}}
			podID, err := ctd.RunPod(byPlugin)
			if err != nil {
				t.Fatal(err)
			}
			id, _ := runContainer(t, ctd, podID, byPlugin, harness.Container{Name: "gpu"})
			if out, _ := ctd.Exec(id, "sh", "-c", "head -c 1 /dev/nvidia0 2>&1; true"); !strings.Contains(out, "No such device or address") {
				t.Errorf("the pod annotation's GPU in a user namespace: %q, want it opened (ENXIO)", out)
			}
			continue
		}
		if err == nil {
			err = ctd.StartContainer(id)
		}
		if err == nil {
			t.Fatal("containerd's own CDI started a user-namespaced container whose node's hostPath differs from its path; this test expects its failure")
		}
		testutil.ErrorSays(t, err, "error creating device nodes", "no such file or directory")
		t.Logf("containerd's own CDI alone: %s", harness.LastLine(err.Error()))
	}
}

// TestUserNamespaceGroups: a node for a group (mode 0660, group 44, as
// Jetson's /dev/nvmap or a /dev/dri render node) with the spec's
// additionalGids [44], given to a container running as uid 1000 with
// group 44 (NRI cannot add a process's groups: the pod's
// supplementalGroups give it). Without a user namespace the node is made
// for the container's user (2.x), or keeps its host group (1.7, whose
// NRI reports no user). In one (2.x), a plain bind would show its
// group as nobody and refuse uid 1000: nri-gpu binds it idmapped, its
// group seen as 44, and read-only, so that the namespace's root, seen
// as its owner, cannot change the host node.
func TestUserNamespaceGroups(t *testing.T) {
	needEnv(t)
	dir := filepath.Join(env.dir, "userns-groups")
	for _, d := range []string{"dev", "cdi"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	node := filepath.Join(dir, "dev", "nvmap")
	if err := unix.Mknod(node, unix.S_IFCHR|0o660, int(unix.Mkdev(1, 3))); err != nil { // /dev/null's numbers: opens
		t.Fatal(err)
	}
	if err := os.Chown(node, 0, 44); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(node, 0o660); err != nil {
		t.Fatal(err)
	}
	spec := fmt.Sprintf("cdiVersion: \"0.7.0\"\nkind: example.com/jetson\ndevices:\n  - name: \"0\"\n    containerEdits:\n      deviceNodes: [{path: /dev/nvmap, hostPath: %s}]\n      additionalGids: [44]\n", node)
	if err := os.WriteFile(filepath.Join(dir, "cdi", "jetson.yaml"), []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	ctd := extraContainerd(t, "userns-groups", harness.Options{})
	config := filepath.Join(ctd.Dir, "nri-gpu.yaml")
	if err := os.WriteFile(config, []byte("cdiSpecDirs: ["+filepath.Join(dir, "cdi")+"]\npolicy:\n  devices: [\"example.com/*\"]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ctd.StartPlugin("--config", config); err != nil {
		t.Fatal(err)
	}
	userNS := []bool{false}
	if env.tools.Containerd2() {
		userNS = append(userNS, true)
	}
	user := int64(1000)
	for _, inUserNS := range userNS {
		pod := harness.Pod{Name: fmt.Sprintf("groups-%v", inUserNS), Namespace: "e2e", UserNS: inUserNS, Annotations: map[string]string{"gpus.nri-gpu.io": "example.com/jetson=0"}}
		podID, err := ctd.RunPod(pod)
		if err != nil {
			t.Fatal(err)
		}
		id, _ := runContainer(t, ctd, podID, pod, harness.Container{Name: "user", User: &user, Groups: []int64{44}})
		out, err := ctd.Exec(id, "sh", "-c", "id -G; ls -ln /dev/nvmap; head -c 1 /dev/nvmap; echo read=$?; echo x > /dev/nvmap; echo write=$?")
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("user namespace %v, uid 1000 in group 44: %s", inUserNS, strings.Join(strings.Fields(out), " "))
		if !env.tools.Containerd2() {
			// containerd 1.7's NRI (v0.8) reports no process user, so
			// nri-gpu cannot give the node the container's user as CDI
			// does: it keeps the host node's group, 44, which uid 1000
			// has (docs/container.md).
			if !regexp.MustCompile(`crw-rw----\s+1\s+0\s+44\s`).MatchString(out) {
				t.Errorf("containerd %s: node %q, want root's, of group 44, 0660", env.tools.ContainerdVersion, out)
			}
		}
		if !strings.Contains(out, "read=0") || !strings.Contains(out, "write=0") {
			t.Errorf("user namespace %v: uid 1000 in group 44 cannot use the group's node: %q", inUserNS, out)
		}
		if !inUserNS {
			continue
		}
		root, _ := runContainer(t, ctd, podID, pod, harness.Container{Name: "root"})
		out, _ = ctd.Exec(root, "sh", "-c", "chmod 666 /dev/nvmap; echo chmod=$?; chown 0:0 /dev/nvmap; echo chown=$?")
		if !strings.Contains(out, "chmod=1") || !strings.Contains(out, "chown=1") {
			t.Errorf("the namespace's root changed the group's node: %q", out)
		}
		if fi, err := os.Stat(node); err != nil || fi.Mode().Perm() != 0o660 || fi.Sys().(*syscall.Stat_t).Gid != 44 {
			t.Errorf("the host node after the namespace's root tried: %v, %v; want 0660, group 44", fi.Mode(), err)
		}
	}
}
