package plugin_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	nvidianri "github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-ctk-installer/container/runtime/nri"
	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/deviceplugin"
	"github.com/nri-gpu/nri-gpu/pkg/plugin"
)

// TestCountRequestsFollowTopology: on a 4-GPU PCIe node across two
// sockets (even GPUs on one, odd on the other, as NVML reports it), a
// count request for 2 gets a same-socket pair, where spec order alone
// would give a pair across the sockets.
func TestCountRequestsFollowTopology(t *testing.T) {
	specDir := gpuSpecDir(t, 4)
	s := testutil.NVML(4)
	for i, d := range s.Devices {
		dev := d.(*dgxa100.Device)
		dev.GetTopologyCommonAncestorFunc = func(o nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) {
			j := slices.Index(s.Devices, o)
			if i%2 == j%2 {
				return nvml.TOPOLOGY_NODE, nvml.SUCCESS
			}
			return nvml.TOPOLOGY_SYSTEM, nvml.SUCCESS
		}
	}
	p := nvmlPlugin(t, "", specDir, s)
	count := func(name, n string) string {
		t.Helper()
		pod := &api.PodSandbox{Id: "id-" + name, Name: name, Namespace: "tenant", Annotations: map[string]string{"gpu-count.nri-gpu.io": n}}
		adj, _, err := p.CreateContainer(context.Background(), pod, &api.Container{Id: name + "-c", PodSandboxId: pod.Id, Name: "c", Linux: &api.LinuxContainer{}})
		if err != nil {
			t.Fatal(err)
		}
		return adj.GetAnnotations()[plugin.CountedAnnotation]
	}
	if got := count("a", "1"); got != "nvidia.com/gpu=0" {
		t.Errorf("a request for 1 got %s, want the first free, GPU 0", got)
	}
	if got := count("b", "2"); got != "nvidia.com/gpu=1,nvidia.com/gpu=3" {
		t.Errorf("a request for 2 got %s, want the same-socket pair 1 and 3", got)
	}
}

// gpuSpecDir writes the spec of n GPUs whose nodes are NVIDIA's numbers
// (195:i) on plain files, and returns its directory.
func gpuSpecDir(t *testing.T, n int) string {
	t.Helper()
	return namedGPUSpecDir(t, n, func(i int) []string { return []string{fmt.Sprint(i)} })
}

// namedGPUSpecDir is gpuSpecDir with GPU i a device of each of names(i).
func namedGPUSpecDir(t *testing.T, n int, names func(i int) []string) string {
	t.Helper()
	dir := t.TempDir()
	var spec strings.Builder
	spec.WriteString("cdiVersion: \"0.6.0\"\nkind: nvidia.com/gpu\ndevices:\n")
	for i := 0; i < n; i++ {
		node := filepath.Join(dir, fmt.Sprintf("nvidia%d", i))
		if err := os.WriteFile(node, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		for _, name := range names(i) {
			fmt.Fprintf(&spec, "  - name: %q\n    containerEdits:\n      deviceNodes: [{path: /dev/nvidia%d, hostPath: %q, type: c, major: 195, minor: %d}]\n", name, i, node, i)
		}
	}
	specDir := filepath.Join(dir, "cdi")
	if err := os.MkdirAll(specDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(specDir, "gpu.yaml"), []byte(spec.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return specDir
}

// TestUnhealthyGPUs: a GPU that reports a critical Xid error is never
// chosen for a count request, is refused by name, and is reported
// Unhealthy to kubelet.
func TestUnhealthyGPUs(t *testing.T) {
	specDir := gpuSpecDir(t, 2)
	s := testutil.NVML(2)
	events := testutil.NVMLEvents(s)
	p := nvmlPlugin(t, "healthInterval: 50ms\n", specDir, s)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Serving starts the health watch (no runtime here: it keeps trying
	// to connect, which does not matter).
	go func() {
		_ = p.Serve(ctx, stub.WithSocketPath(filepath.Join(testutil.ShortDir(t), "no-runtime.sock")), stub.WithPluginName("nri-gpu"), stub.WithPluginIdx("10"))
	}()

	res := p.Resource(config.Resource{Name: "nvidia.com/gpu", Kind: "nvidia.com/gpu", Devices: []string{"*"}})
	events <- nvml.EventData{Device: s.Devices[0], EventType: nvml.EventTypeXidCriticalError, EventData: 79}
	testutil.Within(t, 5*time.Second, "GPU 0 reported unhealthy", func() bool {
		return deviceplugin.Describe(res.Devices()) == "0 unhealthy, 1 healthy"
	})
	create := func(name string, ann map[string]string) (*api.ContainerAdjustment, error) {
		pod := &api.PodSandbox{Id: "id-" + name, Name: name, Namespace: "tenant", Annotations: ann}
		adj, _, err := p.CreateContainer(context.Background(), pod, &api.Container{Id: name + "-c", PodSandboxId: pod.Id, Name: "c", Linux: &api.LinuxContainer{}})
		return adj, err
	}
	adj, err := create("counted", map[string]string{"gpu-count.nri-gpu.io": "1"})
	if err != nil || adj.GetAnnotations()[plugin.CountedAnnotation] != "nvidia.com/gpu=1" {
		t.Errorf("a count request got %v (%v), want GPU 1, passing over the unhealthy 0", adj.GetAnnotations(), err)
	}
	_, err = create("named", map[string]string{"gpus.nri-gpu.io": "0"})
	testutil.ErrorSays(t, err, "critical Xid error 79", "policy.allowUnhealthy")
}

// TestExplainSeesLostGPUs: a plugin that does not serve (nri-gpu
// explain) looks at the GPUs once: a lost one is passed over, and said so.
func TestExplainSeesLostGPUs(t *testing.T) {
	specDir := gpuSpecDir(t, 2)
	s := testutil.NVML(2)
	s.Devices[0].(*dgxa100.Device).GetUUIDFunc = func() (string, nvml.Return) { return "", nvml.ERROR_GPU_IS_LOST }
	p := nvmlPlugin(t, "", specDir, s)
	p.CheckHealth()
	pod := &api.PodSandbox{Id: "id", Name: "p", Namespace: "tenant", Annotations: map[string]string{"gpu-count.nri-gpu.io": "1"}}
	_, g, err := p.Create(context.Background(), pod, &api.Container{Id: "c", PodSandboxId: "id", Name: "c", Linux: &api.LinuxContainer{}})
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Counted) != 1 || g.Counted[0].Name != "nvidia.com/gpu=1" {
		t.Errorf("chose %v, want GPU 1", g.Counted)
	}
	if len(g.Considered.Passed) != 1 || g.Considered.Passed[0].Device != "nvidia.com/gpu=0" || !strings.Contains(g.Considered.Passed[0].Reason, "lost") {
		t.Errorf("passed over %+v, want GPU 0 as lost", g.Considered.Passed)
	}
}

// TestNVIDIAAnnotationsOverNRI: with NVIDIA's key configured, a pod
// annotated for NVIDIA's NRI plugin gets its device through nri-gpu, under
// nri-gpu's policy; without it, the annotation is ignored.
func TestNVIDIAAnnotationsOverNRI(t *testing.T) {
	r := runtime(t, "annotationKeys: [gpus.nri-gpu.io, nvidia.cdi.k8s.io]\npolicy: {namespaces: [tenant-*], exclusive: true}")
	ann := map[string]string{"nvidia.cdi.k8s.io/container.c": "nvidia.com/gpu=1", "gpus.nri-gpu.io": "1"}
	pod := &api.PodSandbox{Id: "id-a", Name: "a", Namespace: "tenant-a", Annotations: ann}
	adj, err := r.create(pod, &api.Container{Id: "a-c", PodSandboxId: pod.Id, Name: "c", Linux: &api.LinuxContainer{}})
	if err != nil {
		t.Fatal(err)
	}
	if got := devicePaths(adj); !slices.Equal(got, []string{"/dev/nvidia1"}) {
		t.Errorf("asked through both keys for GPU 1, got %v: want it once", got)
	}
	other := &api.PodSandbox{Id: "id-b", Name: "b", Namespace: "default", Annotations: map[string]string{"nvidia.cdi.k8s.io": "nvidia.com/gpu=0"}}
	_, err = r.create(other, &api.Container{Id: "b-c", PodSandboxId: other.Id, Name: "c", Linux: &api.LinuxContainer{}})
	testutil.ErrorSays(t, err, `pod annotation "nvidia.cdi.k8s.io"`, `pods of namespace "default" may not request devices`)

	plain := runtime(t, "policy: {namespaces: [tenant-*]}")
	adj, err = plain.create(&api.PodSandbox{Id: "id-c", Name: "c", Namespace: "tenant-c", Annotations: map[string]string{"nvidia.cdi.k8s.io": "nvidia.com/gpu=0"}},
		&api.Container{Id: "c-c", PodSandboxId: "id-c", Name: "c", Linux: &api.LinuxContainer{}})
	if err != nil || len(devicePaths(adj)) > 0 {
		t.Errorf("NVIDIA's key without annotationKeys listing it: devices %v, %v; want none", devicePaths(adj), err)
	}
}

// TestReload: a new configuration applies to the next request; what pods
// hold is kept, and a holding the new policy would not give is logged.
func TestReload(t *testing.T) {
	specDir := gpuSpecDir(t, 2)
	cfg, err := config.Parse([]byte("policy: {exclusive: true}"))
	if err != nil {
		t.Fatal(err)
	}
	log, hook := logtest.NewNullLogger()
	p, err := plugin.New(cfg, log, plugin.WithSpecDirs([]string{specDir}))
	if err != nil {
		t.Fatal(err)
	}
	synchronized(t, p)
	t.Cleanup(p.Close)
	create := func(name, ns, gpus string) error {
		pod := &api.PodSandbox{Id: "id-" + name, Name: name, Namespace: ns, Annotations: map[string]string{"gpus.nri-gpu.io": gpus}}
		_, _, err := p.CreateContainer(context.Background(), pod, &api.Container{Id: name + "-c", PodSandboxId: pod.Id, Name: "c", Linux: &api.LinuxContainer{}})
		return err
	}
	if err := create("a", "tenant", "0"); err != nil {
		t.Fatal(err)
	}
	reload := func(yaml string) {
		t.Helper()
		next, err := config.Parse([]byte(yaml))
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Reload(next); err != nil {
			t.Fatal(err)
		}
	}
	reload("policy: {exclusive: true, namespaces: [tenant]}")
	testutil.ErrorSays(t, create("c", "other", "1"), `pods of namespace "other" may not request devices`)
	testutil.ErrorSays(t, create("e", "tenant", "0"), "is held by pod tenant/a")
	if err := create("d", "tenant", "1"); err != nil {
		t.Errorf("GPU 1 under the new configuration: %v", err)
	}
	for _, e := range hook.AllEntries() {
		if e.Level == logrus.WarnLevel {
			t.Errorf("warned %q though the new policy still gives pod a its GPU", e.Message)
		}
	}

	reload("policy: {exclusive: true, namespaces: [tenant], devices: ['nvidia.com/gpu=1']}")
	warned := false
	for _, e := range hook.AllEntries() {
		warned = warned || (e.Level == logrus.WarnLevel && strings.Contains(e.Message, "would not give") && strings.Contains(e.Message, "pod tenant/a"))
	}
	if !warned {
		t.Error("no warning that pod tenant/a holds a GPU the new policy would not give")
	}
}

// nvmlPlugin returns a plugin of cfgYAML reading the specs in specDir,
// with s as its NVML, closed when the test ends.
func nvmlPlugin(t *testing.T, cfgYAML, specDir string, s nvml.Interface) *plugin.Plugin {
	t.Helper()
	cfg, err := config.Parse([]byte(cfgYAML))
	if err != nil {
		t.Fatal(err)
	}
	p, err := plugin.New(cfg, quiet(), plugin.WithSpecDirs([]string{specDir}), plugin.WithNVML(s))
	if err != nil {
		t.Fatal(err)
	}
	synchronized(t, p)
	t.Cleanup(p.Close)
	return p
}

// TestPreferredFollowsTopology: kubelet's preferred allocation is the
// device plugin's closest set, with the devices it must include.
func TestPreferredFollowsTopology(t *testing.T) {
	s := testutil.NVML(4)
	for i, d := range s.Devices {
		d.(*dgxa100.Device).GetTopologyCommonAncestorFunc = func(o nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) {
			if i%2 == slices.Index(s.Devices, o)%2 {
				return nvml.TOPOLOGY_NODE, nvml.SUCCESS
			}
			return nvml.TOPOLOGY_SYSTEM, nvml.SUCCESS
		}
	}
	p := nvmlPlugin(t, "", gpuSpecDir(t, 4), s)
	res := p.Resource(config.Resource{Name: "nvidia.com/gpu", Kind: "nvidia.com/gpu", Devices: []string{"*"}})
	for _, tc := range []struct {
		available, must []string
		size            int
		want            []string
	}{
		{[]string{"0", "1", "2", "3"}, nil, 2, []string{"0", "2"}},
		{[]string{"1", "2", "3"}, []string{"1"}, 2, []string{"1", "3"}},
		{[]string{"0", "1", "2", "3"}, []string{"3"}, 1, []string{"3"}},
		{[]string{"1", "2"}, nil, 1, []string{"1"}},
	} {
		if got := res.Preferred(tc.available, tc.must, tc.size); !slices.Equal(got, tc.want) {
			t.Errorf("Preferred(%v, must %v, %d) = %v, want %v", tc.available, tc.must, tc.size, got, tc.want)
		}
	}
}

// TestBesideNVIDIAsPluginOverNRI runs NVIDIA's own NRI plugin (the NVIDIA
// Container Toolkit's, which asks the runtime to inject with AddCDIDevice)
// beside nri-gpu on NRI's real runtime side: a container would get a
// device twice is refused at validation, naming the device and the other
// plugin; one that each plugin gives different devices, or only one of
// them serves, is created.
func TestBesideNVIDIAsPluginOverNRI(t *testing.T) {
	cases := []struct {
		name   string
		config string
		ann    map[string]string
		// want are the device nodes nri-gpu injects and cdi the CDI
		// devices NVIDIA's plugin asks for, when created; refused is what
		// the error says otherwise.
		want, cdi []string
		refused   []string
		// runtimeCDI are CDI devices of the CRI request, which the
		// runtime injects itself (containerd 2.x with its CDI on).
		runtimeCDI []string
	}{
		{"both serve NVIDIA's key", "annotationKeys: [gpus.nri-gpu.io, nvidia.cdi.k8s.io]",
			map[string]string{"nvidia.cdi.k8s.io": "nvidia.com/gpu=1"}, nil, nil,
			[]string{"would be injected twice", "nvidia.com/gpu=1, which nri-gpu injects as nvidia.com/gpu=1 and plugin " + nvidiaPlugin + " asks the runtime to inject"}, nil},
		{"the same GPU through both keys", "",
			map[string]string{"nvidia.cdi.k8s.io": "nvidia.com/gpu=1", "gpus.nri-gpu.io": "1"}, nil, nil,
			[]string{"would be injected twice", "nvidia.com/gpu=1, which nri-gpu injects"}, nil},
		{"all against one GPU", "",
			map[string]string{"nvidia.cdi.k8s.io": "nvidia.com/gpu=all", "gpus.nri-gpu.io": "0"}, nil, nil,
			[]string{"nvidia.com/gpu=all, which nri-gpu injects as nvidia.com/gpu=0"}, nil},
		{"NVIDIA's key left to NVIDIA's plugin", "",
			map[string]string{"nvidia.cdi.k8s.io": "nvidia.com/gpu=1"}, nil, []string{"nvidia.com/gpu=1"}, nil, nil},
		{"different GPUs", "",
			map[string]string{"nvidia.cdi.k8s.io": "nvidia.com/gpu=1", "gpus.nri-gpu.io": "0"}, []string{"/dev/nvidia0"}, []string{"nvidia.com/gpu=1"}, nil, nil},
		{"nri-gpu's key only", "annotationKeys: [gpus.nri-gpu.io, nvidia.cdi.k8s.io]",
			map[string]string{"gpus.nri-gpu.io": "0"}, []string{"/dev/nvidia0"}, nil, nil, nil},
		{"one of several GPUs NVIDIA's plugin asks for", "",
			map[string]string{"nvidia.cdi.k8s.io": "nvidia.com/gpu=0,nvidia.com/gpu=1", "gpus.nri-gpu.io": "1"}, nil, nil,
			[]string{"nvidia.com/gpu=1, which nri-gpu injects as nvidia.com/gpu=1"}, nil},
		{"the runtime injects it, not nri-gpu", "",
			map[string]string{"nvidia.cdi.k8s.io": "nvidia.com/gpu=1"}, nil, []string{"nvidia.com/gpu=1"}, nil, []string{"nvidia.com/gpu=1"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := runtimeOf(t, "v2.3.7", tc.config)
			startNVIDIAPlugin(t, r)
			pod := &api.PodSandbox{Id: "id-a", Name: "a", Namespace: "tenant-a", Annotations: tc.ann}
			ctr := &api.Container{Id: "a-c", PodSandboxId: pod.Id, Name: "c", Linux: &api.LinuxContainer{}}
			for _, name := range tc.runtimeCDI {
				ctr.CDIDevices = append(ctr.CDIDevices, &api.CDIDevice{Name: name})
			}
			adj, err := r.create(pod, ctr)
			if tc.refused != nil {
				testutil.ErrorSays(t, err, tc.refused...)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var cdi []string
			for _, d := range adj.GetCDIDevices() {
				cdi = append(cdi, d.GetName())
			}
			if got := devicePaths(adj); !slices.Equal(got, tc.want) || !slices.Equal(cdi, tc.cdi) {
				t.Errorf("nri-gpu injected %v and NVIDIA's plugin asked for %v; want %v and %v", got, cdi, tc.want, tc.cdi)
			}
		})
	}
}

// nvidiaPlugin is how NRI names NVIDIA's plugin in these tests.
var nvidiaPlugin = fmt.Sprintf("%q", "20-"+filepath.Base(os.Args[0]))

// startNVIDIAPlugin connects NVIDIA's own NRI plugin to r with index 20
// and waits until the runtime has it. It names itself after the program,
// as it does in NVIDIA's installer: nvidiaPlugin.
func startNVIDIAPlugin(t *testing.T, r *testRuntime) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	log := logrus.New()
	log.SetOutput(io.Discard)
	nv := nvidianri.NewPlugin(ctx, log, nil)
	t.Cleanup(func() { cancel(); nv.Stop() })
	if err := nv.Start(ctx, r.socket, "20"); err != nil {
		t.Fatal(err)
	}
	for n := 0; n < 2; {
		select {
		case c := <-r.counts.ch:
			n = c.n
		case <-time.After(10 * time.Second):
			t.Fatal("NVIDIA's plugin did not register with the runtime")
		}
	}
}
