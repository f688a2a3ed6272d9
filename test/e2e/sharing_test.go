package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	oci "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/nri-gpu/nri-gpu/internal/mpsstandin"
	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/mps"
	"github.com/nri-gpu/nri-gpu/test/harness"
)

// TestSharingWithMPS: on real containerd, the fake GPUs shared two ways
// with MPS, nri-gpu running their control daemons (a stand-in for
// nvidia-cuda-mps-control that records how it was started). nri-gpu
// starts one per GPU with the GPU's UUID, its limits as defaults and its
// own directory as /dev/shm (nri-gpu's mps-shm in a mount namespace of
// its own: the machine's /dev/shm is untouched). Two pods asking for GPU
// 0 by name share it, a third is refused naming both; a count request
// takes an unused GPU; each container has the MPS client environment,
// reaches its GPU's daemon at CUDA's default pipe directory, read-only
// (a tenant there cannot remove, replace or squat the daemon's socket),
// and shares the daemon's /dev/shm.
func TestSharingWithMPS(t *testing.T) {
	needEnv(t)
	// The image has the stand-in as the client program CUDA's
	// applications would be.
	files, err := harness.ProgramFiles(env.tools.Path("mps-control"), "usr/bin/nvidia-cuda-mps-control")
	if err != nil {
		t.Fatal(err)
	}
	image := filepath.Join(env.dir, "mps-image.tar")
	if err := harness.BuildImage(env.tools.Busybox, image, files...); err != nil {
		t.Fatal(err)
	}
	ctd := extraContainerd(t, "ctd-mps", harness.Options{Image: image})
	root := filepath.Join(ctd.Dir, "mps")
	config := filepath.Join(ctd.Dir, "nri-gpu.yaml")
	text := env.host.PluginConfig(nil, "exclusive: true",
		`sharing: [{devices: ["nvidia.com/gpu=*"], replicas: 2, strategy: mps, pinnedMemoryLimit: 1Gi}]`) +
		fmt.Sprintf("healthInterval: 1s\nmps: {daemon: managed, controlCommand: %s, root: %s}\n", env.tools.Path("mps-control"), root)
	if err := os.WriteFile(config, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	_, hostShmBefore := os.Stat(filepath.Join("/dev/shm", mpsstandin.Started))
	p, err := ctd.StartPlugin("--config", config)
	if err != nil {
		t.Fatal(err)
	}
	dir := func(i int) string { return filepath.Join(root, harness.UUID(i)) }
	// nri-gpu leaves its daemons running when it exits: quit them.
	t.Cleanup(func() {
		for i := range 4 {
			_ = (mps.Daemon{Control: env.tools.Path("mps-control"), Dir: dir(i)}).Stop(context.Background(), "")
		}
	})
	testutil.Within(t, 20*time.Second, "nri-gpu started a daemon for each GPU", func() bool {
		for i := range 4 {
			data, _ := os.ReadFile(filepath.Join(dir(i), "pipe", mpsstandin.Defaults))
			if strings.Count(string(data), "\n") != 2 {
				return false
			}
		}
		return true
	})
	for i := range 4 {
		log, _ := os.ReadFile(filepath.Join(dir(i), "log", mpsstandin.Log))
		if want := fmt.Sprintf(`run args=["-d"] CUDA_VISIBLE_DEVICES=%q`, harness.UUID(i)); !strings.Contains(string(log), want) {
			t.Errorf("GPU %d's daemon:\n%s\nwant %s", i, log, want)
		}
		defaults, _ := os.ReadFile(filepath.Join(dir(i), "pipe", mpsstandin.Defaults))
		if want := "set_default_active_thread_percentage 50\nset_default_device_pinned_mem_limit 0 1024M\n"; string(defaults) != want {
			t.Errorf("GPU %d's daemon defaults %q, want %q", i, defaults, want)
		}
		if got, err := os.ReadFile(filepath.Join(dir(i), "shm", mpsstandin.Started)); err != nil || string(got) != filepath.Join(dir(i), "pipe") {
			t.Errorf("GPU %d's daemon did not have its shm directory as /dev/shm: %q, %v", i, got, err)
		}
	}
	if _, err := os.Stat(filepath.Join("/dev/shm", mpsstandin.Started)); err == nil && hostShmBefore != nil {
		t.Error("a daemon wrote to the machine's /dev/shm")
	}
	// nri-gpu logs a start once its upkeep returns, which may be after
	// the daemon wrote its defaults.
	testutil.Within(t, 10*time.Second, "nri-gpu's log of the daemons started", func() bool {
		return strings.Contains(p.Log(), "started MPS control daemon")
	})

	client := func(spec *oci.Spec) []string {
		var out []string
		for _, kv := range spec.Process.Env {
			if strings.HasPrefix(kv, "CUDA_MPS_") {
				out = append(out, kv)
			}
		}
		for _, m := range spec.Mounts {
			if strings.HasPrefix(m.Source, root) {
				out = append(out, m.Source+" -> "+m.Destination)
			}
		}
		slices.Sort(out)
		return out
	}
	want := func(i int) []string {
		return slices.Sorted(slices.Values([]string{
			"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50", "CUDA_MPS_LOG_DIRECTORY=/var/log/nvidia-mps",
			"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1024M", "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
			dir(i) + "/log -> /var/log/nvidia-mps", dir(i) + "/pipe -> /tmp/nvidia-mps", dir(i) + "/shm -> /dev/shm",
		}))
	}
	var pods []string
	for range 2 {
		podID, pod := newPod(t, ctd, map[string]string{"gpus.nri-gpu.io": "0"})
		id, spec := runContainer(t, ctd, podID, pod, harness.Container{Name: "c"})
		pods = append(pods, "pod e2e/"+pod.Name)
		if got := client(spec); !slices.Equal(got, want(0)) {
			t.Errorf("pod %s: MPS client %q, want %q", pod.Name, got, want(0))
		}
		// What the container sees: its daemon's pipe directory, and the
		// daemon's /dev/shm.
		if out, err := ctd.Exec(id, "sh", "-c", "test -S /tmp/nvidia-mps/"+mps.ControlSocket+" && cat /dev/shm/"+mpsstandin.Started); err != nil || !strings.Contains(out, filepath.Join(dir(0), "pipe")) {
			t.Errorf("inside pod %s's container: %q, %v", pod.Name, out, err)
		}
		// A client reaches the daemon through the read-only pipe
		// directory; a tenant (root in its container) can neither remove
		// nor replace the daemon's socket there, nor make a file there
		// (a socket of its own to listen on).
		if out, err := ctd.Exec(id, "sh", "-c", "echo get_default_active_thread_percentage | nvidia-cuda-mps-control"); err != nil || strings.TrimSpace(out) != "50" {
			t.Errorf("a client in pod %s asking its daemon: %q, %v", pod.Name, out, err)
		}
		for _, attack := range []string{
			"rm /tmp/nvidia-mps/" + mps.ControlSocket,
			"mv /tmp/nvidia-mps/" + mps.ControlSocket + " /tmp/nvidia-mps/old",
			"touch /tmp/nvidia-mps/x", // as a listener's bind would make its socket
		} {
			if out, err := ctd.Exec(id, "sh", "-c", attack); err == nil {
				t.Errorf("in pod %s, %q succeeded: %s", pod.Name, attack, out)
			}
		}
		if out, err := ctd.Exec(id, "sh", "-c", "echo get_default_active_thread_percentage | nvidia-cuda-mps-control"); err != nil || strings.TrimSpace(out) != "50" {
			t.Errorf("after the attacks, a client in pod %s asking its daemon: %q, %v", pod.Name, out, err)
		}
	}
	thirdID, third := newPod(t, ctd, map[string]string{"gpus.nri-gpu.io": harness.UUID(0)})
	createFailsOn(t, ctd, thirdID, third, harness.Container{Name: "c"},
		"is shared by policy.sharing[0] (replicas 2, mps) and used by 2 already: ", pods[0], pods[1])

	countID, count := newPod(t, ctd, map[string]string{"gpu-count.nri-gpu.io": "1"})
	if _, spec := runContainer(t, ctd, countID, count, harness.Container{Name: "c"}); !slices.Equal(gpuNodes(spec), []string{"/dev/nvidia1"}) || !slices.Equal(client(spec), want(1)) {
		t.Errorf("a count of 1: %v %q, want the unused GPU 1 with its daemon", gpuNodes(spec), client(spec))
	}
}
