package plugin_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/internal/mpsstandin"
	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
	"github.com/nri-gpu/nri-gpu/pkg/mps"
	"github.com/nri-gpu/nri-gpu/pkg/plugin"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/record"
	"github.com/nri-gpu/nri-gpu/pkg/specs/nvidia"
)

var (
	standinOnce sync.Once
	standinPath string
	standinErr  error
)

// TestMain removes the stand-in built for the tests.
func TestMain(m *testing.M) {
	code := m.Run()
	if standinPath != "" {
		_ = os.RemoveAll(filepath.Dir(standinPath))
	}
	os.Exit(code)
}

// standin returns the stand-in for nvidia-cuda-mps-control
// (test/tools/mps-control), built once per test binary.
func standin(t *testing.T) string {
	t.Helper()
	standinOnce.Do(func() {
		dir, err := os.MkdirTemp("", "mps-control-")
		if err != nil {
			standinErr = err
			return
		}
		standinPath, standinErr = mpsstandin.Build(dir)
	})
	if standinErr != nil {
		t.Fatal(standinErr)
	}
	return standinPath
}

// startedInDir starts the stand-in's daemon with shm as its /dev/shm, as
// the mps-shm command would.
var startedInDir = mps.Start(func(shm string, cmd *exec.Cmd) error {
	cmd.Env = append(cmd.Env, "STANDIN_SHM="+shm)
	return cmd.Run()
})

func mpsConfig(ctl, root, daemon, limit string) string {
	mem := ""
	if limit != "" {
		mem = ", pinnedMemoryLimit: " + limit
	}
	return fmt.Sprintf(`healthInterval: 100ms
policy:
  exclusive: true
  sharing: [{devices: ["nvidia.com/gpu=*"], replicas: 3, strategy: mps%s}]
mps: {daemon: %s, controlCommand: %s, root: %s}
`, mem, daemon, ctl, root)
}

// clientOf returns the MPS client environment and mounts an adjustment
// gives.
func clientOf(adj *api.ContainerAdjustment) (env, mounts []string) {
	for _, kv := range adj.GetEnv() {
		if strings.HasPrefix(kv.Key, "CUDA_MPS_") {
			env = append(env, kv.Key+"="+kv.Value)
		}
	}
	for _, m := range adj.GetMounts() {
		mounts = append(mounts, fmt.Sprintf("%s:%s:%s", m.Source, m.Destination, strings.Join(m.Options, ",")))
	}
	slices.Sort(env)
	slices.Sort(mounts)
	return env, mounts
}

func wantClient(t *testing.T, adj *api.ContainerAdjustment, dir string, threads int, memMiB int64) {
	t.Helper()
	env, mounts := clientOf(adj)
	wantEnv := []string{
		fmt.Sprintf("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=%d", threads),
		"CUDA_MPS_LOG_DIRECTORY=/var/log/nvidia-mps",
		fmt.Sprintf("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=%dM", memMiB),
		"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
	}
	wantMounts := []string{
		dir + "/log:/var/log/nvidia-mps:rbind,nosuid,nodev,ro",
		dir + "/pipe:/tmp/nvidia-mps:rbind,nosuid,nodev,ro",
		dir + "/shm:/dev/shm:rbind,nosuid,nodev,rw",
	}
	if !slices.Equal(env, wantEnv) {
		t.Errorf("MPS client env %q, want %q", env, wantEnv)
	}
	if !slices.Equal(mounts, wantMounts) {
		t.Errorf("MPS client mounts %q, want %q", mounts, wantMounts)
	}
}

// TestMPSOverNRI: GPUs shared with MPS, the daemons run by the operator
// (mps.daemon: external), over NRI's runtime side. A pod is refused while
// its GPU's daemon does not answer, saying where nri-gpu looks for it;
// once it runs, each pod's container gets the GPU's pipe, log and shm
// directories and the per-client limits (an equal share of compute, the
// configured memory), up to the replicas; a container with two
// MPS-shared GPUs is refused, as is a pod once the daemon quits.
func TestMPSOverNRI(t *testing.T) {
	ctl, root := standin(t), testutil.ShortDir(t)
	r := runtime(t, mpsConfig(ctl, root, "external", "2Gi"))
	ask := func(name, devices string) (*api.ContainerAdjustment, error) {
		pod := gpuPod(name, map[string]string{"gpus.nri-gpu.io": devices})
		return r.create(pod, ctrOf(pod, nil))
	}
	gpu0 := filepath.Join(root, "0")
	// Pod z is refused, and holds nothing: a, b and c are the three.
	_, err := ask("z", "0")
	testutil.ErrorSays(t, err, `device "nvidia.com/gpu=0": policy.sharing[0] (replicas 3, mps) shares it with MPS, but MPS control daemon not running (pipe directory `+gpu0+`/pipe)`,
		"nri-gpu does not give an MPS-shared GPU unbounded",
		"run one with CUDA_MPS_PIPE_DIRECTORY="+gpu0+"/pipe, CUDA_MPS_LOG_DIRECTORY="+gpu0+"/log and "+gpu0+"/shm as its /dev/shm")

	d := mps.Daemon{Control: ctl, Dir: gpu0}
	t.Cleanup(func() { quitAll(root) })
	if err := d.Start(context.Background(), mps.Limits{ActiveThreadPercentage: 33, PinnedMemoryMiB: 2048}, startedInDir); err != nil {
		t.Fatal(err)
	}
	for _, pod := range []string{"a", "b", "c"} {
		adj, err := ask(pod, "0")
		if err != nil {
			t.Fatalf("pod %s: %v", pod, err)
		}
		wantClient(t, adj, gpu0, 33, 2048)
	}
	_, err = ask("d", "0")
	testutil.ErrorSays(t, err, `is shared by policy.sharing[0] (replicas 3, mps) and used by 3 already: pod tenant/a, pod tenant/b, pod tenant/c`)
	_, err = ask("e", "0,1")
	testutil.ErrorSays(t, err, "used by 3 already")
	r.removePod(t, gpuPod("c", nil))
	_, err = ask("e", "0,1")
	testutil.ErrorSays(t, err, `the container would have 2 MPS-shared GPUs ("nvidia.com/gpu=0", "nvidia.com/gpu=1"), and an MPS client reaches one GPU's daemon`)

	if err := d.Stop(context.Background(), ""); err != nil {
		t.Fatal(err)
	}
	_, err = ask("f", "0")
	testutil.ErrorSays(t, err, "MPS control daemon not running")
	if _, err := ask("f", "1"); err == nil {
		t.Error("GPU 1, whose daemon never ran, was given")
	}
}

// TestMPSManaged: with mps.daemon: managed, nri-gpu starts one control
// daemon per MPS-shared GPU, named by its UUID (NVML), with its own
// directories and /dev/shm, and the per-client limits as its defaults (an
// equal share of the GPU's memory, as NVML tells it, and of compute); it
// starts a daemon again when it dies, and stops the daemons when a reload
// shares the GPUs no more.
func TestMPSManaged(t *testing.T) {
	ctl, root := standin(t), testutil.ShortDir(t)
	lib := testutil.NVML(2)
	inv, err := nvidia.Discover(lib)
	if err != nil {
		t.Fatal(err)
	}
	r := runtimeSetUp(t, "v2.3.7", mpsConfig(ctl, root, "managed", ""), func() []plugin.Option {
		return []plugin.Option{plugin.WithNVML(lib), plugin.WithMPSStart(startedInDir)}
	})
	dirOf := func(i int) string { return filepath.Join(root, inv.GPUs[i].UUID) }
	running := func(i int) bool { return (mps.Daemon{Dir: dirOf(i)}).Ready(context.Background()) == nil }
	t.Cleanup(func() { quitAll(root) })
	// Started, with its defaults set.
	ready := func(i int) bool {
		data, _ := os.ReadFile(filepath.Join(dirOf(i), "pipe", mpsstandin.Defaults))
		return running(i) && strings.Count(string(data), "\n") == 2
	}
	testutil.Within(t, 10*time.Second, "a daemon for each GPU", func() bool { return ready(0) && ready(1) })
	mode := func(i int) nvml.ComputeMode {
		m, _ := lib.Devices[i].GetComputeMode()
		return m
	}
	for i := range 2 {
		if mode(i) != nvml.COMPUTEMODE_EXCLUSIVE_PROCESS {
			t.Errorf("GPU %d shared with MPS in compute mode %s, want Exclusive_Process", i, mps.ModeName(mode(i)))
		}
	}
	memMiB := int64(inv.GPUs[0].MemoryBytes/3) >> 20
	for i := range 2 {
		log := readFile(t, filepath.Join(dirOf(i), "log", mpsstandin.Log))
		if want := fmt.Sprintf(`run args=["-d"] CUDA_VISIBLE_DEVICES=%q`, inv.GPUs[i].UUID); !strings.Contains(log, want) {
			t.Errorf("GPU %d's daemon log:\n%s\nwant %s", i, log, want)
		}
		defaults := readFile(t, filepath.Join(dirOf(i), "pipe", mpsstandin.Defaults))
		if want := fmt.Sprintf("set_default_active_thread_percentage 33\nset_default_device_pinned_mem_limit 0 %dM\n", memMiB); defaults != want {
			t.Errorf("GPU %d's daemon defaults %q, want %q", i, defaults, want)
		}
		if got := readFile(t, filepath.Join(dirOf(i), "shm", mpsstandin.Started)); got != filepath.Join(dirOf(i), "pipe") {
			t.Errorf("GPU %d's daemon's /dev/shm is not its shm directory (%q)", i, got)
		}
	}
	pod := gpuPod("a", map[string]string{"gpus.nri-gpu.io": "0"})
	adj, err := r.create(pod, ctrOf(pod, nil))
	if err != nil {
		t.Fatal(err)
	}
	wantClient(t, adj, dirOf(0), 33, memMiB)

	// The daemon of GPU 1 dies: nri-gpu starts it again.
	if err := mpsstandin.Kill(filepath.Join(dirOf(1), "pipe")); err != nil {
		t.Fatal(err)
	}
	testutil.Within(t, 10*time.Second, "GPU 1's daemon started again", func() bool { return running(1) })

	// A reload that changes the limits sets them on the running daemons,
	// for their next servers.
	lower, err := config.Parse([]byte(mpsConfig(ctl, root, "managed", "1Gi")))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.plugin.Reload(lower); err != nil {
		t.Fatal(err)
	}
	testutil.Within(t, 10*time.Second, "the new limits set on both daemons", func() bool {
		for i := range 2 {
			data, _ := os.ReadFile(filepath.Join(dirOf(i), "pipe", mpsstandin.Defaults))
			if !strings.HasSuffix(string(data), "set_default_active_thread_percentage 33\nset_default_device_pinned_mem_limit 0 1024M\n") {
				return false
			}
		}
		return true
	})

	unshared, err := config.Parse([]byte("healthInterval: 100ms\npolicy: {exclusive: true}\nmps: {daemon: managed, controlCommand: " + ctl + ", root: " + root + "}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.plugin.Reload(unshared); err != nil {
		t.Fatal(err)
	}
	testutil.Within(t, 10*time.Second, "both daemons stopped", func() bool { return !running(0) && !running(1) })
	testutil.Within(t, 10*time.Second, "both GPUs back in Default compute mode", func() bool {
		return mode(0) == nvml.COMPUTEMODE_DEFAULT && mode(1) == nvml.COMPUTEMODE_DEFAULT
	})
}

// TestMPSComputeModeRefused: a GPU NVML does not put in Exclusive_Process
// gets no managed daemon (a client could leave MPS beside it), and its
// pods are refused.
func TestMPSComputeModeRefused(t *testing.T) {
	ctl, root := standin(t), testutil.ShortDir(t)
	lib := testutil.NVML(1)
	var tried atomic.Int32
	lib.Devices[0].(*dgxa100.Device).SetComputeModeFunc = func(nvml.ComputeMode) nvml.Return {
		tried.Add(1)
		return nvml.ERROR_NO_PERMISSION
	}
	r := runtimeSetUp(t, "v2.3.7", mpsConfig(ctl, root, "managed", ""), func() []plugin.Option {
		return []plugin.Option{plugin.WithNVML(lib), plugin.WithMPSStart(startedInDir)}
	})
	t.Cleanup(func() { quitAll(root) })
	testutil.Within(t, 10*time.Second, "the compute mode asked for", func() bool { return tried.Load() > 0 })
	pod := gpuPod("a", map[string]string{"gpus.nri-gpu.io": "0"})
	_, err := r.create(pod, ctrOf(pod, nil))
	testutil.ErrorSays(t, err, "MPS control daemon not running")
	if dirs, _ := filepath.Glob(filepath.Join(root, "*", "pipe", "control")); len(dirs) > 0 {
		t.Errorf("a daemon started on a GPU not in Exclusive_Process: %v", dirs)
	}
}

// quitAll has every stand-in daemon under root quit, or killed where
// it does not quit.
func quitAll(root string) {
	dirs, _ := filepath.Glob(filepath.Join(root, "*"))
	for _, d := range dirs {
		if (mps.Daemon{Control: standinPath, Dir: d}).Stop(context.Background(), "") != nil {
			_ = mpsstandin.Kill(filepath.Join(d, "pipe"))
		}
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// TestMPSRefused: what MPS sharing cannot bound is refused, saying why: a
// MIG device, and a GPU whose memory nothing tells (no NVML, no
// pinnedMemoryLimit).
func TestMPSRefused(t *testing.T) {
	cfg := "policy: {sharing: [{devices: [\"nvidia.com/gpu=*\"], replicas: 2, strategy: mps}]}\nmps: {controlCommand: " + standin(t) + "}\n"
	p, _ := logged(t, cfg, plugin.WithSpecDirs([]string{fourGPUs(t)}))
	for _, tc := range []struct{ device, want string }{
		{"3:0", `device "nvidia.com/gpu=3:0": policy.sharing[0] (replicas 2, mps) shares it with MPS, which nri-gpu does not do for MIG devices`},
		{"0", `device "nvidia.com/gpu=0": policy.sharing[0] (replicas 2, mps) bounds each MPS client to an equal share of the GPU's memory, which NVML does not tell here; set its pinnedMemoryLimit`},
	} {
		pod := gpuPod("a-"+strings.ReplaceAll(tc.device, ":", "-"), map[string]string{"gpus.nri-gpu.io": tc.device})
		_, _, err := p.CreateContainer(context.Background(), pod, ctrOf(pod, nil))
		testutil.ErrorSays(t, err, tc.want)
	}
}

// TestMPSBounds: where an MPS-shared GPU's daemon is and what bounds its
// clients, as nri-gpu devices shows them: a GPU the spec names by its
// UUID has its daemon under that UUID, NVML or not; a GPU whose memory
// NVML does not tell (0) needs pinnedMemoryLimit, as one without NVML.
func TestMPSBounds(t *testing.T) {
	dir := t.TempDir()
	node := filepath.Join(dir, "nvidia0")
	writeFile(t, node, nil)
	specDir := specDirWith(t, dir, "gpu.yaml", fmt.Sprintf(`cdiVersion: "0.6.0"
kind: nvidia.com/gpu
devices:
  - name: "0"
    containerEdits: {deviceNodes: [{path: /dev/nvidia0, hostPath: %[1]s, type: c, major: 195, minor: 0}]}
  - name: GPU-from-the-spec
    containerEdits: {deviceNodes: [{path: /dev/nvidia0, hostPath: %[1]s, type: c, major: 195, minor: 0}]}
`, node))
	noMemory := testutil.NVML(1)
	noMemory.Devices[0].(*dgxa100.Device).GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) { return nvml.Memory{}, nvml.SUCCESS }
	root := "/run/nri-gpu/mps"
	for _, tc := range []struct {
		name  string
		limit string
		lib   nvml.Interface
		want  string
	}{
		{"named by UUID, no NVML", "1Gi", nil, "each client 50% of compute, 1024 MiB of pinned memory; daemon in " + root + "/GPU-from-the-spec"},
		{"NVML does not tell the memory", "", noMemory, "which NVML does not tell here; set its pinnedMemoryLimit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem := ""
			if tc.limit != "" {
				mem = ", pinnedMemoryLimit: " + tc.limit
			}
			opts := []plugin.Option{plugin.WithSpecDirs([]string{specDir})}
			if tc.lib != nil {
				opts = append(opts, plugin.WithNVML(tc.lib))
			}
			p, _ := logged(t, fmt.Sprintf("policy: {sharing: [{devices: [\"nvidia.com/gpu=*\"], replicas: 2, strategy: mps%s}]}\nmps: {root: %s}\n", mem, root), opts...)
			shared := p.SharedDevices()
			if len(shared) != 1 || !strings.Contains(shared[0].Limits, tc.want) {
				t.Errorf("shared %+v, want one GPU whose limits say %q", shared, tc.want)
			}
		})
	}
}

// TestMPSDirOneElement: an MPS daemon's directory is named by its GPU's
// UUID only when that is one path element: NVML's answer is not trusted
// to be one (a UUID of "GPU-x/../../etc" would put the daemon, and the
// directories its clients are given, elsewhere).
func TestMPSDirOneElement(t *testing.T) {
	for _, uuid := range []string{"GPU-x/../../etc", "..", "."} {
		lib := testutil.NVML(1)
		lib.Devices[0].(*dgxa100.Device).GetUUIDFunc = func() (string, nvml.Return) { return uuid, nvml.SUCCESS }
		p, _ := logged(t, "policy: {sharing: [{devices: [\"nvidia.com/gpu=*\"], replicas: 2, strategy: mps}]}\nmps: {root: /run/nri-gpu/mps}\n",
			plugin.WithSpecDirs([]string{gpuSpecDir(t, 1)}), plugin.WithNVML(lib))
		shared := p.SharedDevices()
		if want := fmt.Sprintf("its MPS daemon's directory would be named %q, which is not one path element under /run/nri-gpu/mps", uuid); len(shared) != 1 || !strings.Contains(shared[0].Limits, want) {
			t.Errorf("UUID %q: shared %+v, want %q", uuid, shared, want)
		}
	}
}

// TestClaimOwnMPS: a claim that holds GPUs policy.sharing leaves
// unshared may have one shared with MPS among its own containers, as
// NVIDIA's gpu-test5 asks (one request time-sliced, one MPS): preparing
// it starts that GPU's daemon, in Exclusive_Process, before kubelet is
// told it is prepared; the containers of its MPS request are clients
// bound to what the GpuConfig asked (else the whole GPU), those of the
// other request are not; releasing it stops the daemon and puts the GPU
// back. Where nri-gpu does not run the daemons (mps.daemon: external),
// such a claim is refused and holds nothing.
func TestClaimOwnMPS(t *testing.T) {
	ctl, root := standin(t), testutil.ShortDir(t)
	lib := testutil.NVML(2)
	inv, err := nvidia.Discover(lib)
	if err != nil {
		t.Fatal(err)
	}
	unshared := func(daemon string) string {
		return "healthInterval: 100ms\npolicy: {exclusive: true, namespaces: [tenant]}\nmps: {daemon: " + daemon + ", controlCommand: " + ctl + ", root: " + root + "}\n"
	}
	f := &finder{uses: map[string][]link.ClaimUse{
		"a/ts-ctr":  {{UID: "uid-c", Namespace: "tenant", Name: "c", Requests: []string{"ts-gpu"}}},
		"a/mps-ctr": {{UID: "uid-c", Namespace: "tenant", Name: "c", Requests: []string{"mps-gpu"}}},
		"w/ctr":     {{UID: "uid-w", Namespace: "tenant", Name: "w"}},
	}}
	r := runtimeSetUp(t, "v2.3.7", unshared("managed"), func() []plugin.Option {
		return []plugin.Option{plugin.WithNVML(lib), plugin.WithMPSStart(startedInDir), claimsOf(f)}
	})
	t.Cleanup(func() { quitAll(root) })
	view := r.plugin.DRAView(config.Default().Start.DRA)
	dirOf := func(i int) string { return filepath.Join(root, inv.GPUs[i].UUID) }
	running := func(i int) bool { return (mps.Daemon{Dir: dirOf(i)}).Ready(context.Background()) == nil }
	mode := func(i int) nvml.ComputeMode {
		m, _ := lib.Devices[i].GetComputeMode()
		return m
	}
	mpsAsked := policy.GpuConfig{Strategy: config.StrategyMPS, ActiveThreadPercentage: 50, PinnedMemory: 10 << 30}
	if err := view.Prepare(context.Background(), policy.Claim{UID: "uid-c", Namespace: "tenant", Name: "c", Pods: []policy.PodName{{Namespace: "tenant", Name: "a"}}}, []link.Allocated{
		{CDI: "nvidia.com/gpu=0", Requests: []string{"ts-gpu"}, GpuConfig: policy.GpuConfig{Strategy: config.StrategyTimeSlicing}},
		{CDI: "nvidia.com/gpu=1", Requests: []string{"mps-gpu"}, GpuConfig: mpsAsked},
	}); err != nil {
		t.Fatal(err)
	}
	if !running(1) || running(0) {
		t.Errorf("prepared: GPU 1's daemon running %v, GPU 0's %v; want GPU 1's only", running(1), running(0))
	}
	if mode(1) != nvml.COMPUTEMODE_EXCLUSIVE_PROCESS || mode(0) != nvml.COMPUTEMODE_DEFAULT {
		t.Errorf("prepared: GPU 1 in %s, GPU 0 in %s; want Exclusive_Process and Default", mps.ModeName(mode(1)), mps.ModeName(mode(0)))
	}
	if got, want := readFile(t, filepath.Join(dirOf(1), "pipe", mpsstandin.Defaults)), "set_default_active_thread_percentage 50\nset_default_device_pinned_mem_limit 0 10240M\n"; got != want {
		t.Errorf("GPU 1's daemon defaults %q, want %q", got, want)
	}
	a := &api.PodSandbox{Id: "id-a", Name: "a", Namespace: "tenant", Uid: "uid-a"}
	for _, ctr := range []string{"mps-ctr", "ts-ctr"} {
		adj, err := r.create(a, container(a, ctr))
		if err != nil {
			t.Fatalf("%s: %v", ctr, err)
		}
		if ctr == "mps-ctr" {
			wantClient(t, adj, dirOf(1), 50, 10240)
		} else if env, mounts := clientOf(adj); len(env) > 0 || slices.ContainsFunc(mounts, func(m string) bool { return strings.HasPrefix(m, root) }) {
			t.Errorf("ts-ctr: an MPS client (%q, %q), want the GPU time-sliced", env, mounts)
		}
	}
	if got := r.plugin.SharedDevices(); len(got) != 1 || got[0].Device != "nvidia.com/gpu=1" || !slices.Equal(got[0].Users, []string{"claim tenant/c of pod tenant/a"}) ||
		got[0].Limits != "each client 50% of compute, 10240 MiB of pinned memory; daemon in "+dirOf(1) {
		t.Errorf("shared devices %+v, want GPU 1 shared by claim c's MPS", got)
	}
	// nri-gpu restarted: the claim, from its record, keeps its daemon
	// (the one running, not started again) and its clients' limits.
	pid := readFile(t, filepath.Join(dirOf(1), "pipe", mpsstandin.PidFile))
	r.restart(t, unshared("managed"))
	adj, err := r.create(a, container(a, "mps-ctr"))
	if err != nil {
		t.Fatalf("mps-ctr after a restart: %v", err)
	}
	wantClient(t, adj, dirOf(1), 50, 10240)
	if again := readFile(t, filepath.Join(dirOf(1), "pipe", mpsstandin.PidFile)); again != pid {
		t.Errorf("after a restart, GPU 1's daemon is pid %s, want %s still", again, pid)
	}
	view = r.plugin.DRAView(config.Default().Start.DRA)

	// The GPU is the claim's: a pod asking for it is refused.
	b := gpuPod("b", map[string]string{"gpus.nri-gpu.io": "1"})
	_, err = r.create(b, ctrOf(b, nil))
	testutil.ErrorSays(t, err, `"nvidia.com/gpu=1"`, "claim tenant/c of pod tenant/a")

	if err := view.Unprepare(context.Background(), "uid-c"); err != nil {
		t.Fatal(err)
	}
	if running(1) || mode(1) != nvml.COMPUTEMODE_DEFAULT {
		t.Errorf("claim c released: GPU 1's daemon running %v, GPU in %s; want it stopped and the GPU in Default", running(1), mps.ModeName(mode(1)))
	}

	// A claim asking for MPS and no bounds: its clients have the whole GPU.
	if err := view.Prepare(context.Background(), policy.Claim{UID: "uid-w", Namespace: "tenant", Name: "w", Pods: []policy.PodName{{Namespace: "tenant", Name: "w"}}}, []link.Allocated{
		{CDI: "nvidia.com/gpu=1", Requests: []string{"gpu"}, GpuConfig: policy.GpuConfig{Strategy: config.StrategyMPS}},
	}); err != nil {
		t.Fatal(err)
	}
	w := &api.PodSandbox{Id: "id-w", Name: "w", Namespace: "tenant", Uid: "uid-w"}
	adj, err = r.create(w, container(w, "ctr"))
	if err != nil {
		t.Fatal(err)
	}
	wantClient(t, adj, dirOf(1), 100, int64(inv.GPUs[1].MemoryBytes>>20))

	// nri-gpu does not run the daemons: refused, each GPU named, nothing
	// held.
	r = runtimeSetUp(t, "v2.3.7", unshared("external"), func() []plugin.Option { return []plugin.Option{plugin.WithNVML(lib)} })
	view = r.plugin.DRAView(config.Default().Start.DRA)
	err = view.Prepare(context.Background(), policy.Claim{UID: "uid-e", Namespace: "tenant", Name: "e"}, []link.Allocated{
		{CDI: "nvidia.com/gpu=0", Requests: []string{"gpu"}, GpuConfig: mpsAsked},
		{CDI: "nvidia.com/gpu=1", Requests: []string{"gpu"}, GpuConfig: mpsAsked},
	})
	testutil.ErrorSays(t, err, `claim tenant/e: MPS-shared GPU not served: device "nvidia.com/gpu=0": the GpuConfig of the claim that holds it asks for MPS, and nri-gpu runs an MPS daemon for a claim's GPU only with start.mps.daemon: managed`,
		`claim tenant/e: MPS-shared GPU not served: device "nvidia.com/gpu=1"`)
	for i, name := range []string{"e", "f"} {
		e := gpuPod(name, map[string]string{"gpus.nri-gpu.io": strconv.Itoa(i)})
		if _, err := r.create(e, ctrOf(e, nil)); err != nil {
			t.Errorf("GPU %d after the refused claim: %v", i, err)
		}
	}
}

// TestClaimOwnMPSUndone: a claim asking for MPS on a GPU policy.sharing
// leaves unshared whose preparation fails at each step after its
// admission in turn (its daemon does not start; it started, and the
// record cannot keep the claim) leaves nothing: no daemon, the GPU back
// in Default, no claim held; once the step works, it is prepared. Its
// daemon once stayed running, the GPU in Exclusive_Process, until the
// next look at the daemons.
func TestClaimOwnMPSUndone(t *testing.T) {
	ctl := standin(t)
	for _, step := range []string{"the daemon does not start", "the record cannot keep the claim"} {
		t.Run(step, func(t *testing.T) {
			root := testutil.ShortDir(t)
			lib := testutil.NVML(2)
			inv, err := nvidia.Discover(lib)
			if err != nil {
				t.Fatal(err)
			}
			var refuse atomic.Bool
			start := func(shm string, cmd *exec.Cmd) error {
				if refuse.Load() {
					return errors.New("refused to start")
				}
				return startedInDir(shm, cmd)
			}
			cfg := "policy: {exclusive: true, namespaces: [tenant]}\nmps: {daemon: managed, controlCommand: " + ctl + ", root: " + root + ", checkInterval: 1h}\n"
			r := runtimeSetUp(t, "v2.3.7", cfg, func() []plugin.Option {
				return []plugin.Option{plugin.WithNVML(lib), plugin.WithMPSStart(start)}
			})
			t.Cleanup(func() { quitAll(root) })
			view := r.plugin.DRAView(config.Default().Start.DRA)
			dir := filepath.Join(root, inv.GPUs[1].UUID)
			claim := policy.Claim{UID: "uid-c", Namespace: "tenant", Name: "c", Pods: []policy.PodName{{Namespace: "tenant", Name: "a"}}}
			gpu := []link.Allocated{{CDI: "nvidia.com/gpu=1", Requests: []string{"gpu"}, GpuConfig: policy.GpuConfig{Strategy: config.StrategyMPS}}}

			state := filepath.Dir(r.stateFile)
			want := mps.ErrNotServed
			if step == "the daemon does not start" {
				refuse.Store(true)
			} else {
				if err := os.RemoveAll(state); err != nil {
					t.Fatal(err)
				}
				writeFile(t, state, nil) // every save fails
				want = record.ErrNotRecorded
			}
			err = view.Prepare(context.Background(), claim, gpu)
			if !errors.Is(err, want) {
				t.Fatalf("preparing: %v, want %v", err, want)
			}
			mode, _ := lib.Devices[1].GetComputeMode()
			if (mps.Daemon{Dir: dir}).Ready(context.Background()) == nil || mode != nvml.COMPUTEMODE_DEFAULT {
				t.Errorf("after the failed preparation: daemon running %v, GPU in %s; want none, Default",
					(mps.Daemon{Dir: dir}).Ready(context.Background()) == nil, mps.ModeName(mode))
			}
			if prepared, _ := view.Prepared(context.Background()); len(prepared) > 0 {
				t.Errorf("claims held after the failed preparation: %v", prepared)
			}

			refuse.Store(false)
			if want == record.ErrNotRecorded {
				if err := os.Remove(state); err != nil {
					t.Fatal(err)
				}
			}
			if err := view.Prepare(context.Background(), claim, gpu); err != nil {
				t.Fatal(err)
			}
			if err := (mps.Daemon{Dir: dir}).Ready(context.Background()); err != nil {
				t.Errorf("prepared: %v", err)
			}
		})
	}
}

// TestMPSRecordRolledBack: nri-gpu died while it started or stopped a
// claim's MPS daemon, its record saying so (the GPU put in
// Exclusive_Process, from Default); the next nri-gpu, reading the
// record, finds no claim that wants the daemon: it stops it and puts the
// GPU back in Default, and its record keeps no daemon.
func TestMPSRecordRolledBack(t *testing.T) {
	ctl := standin(t)
	for _, tc := range []struct {
		name    string
		state   string
		running bool // the daemon runs
	}{
		{name: "a start, the daemon running", state: mps.Starting, running: true},
		{name: "a start, the daemon not started", state: mps.Starting},
		{name: "a stop, the daemon running", state: mps.Stopping, running: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := testutil.ShortDir(t)
			lib := testutil.NVML(2)
			uuid, _ := lib.Devices[0].GetUUID()
			dir := filepath.Join(root, uuid)
			d := mps.Daemon{Control: ctl, Dir: dir, GPU: uuid}
			t.Cleanup(func() { quitAll(root) })
			if ret := lib.Devices[0].SetComputeMode(nvml.COMPUTEMODE_EXCLUSIVE_PROCESS); ret != nvml.SUCCESS {
				t.Fatal(ret)
			}
			if tc.running {
				if err := d.Start(context.Background(), mps.Limits{ActiveThreadPercentage: 100}, startedInDir); err != nil {
					t.Fatal(err)
				}
			}
			cfg := "policy: {exclusive: true, namespaces: [tenant]}\nmps: {daemon: managed, controlCommand: " + ctl + ", root: " + root + ", checkInterval: 50ms}\n"
			r := runtimeWith(t, "v2.3.7", cfg, func(r *testRuntime) {
				r.options = func() []plugin.Option {
					return []plugin.Option{plugin.WithNVML(lib), plugin.WithMPSStart(startedInDir)}
				}
				rec := fmt.Sprintf(`{"version":1,"pods":[],"mpsDaemons":[{"device":"nvidia.com/gpu=0","control":%q,"dir":%q,"gpu":%q,"was":"Default","state":%q}]}`, ctl, dir, uuid, tc.state)
				if err := os.MkdirAll(filepath.Dir(r.stateFile), 0o700); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(r.stateFile, []byte(rec), 0o600); err != nil {
					t.Fatal(err)
				}
			})
			testutil.Within(t, 10*time.Second, "the daemon stopped, the GPU in Default, the record keeping none", func() bool {
				mode, _ := lib.Devices[0].GetComputeMode()
				data, _ := os.ReadFile(r.stateFile)
				return d.Ready(context.Background()) != nil && mode == nvml.COMPUTEMODE_DEFAULT && !strings.Contains(string(data), "mpsDaemons")
			})
		})
	}
}
