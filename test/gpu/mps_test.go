package gpu

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nri-gpu/nri-gpu/pkg/mps"
	"github.com/nri-gpu/nri-gpu/test/harness"
)

// mpsClient allocates device memory through the CUDA driver API, loaded
// by soname: "alloc MiB" allocates MiB in 64 MiB pieces and says whether
// it could; "hold MiB SECONDS" allocates MiB, holds it for SECONDS, then
// writes to it and says it is alive.
const mpsClient = `#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
typedef int (*fn)();
int main(int argc, char **argv) {
	if (argc < 3) { printf("usage: alloc|hold MiB [seconds]\n"); return 2; }
	void *h = dlopen("libcuda.so.1", RTLD_NOW);
	if (!h) { printf("dlopen libcuda.so.1: %s\n", dlerror()); return 1; }
	int (*init)(unsigned) = (int (*)(unsigned))dlsym(h, "cuInit");
	int (*get)(int *, int) = (int (*)(int *, int))dlsym(h, "cuDeviceGet");
	int (*ctx)(void **, unsigned, int) = (int (*)(void **, unsigned, int))dlsym(h, "cuCtxCreate_v2");
	int (*alloc)(unsigned long long *, size_t) = (int (*)(unsigned long long *, size_t))dlsym(h, "cuMemAlloc_v2");
	int (*memset8)(unsigned long long, unsigned char, size_t) = (int (*)(unsigned long long, unsigned char, size_t))dlsym(h, "cuMemsetD8_v2");
	int (*sync)(void) = (int (*)(void))dlsym(h, "cuCtxSynchronize");
	if (!init || !get || !ctx || !alloc || !memset8 || !sync) { printf("dlsym: %s\n", dlerror()); return 1; }
	int dev, r;
	void *c;
	if ((r = init(0)) || (r = get(&dev, 0)) || (r = ctx(&c, 0, dev))) { printf("context: error %d\n", r); return 1; }
	long want = atol(argv[2]), got = 0;
	unsigned long long first = 0, p;
	while (got < want) {
		if ((r = alloc(&p, 64UL << 20))) { printf("failed at %ld MiB: error %d\n", got, r); fflush(stdout); return 3; }
		if (!first) first = p;
		got += 64;
	}
	printf("allocated %ld MiB\n", got);
	fflush(stdout);
	if (strcmp(argv[1], "hold") == 0 && argc > 3) {
		sleep(atoi(argv[3]));
		if ((r = memset8(first, 7, 64UL << 20)) || (r = sync())) { printf("dead: error %d\n", r); return 4; }
		printf("alive\n");
	}
	return 0;
}
`

// TestRealMPS shares GPU 0 two ways with MPS, nri-gpu running its control
// daemon (the driver's nvidia-cuda-mps-control, mps.daemon: managed) with
// a pinned-memory limit of 2 GiB per client, on a throwaway containerd.
// Two pods' containers run a small CUDA program on GPU 0 at once: one
// holds 1 GiB; the other's 1 GiB fits, its 3 GiB fails at the limit; the
// first still runs and writes to its memory after that (where the driver
// bounds GPU memory per cgroup, nri-gpu bounds each client there to its
// 2 GiB too: the two bounds agree, and this run tells whether MPS
// clients run under it). A client bound
// lower by its environment (a claim's allocation) fails at that bound;
// the GPU is in Exclusive_Process, and a client that leaves MPS gets no
// unbounded context beside the server. The clients' pipe directory is
// read-only; what a client does when it raises its own limit, and when
// its control socket is a tenant's listener instead of the daemon, is
// measured and logged.
func TestRealMPS(t *testing.T) {
	if os.Getenv(RealEnv) != "1" {
		t.Skipf("needs an NVIDIA GPU and root: run test/gpu/run.sh on a GPU node (it sets %s=1)", RealEnv)
	}
	control, err := exec.LookPath("nvidia-cuda-mps-control")
	if err != nil {
		t.Fatalf("the driver's MPS control program: %v", err)
	}
	dir := t.TempDir()
	tools, err := harness.FindTools("")
	if err != nil {
		t.Fatal(err)
	}
	// The stand-in for nvidia-cuda-mps-control answers control commands
	// but is no MPS daemon: a tenant's listener.
	fake, err := harness.ProgramFiles(tools.Path("mps-control"), "fake-mps-control")
	if err != nil {
		t.Fatal(err)
	}
	specDir, ctd := realNode(t, dir, append(program(t, dir, "mpsclient", mpsClient), fake...), false)
	root := filepath.Join(dir, "mps")
	config := filepath.Join(dir, "nri-gpu.yaml")
	text := fmt.Sprintf(`cdiSpecDirs: [%s]
policy:
  sharing: [{devices: ["nvidia.com/gpu=0", "nvidia.com/gpu=GPU-*"], replicas: 2, strategy: mps, pinnedMemoryLimit: 2Gi}]
mps: {daemon: managed, controlCommand: %s, root: %s}
`, specDir, control, root)
	if err := os.WriteFile(config, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := ctd.StartPlugin("--config", config)
	if err != nil {
		t.Fatal(err)
	}
	// nri-gpu leaves its daemons running when it exits: quit them here.
	defer func() {
		dirs, _ := filepath.Glob(filepath.Join(root, "GPU-*"))
		for _, d := range dirs {
			if err := (mps.Daemon{Control: control, Dir: d}).Stop(context.Background(), ""); err != nil {
				t.Logf("quitting the MPS daemon of %s: %v", d, err)
			}
		}
	}()
	for deadline := time.Now().Add(60 * time.Second); !strings.Contains(p.Log(), "started MPS control daemon"); time.Sleep(time.Second) {
		if time.Now().After(deadline) {
			t.Fatalf("nri-gpu did not start the MPS daemon:\n%s", p.Log())
		}
	}
	run := func(name string) string {
		t.Helper()
		pod := harness.Pod{Name: name, Namespace: "default", Annotations: map[string]string{"gpus.nri-gpu.io": "0"}}
		podID, err := ctd.RunPod(pod)
		if err != nil {
			t.Fatal(err)
		}
		id, err := ctd.CreateContainer(podID, pod, harness.Container{Name: "cuda"})
		if err != nil {
			t.Fatalf("pod %s: %v\n%s", name, err, p.Log())
		}
		if err := ctd.StartContainer(id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	holder, other := run("holder"), run("other")
	if out, err := ctd.Exec(holder, "sh", "-c", "/mpsclient hold 1024 40 > /tmp/hold.log 2>&1 &"); err != nil {
		t.Fatalf("starting the holder: %v: %s", err, out)
	}
	// holdSays waits, bounded, for the holder's log to say what.
	holdSays := func(what string, within time.Duration) string {
		t.Helper()
		var log string
		for deadline := time.Now().Add(within); !strings.Contains(log, what) && !strings.Contains(log, "dead") && time.Now().Before(deadline); time.Sleep(time.Second) {
			log, _ = ctd.Exec(holder, "cat", "/tmp/hold.log")
		}
		return log
	}
	if log := holdSays("allocated 1024 MiB", time.Minute); !strings.Contains(log, "allocated 1024 MiB") {
		t.Fatalf("the holder did not allocate its 1 GiB: %s", log)
	}
	withinAndPast(t, ctd, other, other, 1024, "the other pod's 2 GiB MPS limit")
	// The pipe directory is read-only in the container, and CUDA's
	// client still reaches the daemon there (the allocations above):
	// a tenant cannot put a socket of its own in the daemon's place.
	if out, err := ctd.Exec(other, "touch", "/tmp/nvidia-mps/x"); err == nil {
		t.Errorf("a file made in the client's pipe directory: %s", out)
	}
	// A claim's clients are bound by their environment to what the claim
	// was allocated: 1 GiB here, below the daemon's 2 GiB default, fails
	// past 1 GiB.
	out, err := ctd.Exec(other, "sh", "-c", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1024M /mpsclient alloc 1536")
	t.Logf("a client bound to 1 GiB (a claim's allocation), 1.5 GiB: %s", out)
	if err == nil || !regexp.MustCompile(`failed at ([0-9]{3}|10[0-9]{2}) MiB`).MatchString(out) {
		t.Errorf("1.5 GiB past a claim's 1 GiB did not fail near 1 GiB: %v", err)
	}
	// The GPU is in Exclusive_Process while nri-gpu shares it with MPS.
	if mode, err := exec.Command("nvidia-smi", "--query-gpu=compute_mode", "--format=csv,noheader", "-i", "0").CombinedOutput(); err != nil || strings.TrimSpace(string(mode)) != "Exclusive_Process" {
		t.Errorf("GPU 0's compute mode while shared with MPS: %q, %v; want Exclusive_Process", mode, err)
	}
	// Measured: a client that raises its own limit in its environment
	// (a tenant controls its process's environment).
	out, _ = ctd.Exec(other, "sh", "-c", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M /mpsclient alloc 3072; echo exit=$?")
	t.Logf("MEASURED a client that raises its own pinned-memory limit to 8 GiB past the daemon's 2 GiB, asking 3 GiB: %s", out)
	// A client that leaves MPS (a pipe directory with no daemon) must
	// not get a context of its own beside the server: the GPU is in
	// Exclusive_Process.
	out, _ = ctd.Exec(other, "sh", "-c", "mkdir -p /tmp/nomps && CUDA_MPS_PIPE_DIRECTORY=/tmp/nomps timeout 30 /mpsclient alloc 3072; echo exit=$?")
	t.Logf("a client outside MPS: %s", out)
	if strings.Contains(out, "allocated 3072 MiB") {
		t.Errorf("a client that left MPS ran beside the server, unbounded: %s", out)
	}
	// Measured: what a client does when its control socket is not the
	// daemon's, as it would be had a tenant replaced it: the fake
	// listens on "control" of a directory of the container's own, and
	// the client, pointed there, asks for 3 GiB (past the 2 GiB bound).
	out, _ = ctd.Exec(other, "sh", "-c", "mkdir -p /tmp/fake && CUDA_MPS_PIPE_DIRECTORY=/tmp/fake STANDIN_SHM=/tmp/fake /fake-mps-control -d && "+
		"CUDA_MPS_PIPE_DIRECTORY=/tmp/fake timeout 30 /mpsclient alloc 3072; echo exit=$?")
	what := "refused: it got no context"
	switch {
	case strings.Contains(out, "exit=124") || strings.Contains(out, "exit=143"):
		what = "hung until killed after 30 s"
	case strings.Contains(out, "allocated 3072 MiB"):
		what = "ran outside MPS, unbounded (3 GiB past the 2 GiB bound)"
	case strings.Contains(out, "failed at"):
		what = "got a context and was bounded"
	}
	t.Logf("MEASURED a client whose control socket is not the daemon's: %s:\n%s", what, out)
	log := holdSays("alive", 90*time.Second) // it holds for 40 s, then writes
	t.Logf("the holder: %s", log)
	if !strings.Contains(log, "allocated 1024 MiB") || !strings.Contains(log, "alive") {
		t.Errorf("the holder did not keep running beside the other's failed allocation")
	}
}
