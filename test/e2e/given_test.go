package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/access"
	"github.com/nri-gpu/nri-gpu/test/harness"
)

// forged is what a tenant puts where the access file goes.
const forged = `{"cdiVersion": "0.6.0", "kind": "nri-gpu.io/access", "devices": [{"name": "container", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia1"}]}}]}`

// readAccessFile parses an access file printed by the container or by nri-gpu access.
func readAccessFile(t *testing.T, text string) cdispec.Spec {
	t.Helper()
	var spec cdispec.Spec
	if err := json.Unmarshal([]byte(text), &spec); err != nil {
		t.Fatalf("not an access file: %v\n%s", err, text)
	}
	return spec
}

// nodePaths are the device node paths of an access file.
func nodePaths(spec cdispec.Spec) []string {
	var out []string
	for _, d := range spec.Devices {
		for _, n := range d.ContainerEdits.DeviceNodes {
			out = append(out, n.Path)
		}
	}
	return out
}

// TestAccessFileInContainer: a container given GPU 0 reads, at
// /run/nri-gpu/access.json (named by NRI_GPU_ACCESS), the access file of what
// it was given: nvidia.com/gpu=0 with its node and the spec's control
// nodes, never GPU 1's; nri-gpu access --pod prints the same; the
// container cannot write it. A tenant's volume at /run/nri-gpu, or at the
// access file's own path, with a forged access file in it, does not replace it.
// The access file goes with its container.
func TestAccessFileInContainer(t *testing.T) {
	needEnv(t)
	shared := t.TempDir()
	if err := os.Chmod(shared, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"access.json", "mine"} {
		if err := os.WriteFile(filepath.Join(shared, f), []byte(forged), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name   string
		mounts []harness.Mount
	}{
		{name: "plain"},
		{name: "tenant volume at /run/nri-gpu", mounts: []harness.Mount{{HostPath: shared, ContainerPath: "/run/nri-gpu"}}},
		{name: "tenant file at the access file's path", mounts: []harness.Mount{{HostPath: filepath.Join(shared, "access.json"), ContainerPath: access.Path}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			podID, pod := newPod(t, env.ctd, map[string]string{"gpus.nri-gpu.io": "0"})
			id, spec := runContainer(t, env.ctd, podID, pod, harness.Container{Name: "worker", Mounts: tc.mounts})
			inside := inContainer(t, id, "sh", "-c", `echo "$NRI_GPU_ACCESS"; cat "$NRI_GPU_ACCESS"`)
			where, text, _ := strings.Cut(inside, "\n")
			if where != access.Path {
				t.Errorf("NRI_GPU_ACCESS=%q, want %s", where, access.Path)
			}
			rec := readAccessFile(t, text)
			if rec.Kind != access.Kind || rec.Annotations[access.DevicesAnnotation] != "nvidia.com/gpu=0" {
				t.Errorf("access file of kind %q naming devices %q, want %s naming nvidia.com/gpu=0", rec.Kind, rec.Annotations[access.DevicesAnnotation], access.Kind)
			}
			nodes := nodePaths(rec)
			for _, want := range []string{"/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"} {
				if !slices.Contains(nodes, want) {
					t.Errorf("access file lists nodes %v, want %s among them", nodes, want)
				}
			}
			if slices.Contains(nodes, "/dev/nvidia1") {
				t.Errorf("access file lists GPU 1, which the container was not given: %v", nodes)
			}

			cmd := exec.Command(env.tools.Path("nri-gpu"), "access", "--pod", "e2e/"+pod.Name, "--access-dir", harness.AccessDir(env.ctd.Dir, "nri-gpu"))
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("nri-gpu access --pod: %v", err)
			}
			if diff := cmp.Diff(rec, readAccessFile(t, string(out))); diff != "" {
				t.Errorf("nri-gpu access --pod differs from the container's access file (-container +access):\n%s", diff)
			}

			write, err := env.ctd.Exec(id, "sh", "-c", "echo '{}' > "+access.Path)
			testutil.ErrorSays(t, errorOf(write, err), "Read-only file system")
			if len(tc.mounts) > 0 && tc.mounts[0].ContainerPath == "/run/nri-gpu" {
				if mine := inContainer(t, id, "cat", "/run/nri-gpu/mine"); mine != forged {
					t.Errorf("the tenant's own file in its volume: %q", mine)
				}
			}

			source := ""
			for _, m := range spec.Mounts {
				if m.Destination == access.Path {
					source = m.Source
				}
			}
			if _, err := os.Stat(source); err != nil {
				t.Fatalf("access file on the host at %q: %v", source, err)
			}
			if out, err := env.ctd.Crictl("rm", "--force", id); err != nil {
				t.Fatalf("crictl rm: %v: %s", err, out)
			}
			if _, err := os.Stat(source); !os.IsNotExist(err) {
				t.Errorf("access file after its container's removal: %v, want it gone", err)
			}
		})
	}
}

// errorOf is a command's error with its output, or nil when it succeeded.
func errorOf(out string, err error) error {
	if err != nil {
		return fmt.Errorf("%w: %s", err, out)
	}
	return nil
}

// TestSupervisorLandlock: a supervisor-like program (test/supervisor) in
// a container given GPU 0 reads the access file with CDI's library, confines
// itself with Landlock to exactly the paths it lists, and still opens
// its device node (ENXIO: allowed, no driver behind the fake node) and
// reads its driver library, while a host file containerd bound in
// (/etc/hostname), the image's own files and a device node it was not
// given stay closed (EACCES). The image has a forged access file at the
// access file's path, which the real one covers. On containerd 2.x the same
// holds in a pod with a user namespace of its own.
func TestSupervisorLandlock(t *testing.T) {
	needEnv(t)
	dir := filepath.Join(env.dir, "supervisor")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "supervisor")
	build := exec.Command("go", "build", "-o", bin, "github.com/nri-gpu/nri-gpu/test/supervisor")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./test/supervisor: %v\n%s", err, out)
	}
	files, err := harness.ProgramFiles(bin, "supervisor")
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, harness.File{Name: strings.TrimPrefix(access.Path, "/"), Data: []byte(forged), Mode: 0o644})
	image := filepath.Join(dir, "image.tar")
	if err := harness.BuildImage(env.tools.Busybox, image, files...); err != nil {
		t.Fatal(err)
	}
	ctd := extraContainerd(t, "supervisor", harness.Options{Image: image})
	startPlugin(t, ctd, "devices: [nvidia.com/gpu=*]")

	userNS := []bool{false}
	if env.tools.Containerd2() {
		userNS = append(userNS, true)
	}
	for _, inUserNS := range userNS {
		pod := harness.Pod{Name: "supervised", Namespace: "e2e", Annotations: map[string]string{"gpus.nri-gpu.io": "0"}, UserNS: inUserNS}
		podID, err := ctd.RunPod(pod)
		if err != nil {
			t.Fatal(err)
		}
		id, _ := runContainer(t, ctd, podID, pod, harness.Container{Name: "agent"})
		out, err := ctd.Exec(id, "/supervisor", "/etc/hostname", "/bin/busybox", "/dev/null", "/dev/nvidia1")
		if err != nil {
			t.Fatalf("user namespace %v: the supervisor failed: %v\n%s", inUserNS, err, out)
		}
		t.Logf("user namespace %v, the supervisor in the container:\n%s", inUserNS, out)
		for _, want := range []string{
			"given /dev/nvidia0: ENXIO", "given /dev/nvidiactl: ENXIO", "given /usr/lib/libcuda.so.1: ok",
			"other /etc/hostname: EACCES", "other /bin/busybox: EACCES", "other /dev/null: EACCES", "other /dev/nvidia1: ENOENT",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("user namespace %v: supervisor says\n%s\nwant %q", inUserNS, out, want)
			}
		}
		if out, err := ctd.Crictl("rmp", "--force", podID); err != nil {
			t.Fatalf("crictl rmp: %v: %s", err, out)
		}
	}
}

// TestAccessFileImageDirectory: an image with a directory where the
// access file goes cannot have the access file mounted over it: the runtime refuses
// to start the container (a file cannot be bound on a directory), the
// container never runs half-equipped, its access file goes with its pod, and
// nri-gpu keeps serving.
func TestAccessFileImageDirectory(t *testing.T) {
	needEnv(t)
	image := filepath.Join(env.dir, "access-directory.tar")
	if err := harness.BuildImage(env.tools.Busybox, image, harness.File{Name: strings.TrimPrefix(access.Path, "/") + "/forged", Data: []byte(forged), Mode: 0o644}); err != nil {
		t.Fatal(err)
	}
	ctd := extraContainerd(t, "access-directory", harness.Options{Image: image})
	startPlugin(t, ctd, "devices: [nvidia.com/gpu=*]")
	pod := harness.Pod{Name: "dir", Namespace: "e2e", Annotations: map[string]string{"gpus.nri-gpu.io": "0"}}
	podID, err := ctd.RunPod(pod)
	if err != nil {
		t.Fatal(err)
	}
	id, err := ctd.CreateContainer(podID, pod, harness.Container{Name: "agent"})
	if err == nil {
		err = ctd.StartContainer(id)
	}
	if err == nil {
		t.Fatal("a container whose image has a directory at the access file's path started")
	}
	t.Logf("refused: %s", harness.LastLine(err.Error()))
	testutil.ErrorSays(t, err, "not a directory")
	if out, err := ctd.Crictl("rmp", "--force", podID); err != nil {
		t.Fatalf("crictl rmp: %v: %s", err, out)
	}
	if left, _ := filepath.Glob(filepath.Join(harness.AccessDir(ctd.Dir, "nri-gpu"), "*", "*")); len(left) > 0 {
		t.Errorf("access files left after the pod's removal: %v", left)
	}
	plain := harness.Pod{Name: "plain", Namespace: "e2e"}
	podID, err = ctd.RunPod(plain)
	if err != nil {
		t.Fatal(err)
	}
	runContainer(t, ctd, podID, plain, harness.Container{Name: "plain"})
}
