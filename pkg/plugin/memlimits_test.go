package plugin_test

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
	"github.com/nri-gpu/nri-gpu/pkg/memlimit"
	"github.com/nri-gpu/nri-gpu/pkg/metrics"
	"github.com/nri-gpu/nri-gpu/pkg/mps"
	"github.com/nri-gpu/nri-gpu/pkg/plugin"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
)

// sharedMemory shares GPUs 0 and 1 by time-slicing, two pods each, 40Gi
// of memory counted: 20Gi for a pod that asks no amount.
const sharedMemory = `policy:
  exclusive: true
  sharing: [{devices: ["nvidia.com/gpu=0", "nvidia.com/gpu=1"], replicas: 2, memory: 40Gi}]
`

// cgroupNode is where a node's containers' cgroups are found: a proc
// directory whose processes place puts in a cgroup, and a cgroup v2
// mount (the unified hierarchy, mounted for the test: the driver limits
// cgroup v2 only).
func cgroupNode(t *testing.T) (c memlimit.Cgroups, place func(ctr *api.Container, pid int, cgroup string)) {
	t.Helper()
	c = memlimit.Cgroups{Proc: t.TempDir(), Root: testutil.Cgroup2(t)}
	return c, func(ctr *api.Container, pid int, cgroup string) {
		t.Helper()
		ctr.Pid = uint32(pid)
		dir := filepath.Join(c.Proc, fmt.Sprint(pid))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte("0::"+cgroup+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// boundsNode is a plugin of cfg over four GPUs whose driver has
// per-cgroup memory limits (limits records the calls), its containers'
// cgroups as place puts them.
type boundsNode struct {
	p      *plugin.Plugin
	lib    *dgxa100.Server
	limits *testutil.Limits
	cg     memlimit.Cgroups
	place  func(ctr *api.Container, pid int, cgroup string)
	m      *metrics.Metrics
	// specs is the spec directory.
	specs string
}

func newBoundsNode(t *testing.T, cfg string, opts ...plugin.Option) *boundsNode {
	t.Helper()
	n := &boundsNode{lib: testutil.NVML(4), m: metrics.New(), specs: fourGPUs(t)}
	n.limits = testutil.MemoryLimits(n.lib)
	n.cg, n.place = cgroupNode(t)
	n.p = inProcess(t, cfg, n.specs, append([]plugin.Option{plugin.WithNVML(n.lib), plugin.WithCgroups(n.cg), plugin.WithMetrics(n.m)}, opts...)...)
	return n
}

// uuid returns GPU i's UUID.
func (n *boundsNode) uuid(i int) string {
	u, _ := n.lib.Devices[i].GetUUID()
	return u
}

// run creates and starts a container of pod name asking for GPU gpu, its
// process pid in its own cgroup; it returns the container.
func (n *boundsNode) run(t *testing.T, name, gpu string, pid int, env ...string) *api.Container {
	t.Helper()
	pod := gpuPod(name, map[string]string{"gpus.nri-gpu.io": gpu})
	ctr := ctrOf(pod, nil)
	ctr.Env = env
	n.place(ctr, pid, "/kubepods/"+name+"/"+ctr.Id)
	if _, _, err := n.p.CreateContainer(context.Background(), pod, ctr); err != nil {
		t.Fatal(err)
	}
	if err := n.p.StartContainer(context.Background(), pod, ctr); err != nil {
		t.Fatal(err)
	}
	return ctr
}

// TestMemoryBounds: a container holding a GPU that time-slicing shares
// with its memory counted is bounded by the driver, on its own cgroup,
// when it starts, to what the pool gave its pod (soft and hard), lower
// where its environment asks less (NVIDIA_GPU_MEMORY_REQUEST and _LIMIT,
// MiB), never higher; the metrics tell each holder's limit; its stop
// lifts them. A GPU held whole gets none; an environment that asks a
// malformed limit is refused, naming it.
func TestMemoryBounds(t *testing.T) {
	n := newBoundsNode(t, sharedMemory)
	a := n.run(t, "a", "0", 1001)
	b := n.run(t, "b", "0", 1002, "NVIDIA_GPU_MEMORY_REQUEST=512", "NVIDIA_GPU_MEMORY_LIMIT=1024")
	c := n.run(t, "c", "1", 1003, "NVIDIA_GPU_MEMORY_LIMIT=999999")
	n.run(t, "d", "2", 1004) // not shared: held whole
	cgroup := func(name string, ctr *api.Container) string { return n.cg.Root + "/kubepods/" + name + "/" + ctr.Id }
	want := []testutil.Limit{
		{UUID: n.uuid(0), Cgroup: cgroup("a", a), Soft: 20 << 30, Hard: 20 << 30},
		{UUID: n.uuid(0), Cgroup: cgroup("b", b), Soft: 512 << 20, Hard: 1 << 30},
		{UUID: n.uuid(1), Cgroup: cgroup("c", c), Soft: 20 << 30, Hard: 20 << 30},
	}
	if got := n.limits.Calls(); !slices.Equal(got, want) {
		t.Errorf("the driver was asked\n%v\nwant\n%v", got, want)
	}
	// What explain shows of a container created and not yet started.
	x := gpuPod("x", map[string]string{"gpus.nri-gpu.io": "1"})
	if _, _, err := n.p.Create(context.Background(), x, ctrOf(x, nil)); err != nil {
		t.Fatal(err)
	}
	if got, want := n.p.MemoryBounds("x-c"), []plugin.MemoryBound{{Device: "nvidia.com/gpu=1", UUID: n.uuid(1), Soft: 20 << 30, Hard: 20 << 30}}; !slices.Equal(got, want) {
		t.Errorf("explain's bounds %v, want %v", got, want)
	}
	body := scrape(t, n.m)
	for pod, limit := range map[string]string{"a": "2.147483648e+10", "b": "1.073741824e+09", "c": "2.147483648e+10"} {
		if !strings.Contains(body, fmt.Sprintf(`pod=%q} %s`, pod, limit)) || !strings.Contains(body, "nri_gpu_device_holder_memory_limit_bytes") {
			t.Errorf("no memory limit %s of pod %s in the metrics:\n%s", limit, pod, body)
		}
	}
	if strings.Contains(body, `nri_gpu_device_holder_memory_limit_bytes{GPU_I_ID="",UUID="`+n.uuid(2)) {
		t.Errorf("a limit of GPU 2, held whole:\n%s", body)
	}

	if _, err := n.p.StopContainer(context.Background(), gpuPod("a", nil), a); err != nil {
		t.Fatal(err)
	}
	lift := testutil.Limit{UUID: n.uuid(0), Cgroup: cgroup("a", a), Soft: 0, Hard: math.MaxUint64}
	if got := n.limits.Calls(); len(got) != 4 || got[3] != lift {
		t.Errorf("after a's stop the driver was asked %v, want the lift %v last", got, lift)
	}
	if strings.Contains(scrape(t, n.m), `nri_gpu_device_holder_memory_limit_bytes{GPU_I_ID="",UUID="`+n.uuid(0)+`",cdi_device="nvidia.com/gpu=0",claim="",door="annotation",gpu="0",namespace="tenant",pod="a"}`) {
		t.Error("a's limit still in the metrics after its stop")
	}

	e := gpuPod("e", map[string]string{"gpus.nri-gpu.io": "1"})
	ctr := ctrOf(e, nil)
	ctr.Env = []string{"NVIDIA_GPU_MEMORY_LIMIT=lots"}
	_, _, err := n.p.CreateContainer(context.Background(), e, ctr)
	testutil.ErrorSays(t, err, `NVIDIA_GPU_MEMORY_LIMIT="lots": not a whole number of MiB`)
}

// TestMemoryBoundsFailClosed: a container whose bounds cannot be set
// when it starts (its process is not in its cgroup, the driver fails) is
// stopped and its start fails, saying why.
func TestMemoryBoundsFailClosed(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cgroup string
		answer nvml.Return
		want   string
	}{
		{"the process is another container's", "/kubepods/other/ctr", nvml.SUCCESS, "is not in container"},
		{"the driver fails", "", nvml.ERROR_UNKNOWN, "setting the memory limits of GPU-"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newBoundsNode(t, sharedMemory)
			var stopped []string
			n.p.StopWith(func(c *api.Container) error { stopped = append(stopped, c.Id); return nil })
			pod := gpuPod("a", map[string]string{"gpus.nri-gpu.io": "0"})
			ctr := ctrOf(pod, nil)
			n.place(ctr, 1001, cmpOr(tc.cgroup, "/kubepods/a/"+ctr.Id))
			if _, _, err := n.p.CreateContainer(context.Background(), pod, ctr); err != nil {
				t.Fatal(err)
			}
			n.limits.Answer(tc.answer)
			err := n.p.StartContainer(context.Background(), pod, ctr)
			testutil.ErrorSays(t, err, `container "c" of pod tenant/a: its GPU memory cannot be bounded`, tc.want)
			if !slices.Equal(stopped, []string{ctr.Id}) {
				t.Errorf("stopped %v, want the container", stopped)
			}
		})
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// TestMemoryBoundsUnenforceable: where the driver cannot bound memory (it
// lacks the call), a pod asking a GPU time-slicing shares with its
// memory counted is refused under policy.memoryLimits: enforced (the
// default), naming why and the key; under agreement it runs, said in
// its pod's events, with no bound set; a GPU held whole is served.
func TestMemoryBoundsUnenforceable(t *testing.T) {
	for _, mode := range []string{"", "agreement"} {
		t.Run("memoryLimits "+mode, func(t *testing.T) {
			var events []link.Event
			cfg := sharedMemory
			if mode != "" {
				cfg = strings.Replace(cfg, "policy:\n", "policy:\n  memoryLimits: "+mode+"\n", 1)
			}
			lib := testutil.NVML(4) // no per-cgroup limits
			cg, place := cgroupNode(t)
			p := inProcess(t, cfg, fourGPUs(t), plugin.WithNVML(lib), plugin.WithCgroups(cg), plugin.WithEvents(eventsTo(&events)))
			pod := gpuPod("a", map[string]string{"gpus.nri-gpu.io": "0"})
			ctr := ctrOf(pod, nil)
			place(ctr, 1001, "/kubepods/a/"+ctr.Id)
			_, _, err := p.CreateContainer(context.Background(), pod, ctr)
			if mode == "" {
				testutil.ErrorSays(t, err, `device "nvidia.com/gpu=0": policy.sharing[0] (replicas 2, timeSlicing) counts each holder's memory, which the driver cannot bound here`,
					"the driver's NVML has no nvmlDeviceSetMemoryLimits_v1", "set policy.memoryLimits: agreement")
			} else {
				if err != nil {
					t.Fatal(err)
				}
				if err := p.StartContainer(context.Background(), pod, ctr); err != nil {
					t.Errorf("start: %v", err)
				}
				if len(events) != 1 || events[0].Reason != plugin.MemoryByAgreementReason || !strings.Contains(events[0].Note, "bounded by agreement only") || events[0].Pod != "a" {
					t.Errorf("events %+v, want one saying a's GPU memory is bounded by agreement only", events)
				}
			}
			whole := gpuPod("b", map[string]string{"gpus.nri-gpu.io": "2"})
			if _, _, err := p.CreateContainer(context.Background(), whole, ctrOf(whole, nil)); err != nil {
				t.Errorf("GPU 2, held whole: %v", err)
			}
		})
	}
}

// TestMemoryBoundsRestored: a restarted nri-gpu sets again, at
// Synchronize, the bounds of each running container it gave a GPU whose
// holders' memory is counted (the driver keeps a cgroup's; it learns
// them again, to lift them at the container's stop); sets those of a
// container created before the restart and started after it, at its
// start; and none of a container that no longer runs.
func TestMemoryBoundsRestored(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state.json")
	n := newBoundsNode(t, sharedMemory, plugin.WithStateFile(state))
	pod := gpuPod("a", map[string]string{"gpus.nri-gpu.io": "0"})
	running, created, exited := ctrOf(pod, nil), ctrOf(pod, nil), ctrOf(pod, nil)
	created.Id, created.Name, created.State = "a-created", "created", api.ContainerState_CONTAINER_CREATED
	exited.Id, exited.Name, exited.State = "a-exited", "exited", api.ContainerState_CONTAINER_STOPPED
	for i, c := range []*api.Container{running, created, exited} {
		n.place(c, 1001+i, "/kubepods/a/"+c.Id)
		adj, _, err := n.p.CreateContainer(context.Background(), pod, c)
		if err != nil {
			t.Fatal(err)
		}
		c.Annotations = map[string]string{}
		for k, v := range adj.GetAnnotations() {
			c.Annotations[k] = v
		}
	}
	n.p.Close()
	cfg, err := config.Parse([]byte(sharedMemory))
	if err != nil {
		t.Fatal(err)
	}
	second, err := plugin.New(cfg, quiet(), plugin.WithSpecDirs([]string{n.specs}), plugin.WithNVML(n.lib), plugin.WithCgroups(n.cg), plugin.WithStateFile(state))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(second.Close)
	if _, err := second.Synchronize(context.Background(), []*api.PodSandbox{pod}, []*api.Container{running, created, exited}); err != nil {
		t.Fatal(err)
	}
	bound := func(c *api.Container) testutil.Limit {
		return testutil.Limit{UUID: n.uuid(0), Cgroup: n.cg.Root + "/kubepods/a/" + c.Id, Soft: 20 << 30, Hard: 20 << 30}
	}
	if got, want := n.limits.Calls(), []testutil.Limit{bound(running)}; !slices.Equal(got, want) {
		t.Errorf("after the restart the driver was asked %v, want %v", got, want)
	}
	created.State = api.ContainerState_CONTAINER_RUNNING
	if err := second.StartContainer(context.Background(), pod, created); err != nil {
		t.Fatal(err)
	}
	if got, want := n.limits.Calls(), []testutil.Limit{bound(running), bound(created)}; !slices.Equal(got, want) {
		t.Errorf("at the start of the container created before the restart the driver was asked %v, want %v", got, want)
	}
	if _, err := second.StopContainer(context.Background(), pod, running); err != nil {
		t.Fatal(err)
	}
	if got := n.limits.Calls(); len(got) != 3 || got[2].Hard != math.MaxUint64 || got[2].Cgroup != bound(running).Cgroup {
		t.Errorf("the restarted nri-gpu's lift at the stop: %v", got)
	}
}

// limitsHookSpecDir writes fourGPUs' spec with NVIDIA's
// apply-cuda-memory-limits hook on each GPU (as nvidia-ctk writes it),
// and returns its directory.
func limitsHookSpecDir(t *testing.T, uuid func(int) string) string {
	t.Helper()
	dir := fourGPUs(t)
	file := filepath.Join(dir, "gpu.yaml")
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	spec := string(data)
	for i := range 2 {
		node := fmt.Sprintf("deviceNodes: [{path: /dev/nvidia%d,", i)
		hook := fmt.Sprintf("hooks: [{hookName: createRuntime, path: /usr/bin/nvidia-cdi-hook, args: [nvidia-cdi-hook, apply-cuda-memory-limits, --gpu-id, %s]}]\n      %s", uuid(i), node)
		spec = strings.Replace(spec, node, hook, 1)
	}
	if err := os.WriteFile(file, []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestMemoryBoundsHookFree: hook-free, NVIDIA's apply-cuda-memory-limits
// hook is left out and nri-gpu sets what it would: the limits a
// container asks in its environment, on a GPU it holds whole, and on a
// shared one the lower of those and the pool's; a container that asks
// none, on a GPU held whole, gets none.
func TestMemoryBoundsHookFree(t *testing.T) {
	lib := testutil.NVML(4)
	limits := testutil.MemoryLimits(lib)
	cg, place := cgroupNode(t)
	uuid := func(i int) string { u, _ := lib.Devices[i].GetUUID(); return u }
	cfg := "hookFree: true\npolicy:\n  exclusive: true\n  sharing: [{devices: [\"nvidia.com/gpu=1\"], replicas: 2, memory: 40Gi}]\n"
	p := inProcess(t, cfg, limitsHookSpecDir(t, uuid), plugin.WithNVML(lib), plugin.WithCgroups(cg))
	run := func(name, gpu string, pid int, env ...string) string {
		t.Helper()
		pod := gpuPod(name, map[string]string{"gpus.nri-gpu.io": gpu})
		ctr := ctrOf(pod, nil)
		ctr.Env = env
		place(ctr, pid, "/kubepods/"+name+"/"+ctr.Id)
		adj, _, err := p.CreateContainer(context.Background(), pod, ctr)
		if err != nil {
			t.Fatal(err)
		}
		if adj.GetHooks() != nil {
			t.Errorf("hook-free, %s got hooks %v", name, adj.GetHooks())
		}
		if err := p.StartContainer(context.Background(), pod, ctr); err != nil {
			t.Fatal(err)
		}
		return cg.Root + "/kubepods/" + name + "/" + ctr.Id
	}
	a := run("a", "0", 1001, "NVIDIA_GPU_MEMORY_LIMIT=2048")
	run("b", "2", 1002, "NVIDIA_GPU_MEMORY_LIMIT=2048") // its spec has no such hook
	c := run("c", "1", 1003, "NVIDIA_GPU_MEMORY_REQUEST=1024")
	want := []testutil.Limit{
		{UUID: uuid(0), Cgroup: a, Soft: 2 << 30, Hard: 2 << 30},
		{UUID: uuid(1), Cgroup: c, Soft: 1 << 30, Hard: 20 << 30},
	}
	if got := limits.Calls(); !slices.Equal(got, want) {
		t.Errorf("the driver was asked\n%v\nwant\n%v", got, want)
	}
	run("d", "3", 1004)
	if got := limits.Calls(); len(got) != len(want) {
		t.Errorf("a container that asks no limit, on a GPU held whole: %v", got[len(want):])
	}
}

// TestMemoryBoundsEveryDoor: the bound follows what the pool gave the
// holder, whichever door it came through: a DRA claim's container is
// bounded to the claim's allocation (kube-scheduler's consumable memory:
// 8Gi), a device-plugin pod's (kubelet's CDI device) to the entry's
// default (20Gi).
func TestMemoryBoundsEveryDoor(t *testing.T) {
	f := &finder{uses: map[string][]link.ClaimUse{"a/gpu": {{UID: "uid-c", Namespace: "tenant", Name: "c"}}}}
	n := newBoundsNode(t, sharedMemory, claimsOf(f))
	if err := n.p.DRAView(config.Default().Start.DRA).Prepare(context.Background(),
		policy.Claim{UID: "uid-c", Namespace: "tenant", Name: "c", Pods: []policy.PodName{{Namespace: "tenant", Name: "a"}}},
		[]link.Allocated{{CDI: "nvidia.com/gpu=0", Requests: []string{"gpu"}, Use: policy.Use{Shares: 1, Memory: 8 << 30}, MemoryAsked: true}}); err != nil {
		t.Fatal(err)
	}
	start := func(pod *api.PodSandbox, ctr *api.Container, pid int) string {
		t.Helper()
		n.place(ctr, pid, "/kubepods/"+pod.Name+"/"+ctr.Id)
		if _, _, err := n.p.CreateContainer(context.Background(), pod, ctr); err != nil {
			t.Fatal(err)
		}
		if err := n.p.StartContainer(context.Background(), pod, ctr); err != nil {
			t.Fatal(err)
		}
		return n.cg.Root + "/kubepods/" + pod.Name + "/" + ctr.Id
	}
	a := &api.PodSandbox{Id: "id-a", Name: "a", Namespace: "tenant", Uid: "uid-a"}
	claimed := start(a, container(a, "gpu"), 1001)
	b := gpuPod("b", nil)
	kubelet := start(b, container(b, "c", "nvidia.com/gpu=1"), 1002)
	want := []testutil.Limit{
		{UUID: n.uuid(0), Cgroup: claimed, Soft: 8 << 30, Hard: 8 << 30},
		{UUID: n.uuid(1), Cgroup: kubelet, Soft: 20 << 30, Hard: 20 << 30},
	}
	if got := n.limits.Calls(); !slices.Equal(got, want) {
		t.Errorf("the driver was asked\n%v\nwant\n%v", got, want)
	}
}

// TestMemoryBoundsCount: a count request's GPU is bounded as one asked
// by name: the least-used shared GPU it was given, to the entry's
// default (40Gi four ways: 10Gi).
func TestMemoryBoundsCount(t *testing.T) {
	n := newBoundsNode(t, "policy:\n  sharing: [{devices: [\"nvidia.com/gpu=0\", \"nvidia.com/gpu=1\"], replicas: 4, memory: 40Gi}]\n  devices: [\"nvidia.com/gpu=0\", \"nvidia.com/gpu=1\"]\n")
	n.run(t, "a", "0", 1001)
	pod := gpuPod("counted", map[string]string{"gpu-count.nri-gpu.io": "1"})
	ctr := ctrOf(pod, nil)
	n.place(ctr, 1002, "/kubepods/counted/"+ctr.Id)
	adj, _, err := n.p.CreateContainer(context.Background(), pod, ctr)
	if err != nil {
		t.Fatal(err)
	}
	if got := devicePaths(adj); !slices.Contains(got, "/dev/nvidia1") {
		t.Fatalf("the count request got %v, want GPU 1, the least used", got)
	}
	if err := n.p.StartContainer(context.Background(), pod, ctr); err != nil {
		t.Fatal(err)
	}
	want := testutil.Limit{UUID: n.uuid(1), Cgroup: n.cg.Root + "/kubepods/counted/" + ctr.Id, Soft: 10 << 30, Hard: 10 << 30}
	if got := n.limits.Calls(); len(got) != 2 || got[1] != want {
		t.Errorf("the driver was asked %v, want %v last", got, want)
	}
}

// TestMemoryBoundsMPS: an MPS client, which MPS bounds to its pinned
// memory, is bounded by the driver to the same where the driver can (a
// second bound, on its own cgroup, lifted at its stop); where the driver
// cannot (it lacks the call), it runs bounded by MPS alone: not refused
// under policy.memoryLimits: enforced, and nothing said of agreement.
func TestMemoryBoundsMPS(t *testing.T) {
	for _, driver := range []bool{true, false} {
		t.Run(fmt.Sprintf("driver bounds %v", driver), func(t *testing.T) {
			ctl, root := standin(t), testutil.ShortDir(t)
			t.Cleanup(func() { quitAll(root) })
			var events []link.Event
			lib := testutil.NVML(4)
			var limits *testutil.Limits
			if driver {
				limits = testutil.MemoryLimits(lib)
			}
			cg, place := cgroupNode(t)
			cfg := fmt.Sprintf("policy:\n  sharing: [{devices: [\"nvidia.com/gpu=0\"], replicas: 2, strategy: mps, pinnedMemoryLimit: 8Gi}]\n"+
				"mps: {daemon: external, controlCommand: %s, root: %s}\n", ctl, root)
			p := inProcess(t, cfg, fourGPUs(t), plugin.WithNVML(lib), plugin.WithCgroups(cg), plugin.WithEvents(eventsTo(&events)))
			uuid, _ := lib.Devices[0].GetUUID()
			d := mps.Daemon{Control: ctl, Dir: filepath.Join(root, uuid)}
			if err := d.Start(context.Background(), mps.Limits{ActiveThreadPercentage: 50, PinnedMemoryMiB: 8 << 10}, startedInDir); err != nil {
				t.Fatal(err)
			}
			pod := gpuPod("a", map[string]string{"gpus.nri-gpu.io": "0"})
			ctr := ctrOf(pod, nil)
			place(ctr, 1001, "/kubepods/a/"+ctr.Id)
			if _, _, err := p.CreateContainer(context.Background(), pod, ctr); err != nil {
				t.Fatal(err)
			}
			if err := p.StartContainer(context.Background(), pod, ctr); err != nil {
				t.Fatal(err)
			}
			if _, err := p.StopContainer(context.Background(), pod, ctr); err != nil {
				t.Fatal(err)
			}
			if len(events) != 0 {
				t.Errorf("events %+v, want none (MPS bounds its clients)", events)
			}
			if !driver {
				return
			}
			cgroup := cg.Root + "/kubepods/a/" + ctr.Id
			want := []testutil.Limit{
				{UUID: uuid, Cgroup: cgroup, Soft: 8 << 30, Hard: 8 << 30},
				{UUID: uuid, Cgroup: cgroup, Soft: 0, Hard: math.MaxUint64},
			}
			if got := limits.Calls(); !slices.Equal(got, want) {
				t.Errorf("the driver was asked\n%v\nwant\n%v", got, want)
			}
		})
	}
}
