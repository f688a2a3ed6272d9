package e2e

import (
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	oci "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/nri-gpu/nri-gpu/test/harness"
)

var podSeq atomic.Int32

// newPod runs a pod with the given annotations and removes it when the
// test ends.
func newPod(t *testing.T, ctd *harness.Containerd, annotations map[string]string) (string, harness.Pod) {
	t.Helper()
	pod := harness.Pod{
		Name:        fmt.Sprintf("pod-%d", podSeq.Add(1)),
		Namespace:   "e2e",
		Annotations: annotations,
	}
	id, err := ctd.RunPod(pod)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// A test may have removed the pod itself. A shim that went away
		// while its container was stopped ("ttrpc: closed", seen once
		// in a full run) is cleaned up by containerd: the removal is
		// asked once more, and said.
		for try := 1; ; try++ {
			out, err := ctd.Crictl("rmp", "--force", id)
			if err == nil || strings.Contains(out, "NotFound") {
				return
			}
			if try == 2 || !strings.Contains(out, "ttrpc: closed") {
				t.Errorf("removing pod: %v: %s", err, out)
				return
			}
			t.Logf("removing pod, asked again: %v: %s", err, out)
			time.Sleep(time.Second)
		}
	})
	return id, pod
}

// runContainer creates and starts a container, failing the test on error.
func runContainer(t *testing.T, ctd *harness.Containerd, podID string, pod harness.Pod, ctr harness.Container) (string, *oci.Spec) {
	t.Helper()
	id, err := ctd.CreateContainer(podID, pod, ctr)
	if err != nil {
		t.Fatalf("creating container %s: %v", ctr.Name, err)
	}
	if err := ctd.StartContainer(id); err != nil {
		t.Fatal(err)
	}
	spec, err := ctd.ContainerSpec(id)
	if err != nil {
		t.Fatal(err)
	}
	return id, spec
}

func devicePaths(s *oci.Spec) []string {
	var paths []string
	for _, d := range s.Linux.Devices {
		paths = append(paths, d.Path)
	}
	slices.Sort(paths)
	return paths
}

func hasEnv(s *oci.Spec, kv string) bool { return slices.Contains(s.Process.Env, kv) }

// allowed reports whether the spec's cgroup rules allow a char device.
func allowed(s *oci.Spec, major, minor int64) bool {
	for _, r := range s.Linux.Resources.Devices {
		if r.Allow && r.Type == "c" && r.Major != nil && *r.Major == major && r.Minor != nil && *r.Minor == minor {
			return true
		}
	}
	return false
}

// inContainer runs a command in a container and returns its output.
func inContainer(t *testing.T, id string, cmd ...string) string {
	t.Helper()
	out, err := env.ctd.Exec(id, cmd...)
	if err != nil {
		t.Fatalf("exec %v: %v: %s", cmd, err, out)
	}
	return out
}

func TestPodAnnotationInjectsDevice(t *testing.T) {
	needEnv(t)
	podID, pod := newPod(t, env.ctd, map[string]string{"gpus.nri-gpu.io": "nvidia.com/gpu=0"})
	id, spec := runContainer(t, env.ctd, podID, pod, harness.Container{Name: "worker"})

	// The final spec, as ctr prints it.
	if got, want := devicePaths(spec), []string{"/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidiactl"}; !slices.Equal(got, want) {
		t.Errorf("devices %v, want %v", got, want)
	}
	for _, d := range [][2]int64{{harness.NvidiaMajor, 0}, {harness.NvidiaMajor, harness.NvidiaCtl}, {harness.FakeUVMMajor, 0}} {
		if !allowed(spec, d[0], d[1]) {
			t.Errorf("no cgroup rule allows c %d:%d; rules %+v", d[0], d[1], spec.Linux.Resources.Devices)
		}
	}
	if allowed(spec, harness.NvidiaMajor, 1) {
		t.Error("a cgroup rule allows /dev/nvidia1, which was not asked for")
	}
	for _, kv := range []string{"NVIDIA_VISIBLE_DEVICES=void", "FAKE_DRIVER=1", "FAKE_GPU_0=" + harness.UUID(0)} {
		if !hasEnv(spec, kv) {
			t.Errorf("env lacks %s: %v", kv, spec.Process.Env)
		}
	}
	if hasEnv(spec, "FAKE_GPU_1="+harness.UUID(1)) {
		t.Error("env has the variable of GPU 1, which was not asked for")
	}
	i := slices.IndexFunc(spec.Mounts, func(m oci.Mount) bool { return m.Destination == "/usr/lib/libcuda.so.1" })
	if i < 0 || !slices.Contains(spec.Mounts[i].Options, "ro") {
		t.Errorf("no read-only driver library mount in %+v", spec.Mounts)
	}
	if spec.Hooks == nil || len(spec.Hooks.CreateContainer) != 1 || len(spec.Hooks.Poststart) != 1 ||
		len(spec.Hooks.Prestart) != 0 || len(spec.Hooks.CreateRuntime) != 0 {
		t.Errorf("hooks %+v, want one createContainer and one poststart hook, each at its own point", spec.Hooks)
	}

	// Inside the container.
	if out := inContainer(t, id, "stat", "-c", "%F %t:%T", "/dev/nvidia0"); out != "character special file c3:0" {
		t.Errorf("/dev/nvidia0 in the container: %q, want a char device 195:0 (hex c3:0)", out)
	}
	// The device cgroup lets the container open the node; the fake host has
	// no driver behind it, so the kernel answers ENXIO rather than EPERM.
	if out := inContainer(t, id, "sh", "-c", "head -c 1 /dev/nvidia0 2>&1; true"); !strings.Contains(out, "No such device or address") {
		t.Errorf("opening /dev/nvidia0: %q, want ENXIO (allowed by the device cgroup, no driver)", out)
	}
	// A node of a GPU not given cannot be made either: the cgroup denies it.
	if out := inContainer(t, id, "sh", "-c", "mknod /tmp/gpu1 c 195 1 && head -c 1 /tmp/gpu1 2>&1; true"); !strings.Contains(out, "Operation not permitted") {
		t.Errorf("reaching GPU 1 through mknod: %q, want EPERM from the device cgroup", out)
	}
	if out, err := env.ctd.Exec(id, "ls", "/dev/nvidia1"); err == nil {
		t.Errorf("/dev/nvidia1 exists in the container: %s", out)
	}
	if out := inContainer(t, id, "cat", "/usr/lib/libcuda.so.1"); out+"\n" != harness.LibraryContent {
		t.Errorf("driver library in the container holds %q", out)
	}
	if out := inContainer(t, id, "env"); !strings.Contains(out, "FAKE_GPU_0="+harness.UUID(0)) {
		t.Errorf("container env lacks FAKE_GPU_0:\n%s", out)
	}
	runs, err := env.host.HookRuns()
	if err != nil {
		t.Fatal(err)
	}
	for _, point := range []string{"createContainer", "poststart"} {
		if !slices.Contains(runs, point+" "+id) {
			t.Errorf("the %s hook did not run for the container; hook runs: %v", point, runs)
		}
	}
}

func TestRequests(t *testing.T) {
	needEnv(t)
	tests := []struct {
		name        string
		podAnn      map[string]string
		ctrAnn      map[string]string
		wantDevices []string
		wantEnv     []string
	}{
		{
			name:        "short index name",
			podAnn:      map[string]string{"gpus.nri-gpu.io": "1"},
			wantDevices: []string{"/dev/nvidia-uvm", "/dev/nvidia1", "/dev/nvidiactl"},
			wantEnv:     []string{"FAKE_GPU_1=" + harness.UUID(1)},
		},
		{
			name:        "short UUID name",
			podAnn:      map[string]string{"gpus.nri-gpu.io": harness.UUID(1)},
			wantDevices: []string{"/dev/nvidia-uvm", "/dev/nvidia1", "/dev/nvidiactl"},
		},
		{
			name:        "two devices, spaces and a duplicate",
			podAnn:      map[string]string{"gpus.nri-gpu.io/pod": " 0 , nvidia.com/gpu=1,1 "},
			wantDevices: []string{"/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl"},
			wantEnv:     []string{"FAKE_GPU_0=" + harness.UUID(0), "FAKE_GPU_1=" + harness.UUID(1)},
		},
		{
			name:        "cdi.k8s.io container annotation",
			ctrAnn:      map[string]string{"cdi.k8s.io/nvidia-device-plugin_abc": "nvidia.com/gpu=1"},
			wantDevices: []string{"/dev/nvidia-uvm", "/dev/nvidia1", "/dev/nvidiactl"},
		},
		{
			name:        "no request, no adjustment",
			podAnn:      map[string]string{"unrelated.example.com/x": "0"},
			wantDevices: nil,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			podID, pod := newPod(t, env.ctd, tc.podAnn)
			_, spec := runContainer(t, env.ctd, podID, pod, harness.Container{Name: "c", Annotations: tc.ctrAnn})
			if got := devicePaths(spec); !slices.Equal(got, tc.wantDevices) {
				t.Errorf("devices %v, want %v", got, tc.wantDevices)
			}
			for _, kv := range tc.wantEnv {
				if !hasEnv(spec, kv) {
					t.Errorf("env lacks %s", kv)
				}
			}
			if tc.wantDevices == nil && (hasEnv(spec, "NVIDIA_VISIBLE_DEVICES=void") || spec.Hooks != nil && len(spec.Hooks.CreateContainer) > 0) {
				t.Errorf("a container that asked for nothing was adjusted: env %v hooks %+v", spec.Process.Env, spec.Hooks)
			}
		})
	}
}

func TestPerContainerAnnotations(t *testing.T) {
	needEnv(t)
	podID, pod := newPod(t, env.ctd, map[string]string{
		"gpus.nri-gpu.io/container.trainer": "0",
		"gpus.nri-gpu.io/pod":               "1",
	})
	_, trainer := runContainer(t, env.ctd, podID, pod, harness.Container{Name: "trainer"})
	_, sidecar := runContainer(t, env.ctd, podID, pod, harness.Container{Name: "sidecar"})
	if got := devicePaths(trainer); !slices.Contains(got, "/dev/nvidia0") || slices.Contains(got, "/dev/nvidia1") {
		t.Errorf("trainer devices %v, want nvidia0 only (its container annotation wins)", got)
	}
	if got := devicePaths(sidecar); !slices.Contains(got, "/dev/nvidia1") || slices.Contains(got, "/dev/nvidia0") {
		t.Errorf("sidecar devices %v, want nvidia1 only (the pod annotation)", got)
	}
}

func TestBadRequestsFailCreation(t *testing.T) {
	needEnv(t)
	tests := []struct {
		name   string
		podAnn map[string]string
		want   []string
	}{
		{
			name:   "unknown device",
			podAnn: map[string]string{"gpus.nri-gpu.io": "7"},
			want:   []string{`pod annotation "gpus.nri-gpu.io" request "7" (nvidia.com/gpu=7)`, "unresolvable CDI device", "no CDI spec"},
		},
		{
			name:   "malformed name",
			podAnn: map[string]string{"gpus.nri-gpu.io/pod": "0,vendor.com/=x"},
			want:   []string{`pod annotation "gpus.nri-gpu.io/pod", item 2 "vendor.com/=x"`, "invalid device request"},
		},
		{
			name:   "all is denied by default",
			podAnn: map[string]string{"gpus.nri-gpu.io": "all"},
			want:   []string{"denied by policy", "policy.allowAll"},
		},
		{
			name:   "a kind outside policy.devices is denied",
			podAnn: map[string]string{"gpus.nri-gpu.io": "example.com/nic=0"},
			want:   []string{"denied by policy", `"example.com/nic=0"`, "policy.devices"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			podID, pod := newPod(t, env.ctd, tc.podAnn)
			id, err := env.ctd.CreateContainer(podID, pod, harness.Container{Name: "c"})
			if err == nil {
				t.Fatalf("container %s was created, want creation to fail", id)
			}
			msg := strings.ReplaceAll(err.Error(), `\"`, `"`)
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error does not say %q:\n%v", w, err)
				}
			}
			if out, _ := env.ctd.Crictl("ps", "-a", "-q", "-p", podID); out != "" {
				t.Errorf("the pod has containers after a failed creation: %s", out)
			}
		})
	}
	// The plugin keeps serving after bad requests.
	podID, pod := newPod(t, env.ctd, map[string]string{"gpus.nri-gpu.io": "0"})
	if _, spec := runContainer(t, env.ctd, podID, pod, harness.Container{Name: "after"}); !slices.Contains(devicePaths(spec), "/dev/nvidia0") {
		t.Error("after bad requests, a good one got no device")
	}
}
