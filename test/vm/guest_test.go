//go:build vmguest

package vm

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/test/harness"
)

// The guest's tests run on the node itself (TestCgroupV2Node boots it and
// runs them): they fail, never skip, where the node is not what they test.

// node is the guest's one containerd (2.x, runc's systemd cgroup driver)
// with nri-gpu, on two fake GPUs.
type node struct {
	ctd    *harness.Containerd
	nri    *harness.Plugin
	config string
	pods   int
}

// TestGuestNodeShape: the node is the shape the tests claim: cgroup v2
// alone (the unified hierarchy at /sys/fs/cgroup), systemd as PID 1, and
// containerd's containers in systemd's scopes.
func TestGuestNodeShape(t *testing.T) {
	var fs unix.Statfs_t
	if err := unix.Statfs("/sys/fs/cgroup", &fs); err != nil || fs.Type != unix.CGROUP2_SUPER_MAGIC {
		t.Fatalf("/sys/fs/cgroup: %v, type %#x, want cgroup2 (%#x)", err, fs.Type, unix.CGROUP2_SUPER_MAGIC)
	}
	if b, err := os.ReadFile("/proc/1/comm"); err != nil || strings.TrimSpace(string(b)) != "systemd" {
		t.Fatalf("PID 1 is %q (%v), want systemd", b, err)
	}
	if b, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers"); err != nil || !strings.Contains(string(b), "memory") || !strings.Contains(string(b), "pids") {
		t.Fatalf("cgroup v2 controllers %q (%v), want memory and pids among them", b, err)
	}
}

// startNode starts containerd 2.x with the systemd cgroup driver and
// nri-gpu (exclusive) on two fake GPUs, stopped when the test ends.
func startNode(t *testing.T) *node {
	t.Helper()
	tools, err := harness.FindTools("")
	if err != nil {
		t.Fatal(err)
	}
	if !tools.Containerd2() {
		t.Fatalf("containerd %s: the node runs 2.x", tools.ContainerdVersion)
	}
	// Short, under /tmp: it holds unix sockets.
	dir, err := os.MkdirTemp("/tmp", "nri-gpu-vm-")
	if err != nil {
		t.Fatal(err)
	}
	host, err := harness.NewGPUHost(dir, 2)
	if err != nil {
		t.Fatal(err)
	}
	image := filepath.Join(dir, "busybox.tar")
	if err := harness.BuildImage(tools.Busybox, image); err != nil {
		t.Fatal(err)
	}
	ctd, err := harness.StartContainerd(filepath.Join(dir, "ctd"), tools, harness.Options{Image: image, SystemdCgroup: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ctd.Stop(); err != nil {
			t.Errorf("stopping containerd: %v", err)
		}
	})
	n := &node{ctd: ctd, config: filepath.Join(dir, "nri-gpu.yaml")}
	if err := os.WriteFile(n.config, []byte(host.PluginConfig(nil, "namespaces: [e2e]", "devices: [nvidia.com/gpu=*]", "exclusive: true")), 0o644); err != nil {
		t.Fatal(err)
	}
	if n.nri, err = ctd.StartPlugin("--config", n.config); err != nil {
		t.Fatalf("%v\ncontainerd's log:\n%s", err, ctd.LogTail(30))
	}
	return n
}

// pod runs a pod asking GPU gpu by annotation and its container (cmd,
// else a long sleep), whose ID it returns, else the creation's error.
func (n *node) pod(t *testing.T, gpu string, cmd ...string) (podID string, pod harness.Pod, ctrID string, err error) {
	t.Helper()
	n.pods++
	pod = harness.Pod{Name: fmt.Sprintf("pod-%d", n.pods), Namespace: "e2e", Annotations: map[string]string{"gpus.nri-gpu.io": gpu}}
	if podID, err = n.ctd.RunPod(pod); err != nil {
		t.Fatalf("%v\ncontainerd's log:\n%s", err, n.ctd.LogTail(20))
	}
	if ctrID, err = n.ctd.CreateContainer(podID, pod, harness.Container{Name: "main", Command: cmd}); err != nil {
		return podID, pod, "", err
	}
	if err := n.ctd.StartContainer(ctrID); err != nil {
		t.Fatal(err)
	}
	return podID, pod, ctrID, nil
}

// access checks, inside container id, that GPU 1's node opens (ENXIO:
// let through by the device cgroup, no driver behind the fake node) and
// GPU 0's does not, even made by the container itself (EPERM from the
// device cgroup), after what.
func (n *node) access(t *testing.T, id, after string) {
	t.Helper()
	out, err := n.ctd.Exec(id, "sh", "-c", "head -c 1 /dev/nvidia1 2>&1; ls /dev/nvidia0 2>&1; mknod /tmp/gpu0 c 195 0 && head -c 1 /tmp/gpu0 2>&1; rm -f /tmp/gpu0; true")
	if err != nil {
		t.Fatalf("after %s: exec: %v: %s", after, err, out)
	}
	for _, want := range []string{"/dev/nvidia1: No such device or address", "/dev/nvidia0: No such file or directory", "/tmp/gpu0: Operation not permitted"} {
		if !strings.Contains(out, want) {
			t.Errorf("after %s: in the container %q, want %q (GPU 1 let through, GPU 0 refused by the device cgroup)", after, out, want)
		}
	}
}

// refused checks that a new pod asking GPU 1 is refused, naming holder.
func (n *node) refused(t *testing.T, holder, after string) {
	t.Helper()
	podID, _, _, err := n.pod(t, "1")
	defer n.ctd.Crictl("rmp", "--force", podID)
	if err == nil || !strings.Contains(err.Error(), "held by pod e2e/"+holder) {
		t.Errorf("after %s: a second pod asking GPU 1: %v, want refused naming %s", after, err, holder)
	}
}

// scope checks that container id of pod is in a scope systemd knows, in
// the pod's slice (runc's systemd driver), whose DeviceAllow has GPU 1
// and not GPU 0; it returns the slice and the scope.
func (n *node) scope(t *testing.T, pod harness.Pod, id string) (slice, scope string) {
	t.Helper()
	spec, err := n.ctd.ContainerSpec(id)
	if err != nil {
		t.Fatal(err)
	}
	slice = pod.Slice()
	if want := slice + ":cri-containerd:" + id; spec.Linux.CgroupsPath != want {
		t.Fatalf("cgroups path %q, want %q (runc's systemd driver)", spec.Linux.CgroupsPath, want)
	}
	scope = "cri-containerd-" + id + ".scope"
	out, err := exec.Command("systemctl", "show", "-p", "DeviceAllow", "--value", scope).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "195:1") || strings.Contains(string(out), "195:0") {
		t.Errorf("systemd's DeviceAllow of %s: %q (%v), want GPU 1's 195:1 and not GPU 0's", scope, out, err)
	}
	t.Logf("%s: DeviceAllow=%s", scope, strings.TrimSpace(string(out)))
	return slice, scope
}

// systemctl runs systemctl.
func systemctl(args ...string) error {
	if out, err := exec.Command("systemctl", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("systemctl %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// TestGuestDeviceCgroupHolds: on cgroup v2 with systemd, a pod's GPU
// given by nri-gpu through the OCI spec is in the container's scope as
// systemd knows it (runc's systemd driver writes it into the unit's
// DeviceAllow) and in runc's eBPF device program, so that it stays
// usable, and a GPU not given stays refused even to mknod, through what
// re-applies a unit's devices or rewrites the container's cgroup:
// systemctl daemon-reload and daemon-reexec (what leaves devices a hook
// added behind runc's back unusable, NVIDIA/nvidia-container-toolkit
// #48), a resources update of the running container (in-place resize),
// containerd restarted, and nri-gpu killed and started again; a second
// pod asking the held GPU is refused after each; once the pod is gone,
// the GPU is another pod's.
func TestGuestDeviceCgroupHolds(t *testing.T) {
	n := startNode(t)
	podID, pod, id, err := n.pod(t, "1")
	if err != nil {
		t.Fatalf("%v\nnri-gpu's log:\n%s", err, n.nri.Log())
	}
	slice, scope := n.scope(t, pod, id)
	n.access(t, id, "the start")

	for _, edge := range []struct {
		name string
		do   func() error
	}{
		{"systemctl daemon-reload", func() error { return systemctl("daemon-reload") }},
		{"systemctl daemon-reexec", func() error { return systemctl("daemon-reexec") }},
		{"a resources update of the running container", func() error {
			out, err := n.ctd.Crictl("update", "--memory", "268435456", "--cpu-share", "512", id)
			if err != nil {
				return fmt.Errorf("crictl update: %w: %s", err, out)
			}
			b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/kubepods.slice/kubepods-besteffort.slice", slice, scope, "memory.max"))
			if err != nil || strings.TrimSpace(string(b)) != "268435456" {
				return fmt.Errorf("memory.max after the update: %q (%v), want 268435456", b, err)
			}
			return nil
		}},
		{"containerd restarted", n.ctd.Restart},
		{"nri-gpu killed and started again", func() error {
			n.nri.Kill()
			var err error
			if n.nri, err = n.ctd.StartPlugin("--config", n.config); err != nil {
				return err
			}
			testutil.Within(t, 30*time.Second, "the restarted nri-gpu restoring pod "+pod.Name, func() bool {
				return strings.Contains(n.nri.Log(), "restored devices held by pod")
			})
			return nil
		}},
	} {
		if err := edge.do(); err != nil {
			t.Fatalf("%s: %v", edge.name, err)
		}
		n.access(t, id, edge.name)
		n.refused(t, pod.Name, edge.name)
	}

	if out, err := n.ctd.Crictl("rmp", "--force", podID); err != nil {
		t.Fatalf("removing pod %s: %v: %s", pod.Name, err, out)
	}
	next, _, nextID, err := n.pod(t, "1")
	defer n.ctd.Crictl("rmp", "--force", next)
	if err != nil {
		t.Fatalf("GPU 1 after its pod was removed: %v", err)
	}
	n.access(t, nextID, "the GPU went to the next pod")
}

// TestGuestSandboxWatch: a pod holding GPU 1 whose container has exited
// is reported by a restarted containerd with no container, and then
// containerd tells nri-gpu of neither its sandbox's stop nor its removal;
// nri-gpu knows the pod's sandbox process by its cgroup (under systemd,
// cri-containerd-<sandbox ID>.scope in the pod's slice) and releases
// GPU 1 once it ends, so that another pod gets it.
func TestGuestSandboxWatch(t *testing.T) {
	n := startNode(t)
	podID, pod, id, err := n.pod(t, "1", "/bin/true")
	if err != nil {
		t.Fatal(err)
	}
	testutil.Within(t, 30*time.Second, "the pod's container exited", func() bool {
		out, err := n.ctd.Crictl("inspect", "-o", "go-template", "--template", "{{.status.state}}", id)
		return err == nil && strings.TrimSpace(out) == "CONTAINER_EXITED"
	})
	n.refused(t, pod.Name, "its container exited")
	synced := strings.Count(n.nri.Log(), "restored devices held by pod")
	if err := n.ctd.Restart(); err != nil {
		t.Fatal(err)
	}
	testutil.Within(t, 30*time.Second, "nri-gpu synchronized with the restarted containerd", func() bool {
		return strings.Count(n.nri.Log(), "restored devices held by pod") > synced
	})
	n.refused(t, pod.Name, "containerd restarted")
	if out, err := n.ctd.Crictl("rmp", "--force", podID); err != nil {
		t.Fatalf("removing pod %s: %v: %s", pod.Name, err, out)
	}
	testutil.Within(t, 30*time.Second, "nri-gpu saying the pod's sandbox ended", func() bool {
		return strings.Contains(n.nri.Log(), "the pod's sandbox ended with no container")
	})
	next, _, nextID, err := n.pod(t, "1")
	defer n.ctd.Crictl("rmp", "--force", next)
	if err != nil {
		t.Fatalf("GPU 1 once the pod's sandbox ended: %v\nnri-gpu's log:\n%s", err, n.nri.Log())
	}
	n.access(t, nextID, "the sandbox ended")
}
