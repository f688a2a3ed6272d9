package plugin_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	"github.com/google/go-cmp/cmp"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
	"github.com/nri-gpu/nri-gpu/pkg/plugin"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// /dev/null and /dev/zero stand in for GPU nodes, so no root is needed.
const spec = `
cdiVersion: "0.6.0"
kind: nvidia.com/gpu
containerEdits:
  env: ["NVIDIA_VISIBLE_DEVICES=void"]
devices:
  - name: "0"
    containerEdits:
      deviceNodes: [{path: /dev/nvidia0, hostPath: /dev/null}]
  - name: "1"
    containerEdits:
      deviceNodes: [{path: /dev/nvidia1, hostPath: /dev/zero}]
  - name: all
    containerEdits:
      deviceNodes:
        - {path: /dev/nvidia0, hostPath: /dev/null}
        - {path: /dev/nvidia1, hostPath: /dev/zero}
`

// pluginCount signals each change of the runtime's plugin count, with
// the number of plugins synchronized when it was reported.
type pluginCount struct {
	adaptation.Metrics
	ch    chan count
	syncs *atomic.Int64
}

// count is one report of the runtime's plugin count: n plugins, reported
// after syncs plugins were synchronized.
type count struct {
	n     int
	syncs int64
}

func (m pluginCount) UpdatePluginCount(n int) {
	select {
	case m.ch <- count{n: n, syncs: m.syncs.Load()}:
	default: // nobody waits any more
	}
}

// testRuntime is NRI's real runtime side on a socket in a temp dir, with
// the pods and containers a runtime would report to a (re)connecting
// plugin in Synchronize.
type testRuntime struct {
	*adaptation.Adaptation
	socket, specDir string
	counts          pluginCount
	// stopPlugin stops the plugin connected last.
	stopPlugin func()

	// stateFile is the plugin's state file; none when empty.
	stateFile string
	// accessDir is the plugin's --access-dir; none when empty.
	accessDir string
	// setup, when set, is called with each plugin before it serves.
	options func() []plugin.Option
	// plugin is the plugin connected last.
	plugin *plugin.Plugin

	mu         sync.Mutex
	pods       map[string]*api.PodSandbox
	containers []*api.Container
}

// runtime starts the runtime side as containerd 1.7.35 and connects
// nri-gpu with cfgYAML.
func runtime(t *testing.T, cfgYAML string) *testRuntime {
	t.Helper()
	return runtimeOf(t, "v1.7.35", cfgYAML)
}

// runtimeOf starts the runtime side as the given containerd version (NRI's
// stub infers the runtime's NRI version from it) and connects nri-gpu
// with cfgYAML.
func runtimeOf(t *testing.T, containerdVersion, cfgYAML string) *testRuntime {
	t.Helper()
	return runtimeSetUp(t, containerdVersion, cfgYAML, nil)
}

// runtimeSetUp is runtimeOf, with each plugin built with the options
// that options returns then, beside the test runtime's own.
func runtimeSetUp(t *testing.T, containerdVersion, cfgYAML string, options func() []plugin.Option) *testRuntime {
	t.Helper()
	return runtimeWith(t, containerdVersion, cfgYAML, func(r *testRuntime) { r.options = options })
}

// runtimeWith is runtimeOf, with tune called with the runtime before
// nri-gpu connects.
func runtimeWith(t *testing.T, containerdVersion, cfgYAML string, tune func(*testRuntime)) *testRuntime {
	t.Helper()
	dir := testutil.ShortDir(t)
	r := &testRuntime{
		socket:    filepath.Join(dir, "nri.sock"),
		specDir:   filepath.Join(dir, "cdi"),
		stateFile: filepath.Join(dir, "state", "allocations.json"),
		counts:    pluginCount{Metrics: noMetrics{}, ch: make(chan count, 4), syncs: new(atomic.Int64)},
		pods:      map[string]*api.PodSandbox{},
	}
	if err := os.MkdirAll(r.specDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(r.specDir, "gpu.yaml"), []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	syncFn := func(ctx context.Context, cb adaptation.SyncCB) error {
		r.mu.Lock()
		var pods []*api.PodSandbox
		for _, p := range r.pods {
			pods = append(pods, p)
		}
		containers := slices.Clone(r.containers)
		r.mu.Unlock()
		_, err := cb(ctx, pods, containers)
		if err == nil {
			r.counts.syncs.Add(1)
		}
		return err
	}
	update := func(context.Context, []*adaptation.ContainerUpdate) ([]*adaptation.ContainerUpdate, error) {
		return nil, nil
	}
	var err error
	r.Adaptation, err = adaptation.New("containerd", containerdVersion, syncFn, update,
		adaptation.WithSocketPath(r.socket),
		adaptation.WithPluginPath(filepath.Join(dir, "plugins")),
		adaptation.WithPluginConfigPath(filepath.Join(dir, "conf.d")),
		adaptation.WithMetrics(r.counts))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	tune(r)
	r.stopPlugin = r.connect(t, cfgYAML)
	return r
}

// restart stops the plugin and connects a new one, with no memory of the
// old one's state.
func (r *testRuntime) restart(t *testing.T, cfgYAML string) {
	t.Helper()
	r.stopPlugin()
	r.stopPlugin = r.connect(t, cfgYAML)
}

// connect starts a new nri-gpu, with no memory of earlier ones, and waits
// until the runtime has synchronized it. It returns a function that stops it.
func (r *testRuntime) connect(t *testing.T, cfgYAML string) (stop func()) {
	t.Helper()
	return r.serve(t, r.build(t, cfgYAML))
}

// build builds a new nri-gpu of the runtime's options, not yet connected.
func (r *testRuntime) build(t *testing.T, cfgYAML string, more ...plugin.Option) *plugin.Plugin {
	t.Helper()
	log := logrus.New()
	log.SetOutput(io.Discard)
	return r.buildLogged(t, cfgYAML, log, more...)
}

// buildLogged builds a new nri-gpu of the runtime's options logging to
// log, not yet connected.
func (r *testRuntime) buildLogged(t *testing.T, cfgYAML string, log logrus.FieldLogger, more ...plugin.Option) *plugin.Plugin {
	t.Helper()
	cfg, err := config.Parse([]byte(cfgYAML))
	if err != nil {
		t.Fatal(err)
	}
	opts := []plugin.Option{plugin.WithSpecDirs([]string{r.specDir})}
	if r.stateFile != "" {
		opts = append(opts, plugin.WithStateFile(r.stateFile))
	}
	if r.accessDir != "" {
		opts = append(opts, plugin.WithAccessDir(r.accessDir))
	}
	if r.options != nil {
		opts = append(opts, r.options()...)
	}
	p, err := plugin.New(cfg, log, append(opts, more...)...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// serve connects p to the runtime and waits until the runtime has
// synchronized it. It returns a function that stops it.
func (r *testRuntime) serve(t *testing.T, p *plugin.Plugin) (stop func()) {
	t.Helper()
	// NRI registers plugins one at a time, and reports the count of the
	// one before this plugin as late as it likes: only a count reported
	// after this plugin was synchronized says the runtime has it.
	synced := r.counts.syncs.Load()
	r.plugin = p
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = p.Serve(ctx, stub.WithSocketPath(r.socket), stub.WithPluginName("nri-gpu"), stub.WithPluginIdx("10"))
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); wg.Wait(); p.Close() }) }
	t.Cleanup(stop)

	for registered := false; !registered; {
		select {
		case c := <-r.counts.ch:
			registered = c.n > 0 && c.syncs > synced
		case <-time.After(10 * time.Second):
			t.Fatal("nri-gpu did not register with the runtime")
		}
	}
	return stop
}

// create asks the plugins to adjust a new container and, on success,
// records it with the annotations and devices they adjusted, as a runtime
// would.
func (r *testRuntime) create(pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, error) {
	rpl, err := r.CreateContainer(context.Background(), &adaptation.CreateContainerRequest{Pod: pod, Container: ctr})
	if err != nil {
		return nil, err
	}
	c := proto.Clone(ctr).(*api.Container)
	if c.Annotations == nil {
		c.Annotations = map[string]string{}
	}
	for k, v := range rpl.GetAdjust().GetAnnotations() {
		if key, removed := strings.CutPrefix(k, "-"); removed {
			delete(c.Annotations, key)
		} else {
			c.Annotations[k] = v
		}
	}
	if devs := rpl.GetAdjust().GetLinux().GetDevices(); len(devs) > 0 {
		if c.Linux == nil {
			c.Linux = &api.LinuxContainer{}
		}
		c.Linux.Devices = append(c.Linux.Devices, devs...)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pods[pod.Id] = pod
	r.containers = append(r.containers, c)
	return rpl.GetAdjust(), nil
}

// removePod tells the plugins a pod is gone, as a runtime would.
func (r *testRuntime) removePod(t *testing.T, pod *api.PodSandbox) {
	t.Helper()
	if err := r.StopPodSandbox(context.Background(), &adaptation.StopPodSandboxRequest{Pod: pod}); err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.pods, pod.Id)
	r.containers = slices.DeleteFunc(r.containers, func(c *api.Container) bool { return c.PodSandboxId == pod.Id })
}

type noMetrics struct{}

func (noMetrics) RecordPluginInvocation(string, string, error)                                      {}
func (noMetrics) RecordPluginLatency(string, string, time.Duration)                                 {}
func (noMetrics) RecordPluginAdjustments(string, string, *adaptation.ContainerAdjustment, int, int) {}
func (noMetrics) UpdatePluginCount(int)                                                             {}

func createRequest(podAnn, ctrAnn map[string]string) *adaptation.CreateContainerRequest {
	return &adaptation.CreateContainerRequest{
		Pod: &api.PodSandbox{Id: "pod-id", Name: "agent-1", Namespace: "tenant-a", Annotations: podAnn},
		Container: &api.Container{
			Id: "ctr-id", PodSandboxId: "pod-id", Name: "main", Annotations: ctrAnn,
			Linux: &api.LinuxContainer{},
		},
	}
}

func devicePaths(adj *api.ContainerAdjustment) []string {
	var paths []string
	for _, d := range adj.GetLinux().GetDevices() {
		paths = append(paths, d.Path)
	}
	return paths
}

// adjustment is what nri-gpu returns for GPUs of the test spec: the
// spec's env (unless the runtime's own CDI injection brought it), the
// GPUs' nodes as on the host (/dev/null and /dev/zero), CDI's cgroup rules
// for them, and the record of the devices given, those the runtime
// injected included.
func adjustment(specEnv bool, given []int, gpus ...int) *api.ContainerAdjustment {
	adj := &api.ContainerAdjustment{}
	if specEnv {
		adj.AddEnv("NVIDIA_VISIBLE_DEVICES", "void")
	}
	mode := os.FileMode(0o666)
	var rules []*api.LinuxDeviceCgroup
	for _, g := range gpus {
		minor := []int64{3, 5}[g] // /dev/null, /dev/zero
		adj.AddDevice(&api.LinuxDevice{
			Path: fmt.Sprintf("/dev/nvidia%d", g), Type: "c", Major: 1, Minor: minor,
			FileMode: api.FileMode(&mode),
		})
		rules = append(rules, &api.LinuxDeviceCgroup{Allow: true, Type: "c", Major: api.Int64(int64(1)), Minor: api.Int64(minor), Access: "rwm"})
	}
	if len(rules) > 0 {
		adj.Linux.Resources = &api.LinuxResources{Devices: rules}
	}
	var names []string
	for _, g := range given {
		names = append(names, fmt.Sprintf("nvidia.com/gpu=%d", g))
	}
	adj.AddAnnotation(plugin.DevicesAnnotation, strings.Join(names, ","))
	return adj
}

// withoutScaffolding drops the empty messages that NRI's runtime side
// puts in every adjustment it returns (hooks, RDT, CPU and memory
// resources), which are no part of what a plugin asked for.
func withoutScaffolding(adj *api.ContainerAdjustment) *api.ContainerAdjustment {
	if proto.Size(adj.Hooks) == 0 {
		adj.Hooks = nil
	}
	if l := adj.Linux; l != nil {
		if proto.Size(l.Rdt) == 0 {
			l.Rdt = nil
		}
		if r := l.Resources; r != nil {
			if proto.Size(r.Cpu) == 0 {
				r.Cpu = nil
			}
			if proto.Size(r.Memory) == 0 {
				r.Memory = nil
			}
			if proto.Size(r) == 0 {
				l.Resources = nil
			}
		}
		if proto.Size(l) == 0 {
			adj.Linux = nil
		}
	}
	return adj
}

func TestCreateContainerOverNRI(t *testing.T) {
	tests := []struct {
		name       string
		config     string
		podAnn     map[string]string
		ctrAnn     map[string]string
		ctrDevices []string // already in the container, as a runtime's own CDI injection leaves them
		cdiDevices []string // the CDI devices the runtime reports injecting
		want       *api.ContainerAdjustment
		wantErr    []string
	}{
		{
			name:   "pod annotation",
			podAnn: map[string]string{"gpus.nri-gpu.io": "0"},
			want:   adjustment(true, []int{0}, 0),
		},
		{
			name:   "container-scoped pod annotation wins",
			podAnn: map[string]string{"gpus.nri-gpu.io": "0", "gpus.nri-gpu.io/container.main": "1"},
			want:   adjustment(true, []int{1}, 1),
		},
		{
			name:   "pod and cdi.k8s.io requests merged",
			podAnn: map[string]string{"gpus.nri-gpu.io": "0"},
			ctrAnn: map[string]string{"cdi.k8s.io/dp": "nvidia.com/gpu=1,nvidia.com/gpu=0"},
			want:   adjustment(true, []int{0, 1}, 0, 1),
		},
		{
			name:   "cdi.k8s.io ignored when honorCDIAnnotations is false",
			config: "honorCDIAnnotations: false",
			ctrAnn: map[string]string{"cdi.k8s.io/dp": "nvidia.com/gpu=1"},
		},
		{
			name:       "a device the runtime already injected is not injected again, nor its spec's edits",
			ctrAnn:     map[string]string{"cdi.k8s.io/dp": "nvidia.com/gpu=1"},
			ctrDevices: []string{"/dev/nvidia1"},
			want:       adjustment(false, []int{1}),
		},
		{
			name:       "a pod request beside one the runtime injected gets only its own device",
			podAnn:     map[string]string{"gpus.nri-gpu.io": "0"},
			ctrAnn:     map[string]string{"cdi.k8s.io/dp": "nvidia.com/gpu=1"},
			ctrDevices: []string{"/dev/nvidia1"},
			want:       adjustment(false, []int{0, 1}, 0),
		},
		{
			name:       "a device the runtime reports injecting (the CRI request's CDI devices) is held, not injected",
			podAnn:     map[string]string{"gpus.nri-gpu.io": "0"},
			cdiDevices: []string{"nvidia.com/gpu=1"},
			want:       adjustment(false, []int{0, 1}, 0),
		},
		{
			name:       "a cdi.k8s.io device the runtime reports injecting is not injected again, whatever the container holds",
			ctrAnn:     map[string]string{"cdi.k8s.io/dp": "nvidia.com/gpu=1"},
			cdiDevices: []string{"nvidia.com/gpu=1"},
			want:       adjustment(false, []int{1}),
		},
		{
			name:   "no request, no adjustment",
			podAnn: map[string]string{"other": "0"},
		},
		{
			name:   "all with allowAll",
			config: "policy: {allowAll: true}",
			podAnn: map[string]string{"gpus.nri-gpu.io": "all"},
			want: func() *api.ContainerAdjustment {
				adj := adjustment(true, nil, 0, 1)
				adj.Annotations[plugin.DevicesAnnotation] = "nvidia.com/gpu=all"
				return adj
			}(),
		},
		{
			name:    "all without allowAll",
			podAnn:  map[string]string{"gpus.nri-gpu.io": "all"},
			wantErr: []string{`container "main" of pod tenant-a/agent-1`, "denied by policy", "policy.allowAll"},
		},
		{
			name:    "unknown device",
			podAnn:  map[string]string{"gpus.nri-gpu.io/pod": "0,5"},
			wantErr: []string{`pod annotation "gpus.nri-gpu.io/pod" request "5" (nvidia.com/gpu=5)`, "unresolvable"},
		},
		{
			name:    "bad cdi.k8s.io value",
			ctrAnn:  map[string]string{"cdi.k8s.io/dp": "gpu0"},
			wantErr: []string{`container annotation "cdi.k8s.io/dp"`, `invalid CDI device name "gpu0"`},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := runtime(t, tc.config)
			req := createRequest(tc.podAnn, tc.ctrAnn)
			for _, d := range tc.ctrDevices {
				req.Container.Linux.Devices = append(req.Container.Linux.Devices, &api.LinuxDevice{Path: d, Type: "c"})
			}
			for _, d := range tc.cdiDevices {
				req.Container.CDIDevices = append(req.Container.CDIDevices, &api.CDIDevice{Name: d})
			}
			adj, err := r.create(req.Pod, req.Container)
			if len(tc.wantErr) > 0 {
				testutil.ErrorSays(t, err, tc.wantErr...)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := tc.want
			if want == nil {
				want = &api.ContainerAdjustment{} // what NRI's runtime side makes of no adjustment
			}
			if diff := cmp.Diff(want, withoutScaffolding(adj), protocmp.Transform()); diff != "" {
				t.Errorf("adjustment (-want +got):\n%s", diff)
			}
		})
	}
}

// TestConfigureFromRuntime has the runtime hand the plugin a configuration
// (as containerd does for a pre-registered plugin): it is applied to the
// requests that follow, and one that is rejected leaves it in force.
func TestConfigureFromRuntime(t *testing.T) {
	dir := t.TempDir()
	const fpga = "cdiVersion: \"0.6.0\"\nkind: example.com/fpga\ndevices: [{name: \"0\", containerEdits: {env: [FPGA=0]}}]\n"
	if err := os.WriteFile(filepath.Join(dir, "fpga.yaml"), []byte(fpga), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := plugin.New(config.Default(), quiet(), plugin.WithSpecDirs([]string{dir}))
	if err != nil {
		t.Fatal(err)
	}
	synchronized(t, p)
	defer p.Close()
	req := createRequest(map[string]string{"gpus.nri-gpu.io": "0"}, nil)
	create := func() (*api.ContainerAdjustment, error) {
		adj, _, err := p.CreateContainer(context.Background(), req.Pod, req.Container)
		return adj, err
	}
	if _, err := create(); err == nil || !strings.Contains(err.Error(), "nvidia.com/gpu=0") {
		t.Fatalf("before Configure, short names are not nvidia.com/gpu ones: %v", err)
	}

	cfg := "defaultKind: example.com/fpga\npolicy: {devices: [\"example.com/fpga=*\"]}\n"
	if _, err := p.Configure(context.Background(), cfg, "containerd", "1.7.35"); err != nil {
		t.Fatal(err)
	}
	adj, err := create()
	if err != nil {
		t.Fatalf("the runtime's configuration was not applied: %v", err)
	}
	if got := adj.GetAnnotations()[plugin.DevicesAnnotation]; got != "example.com/fpga=0" {
		t.Errorf("devices %q, want example.com/fpga=0", got)
	}

	_, err = p.Configure(context.Background(), "bogus: 1\n", "containerd", "1.7.35")
	testutil.ErrorSays(t, err, "configuration from runtime", "bogus")
	if _, err := create(); err != nil {
		t.Errorf("a rejected configuration replaced the one in force: %v", err)
	}

	// A change of the start block is refused as a reload's is, naming
	// the key, and the configuration in force stays.
	_, err = p.Configure(context.Background(), "version: v1\nstart: {mps: {checkInterval: 1s}}\n"+cfg, "containerd", "1.7.35")
	testutil.ErrorSays(t, err, "configuration from runtime", "start.mps is read at start")
	if !errors.Is(err, plugin.ErrStartOnly) {
		t.Errorf("error %v does not wrap ErrStartOnly", err)
	}
	if _, err := create(); err != nil {
		t.Errorf("a configuration changing the start block replaced the one in force: %v", err)
	}
}

func TestAllocationsSurviveRestart(t *testing.T) {
	const cfg = "policy: {exclusive: true}"
	r := runtime(t, cfg)
	newPod := func(name string, ann map[string]string) *api.PodSandbox {
		return &api.PodSandbox{Id: "id-" + name, Name: name, Namespace: "tenant", Annotations: ann}
	}
	ctr := func(pod *api.PodSandbox, name string) *api.Container {
		return &api.Container{Id: pod.Id + "-" + name, PodSandboxId: pod.Id, Name: name, Linux: &api.LinuxContainer{}}
	}
	a := newPod("a", map[string]string{"gpu-count.nri-gpu.io": "1"})
	b := newPod("b", map[string]string{"gpus.nri-gpu.io": "1"})
	c := newPod("c", map[string]string{"gpus.nri-gpu.io": "0"})
	d := newPod("d", map[string]string{"gpu-count.nri-gpu.io": "1"})

	adj, err := r.create(a, ctr(a, "first"))
	if err != nil {
		t.Fatal(err)
	}
	if got := devicePaths(adj); !slices.Equal(got, []string{"/dev/nvidia0"}) {
		t.Fatalf("count pod got %v, want GPU 0", got)
	}
	if got := adj.GetAnnotations(); got[plugin.DevicesAnnotation] != "nvidia.com/gpu=0" || got[plugin.CountedAnnotation] != "nvidia.com/gpu=0" {
		t.Errorf("annotations %v, want the pod's devices recorded", got)
	}
	if _, err := r.create(b, ctr(b, "main")); err != nil {
		t.Fatal(err)
	}

	// A new plugin process, knowing nothing but what the runtime reports.
	r.restart(t, cfg)

	if _, err := r.create(c, ctr(c, "main")); err == nil || !strings.Contains(err.Error(), "held by pod tenant/a") {
		t.Errorf("after a restart, GPU 0 of pod a was handed out again: %v", err)
	}
	if _, err := r.create(d, ctr(d, "main")); err == nil || !strings.Contains(err.Error(), "0 are free and 2 held") {
		t.Errorf("after a restart, a count request found free GPUs: %v", err)
	}
	adj, err = r.create(a, ctr(a, "second"))
	if err != nil {
		t.Fatal(err)
	}
	if got := devicePaths(adj); !slices.Equal(got, []string{"/dev/nvidia0"}) {
		t.Errorf("a second container of the count pod got %v, want the pod's GPU 0", got)
	}

	r.removePod(t, a)
	adj, err = r.create(d, ctr(d, "main"))
	if err != nil {
		t.Fatalf("after the holder was removed: %v", err)
	}
	if got := devicePaths(adj); !slices.Equal(got, []string{"/dev/nvidia0"}) {
		t.Errorf("got %v, want the released GPU 0", got)
	}
}

// TestForgedAnnotationsDecideNothing: tenants set nri-gpu's own
// annotations on their containers, to claim another pod's GPU and to lock
// a free one. nri-gpu removes them from a container it gives nothing, and
// a restarted plugin learns who holds what from its state file, not from
// them.
func TestForgedAnnotationsDecideNothing(t *testing.T) {
	const cfg = "policy: {exclusive: true}"
	r := runtime(t, cfg)
	a := &api.PodSandbox{Id: "id-a", Name: "a", Namespace: "tenant", Annotations: map[string]string{"gpu-count.nri-gpu.io": "1"}}
	if adj, err := r.create(a, &api.Container{Id: "a", PodSandboxId: a.Id, Name: "main", Linux: &api.LinuxContainer{}}); err != nil {
		t.Fatal(err)
	} else if got := devicePaths(adj); !slices.Equal(got, []string{"/dev/nvidia0"}) {
		t.Fatalf("pod a got %v, want GPU 0", got)
	}

	// A container that asks for nothing loses the annotations it forged.
	forged := map[string]string{plugin.DevicesAnnotation: "nvidia.com/gpu=0", plugin.CountedAnnotation: "nvidia.com/gpu=0"}
	w := &api.PodSandbox{Id: "id-w", Name: "w", Namespace: "tenant"}
	adj, err := r.create(w, &api.Container{Id: "w", PodSandboxId: w.Id, Name: "main", Linux: &api.LinuxContainer{}, Annotations: forged})
	if err != nil {
		t.Fatal(err)
	}
	if got := adj.GetAnnotations(); len(got) != 2 || !hasKey(got, "-"+plugin.DevicesAnnotation) || !hasKey(got, "-"+plugin.CountedAnnotation) {
		t.Errorf("the adjustment of a container forging nri-gpu's annotations has annotations %v, want both removed", got)
	}

	// Containers the runtime reports with forged annotations (created
	// while no nri-gpu ran): pod f claims a's GPU as counted, pod l locks
	// GPU 1 by name.
	f := &api.PodSandbox{Id: "id-f", Name: "f", Namespace: "tenant", Annotations: map[string]string{"gpu-count.nri-gpu.io": "1"}}
	l := &api.PodSandbox{Id: "id-l", Name: "l", Namespace: "tenant"}
	r.mu.Lock()
	r.pods[f.Id], r.pods[l.Id] = f, l
	r.containers = append(r.containers,
		&api.Container{Id: "f0", PodSandboxId: f.Id, Name: "early", Linux: &api.LinuxContainer{}, Annotations: forged},
		&api.Container{Id: "l0", PodSandboxId: l.Id, Name: "main", Linux: &api.LinuxContainer{},
			Annotations: map[string]string{plugin.DevicesAnnotation: "nvidia.com/gpu=1"}})
	r.mu.Unlock()

	r.restart(t, cfg)

	adj, err = r.create(f, &api.Container{Id: "f1", PodSandboxId: f.Id, Name: "main", Linux: &api.LinuxContainer{}})
	if err != nil {
		t.Fatalf("pod f's count request, GPU 1 being free: %v", err)
	}
	if got := devicePaths(adj); !slices.Equal(got, []string{"/dev/nvidia1"}) {
		t.Errorf("pod f, which forged a claim on pod a's GPU 0, got %v; want the free GPU 1", got)
	}
	c := &api.PodSandbox{Id: "id-c", Name: "c", Namespace: "tenant", Annotations: map[string]string{"gpus.nri-gpu.io": "0"}}
	_, err = r.create(c, &api.Container{Id: "c", PodSandboxId: c.Id, Name: "main", Linux: &api.LinuxContainer{}})
	testutil.ErrorSays(t, err, "held by pod tenant/a")
}

// TestStateFileKeepsCountGrants: without policy.exclusive, a device given
// for a count request is its pod's alone, a named one is shared. Only the
// state file tells a restarted plugin which was which; a state file that
// others may write is not read, and pod a's running container is judged
// as a new one: its count request is held as a count grant again.
func TestStateFileKeepsCountGrants(t *testing.T) {
	const cfg = "policy: {exclusive: false}"
	r := runtime(t, cfg)
	a := &api.PodSandbox{Id: "id-a", Name: "a", Namespace: "tenant", Annotations: map[string]string{"gpu-count.nri-gpu.io": "1"}}
	if _, err := r.create(a, &api.Container{Id: "a", PodSandboxId: a.Id, Name: "main", Linux: &api.LinuxContainer{}}); err != nil {
		t.Fatal(err)
	}
	named := func(name string) error {
		pod := &api.PodSandbox{Id: "id-" + name, Name: name, Namespace: "tenant", Annotations: map[string]string{"gpus.nri-gpu.io": "0"}}
		_, err := r.create(pod, &api.Container{Id: name, PodSandboxId: pod.Id, Name: "main", Linux: &api.LinuxContainer{}})
		return err
	}
	r.restart(t, cfg)
	testutil.ErrorSays(t, named("b"), "held by pod tenant/a", "count request")

	// The state file made writable by others: not trusted, so pod a's
	// container is judged by what it asks for (a count) and the GPU it
	// has.
	if err := os.Chmod(r.stateFile, 0o666); err != nil {
		t.Fatal(err)
	}
	r.restart(t, cfg)
	testutil.ErrorSays(t, named("c"), "held by pod tenant/a", "count request")
}

// TestStoppedPodsHoldNothing: a pod stopped while the plugin was away,
// its containers all stopped but not yet removed, holds nothing after a
// restart; a pod with a container still running keeps its devices.
func TestStoppedPodsHoldNothing(t *testing.T) {
	const cfg = "policy: {exclusive: true}"
	r := runtime(t, cfg)
	count := map[string]string{"gpu-count.nri-gpu.io": "1"}
	a := &api.PodSandbox{Id: "id-a", Name: "a", Namespace: "tenant", Annotations: count}
	b := &api.PodSandbox{Id: "id-b", Name: "b", Namespace: "tenant", Annotations: count}
	for _, c := range []*api.Container{
		{Id: "a", PodSandboxId: a.Id, Name: "main", Linux: &api.LinuxContainer{}},
		{Id: "b2", PodSandboxId: b.Id, Name: "main", Linux: &api.LinuxContainer{}},
		{Id: "b1", PodSandboxId: b.Id, Name: "done", Linux: &api.LinuxContainer{}},
	} {
		pod := map[string]*api.PodSandbox{a.Id: a, b.Id: b}[c.PodSandboxId]
		if _, err := r.create(pod, c); err != nil {
			t.Fatal(err)
		}
	}
	r.mu.Lock()
	for _, c := range r.containers {
		c.State = api.ContainerState_CONTAINER_RUNNING
		if c.PodSandboxId == a.Id || c.Id == "b1" {
			c.State = api.ContainerState_CONTAINER_STOPPED
		}
	}
	r.mu.Unlock()
	r.restart(t, cfg)

	d := &api.PodSandbox{Id: "id-d", Name: "d", Namespace: "tenant", Annotations: map[string]string{"gpu-count.nri-gpu.io": "2"}}
	_, err := r.create(d, &api.Container{Id: "d", PodSandboxId: d.Id, Name: "main", Linux: &api.LinuxContainer{}})
	testutil.ErrorSays(t, err, "1 are free and 1 held")
}

// TestCountSkipsUnusableDevices: GPU 0's spec entry injects a hook
// outside policy.hookPaths. A count request gets GPU 1 instead of
// failing, and one for both GPUs says why GPU 0 cannot be had.
func TestCountSkipsUnusableDevices(t *testing.T) {
	const cfg = "policy: {exclusive: true}"
	r := runtime(t, cfg)
	withHook := strings.Replace(spec, `  - name: "0"
    containerEdits:
`, `  - name: "0"
    containerEdits:
      hooks: [{hookName: createContainer, path: /bin/evil}]
`, 1)
	if withHook == spec {
		t.Fatal("test spec not changed")
	}
	if err := os.WriteFile(filepath.Join(r.specDir, "gpu.yaml"), []byte(withHook), 0o644); err != nil {
		t.Fatal(err)
	}
	r.restart(t, cfg) // a plugin that loads the changed spec

	a := &api.PodSandbox{Id: "id-a", Name: "a", Namespace: "tenant", Annotations: map[string]string{"gpu-count.nri-gpu.io": "1"}}
	adj, err := r.create(a, &api.Container{Id: "a", PodSandboxId: a.Id, Name: "main", Linux: &api.LinuxContainer{}})
	if err != nil {
		t.Fatalf("a count request with GPU 1 usable: %v", err)
	}
	if got := devicePaths(adj); !slices.Equal(got, []string{"/dev/nvidia1"}) {
		t.Errorf("got %v, want GPU 1: GPU 0 injects a hook outside policy.hookPaths", got)
	}
	b := &api.PodSandbox{Id: "id-b", Name: "b", Namespace: "tenant", Annotations: map[string]string{"gpu-count.nri-gpu.io": "1"}}
	_, err = r.create(b, &api.Container{Id: "b", PodSandboxId: b.Id, Name: "main", Linux: &api.LinuxContainer{}})
	testutil.ErrorSays(t, err, "0 are free and 1 held", "1 more cannot be given to this container", `injects the hook "/bin/evil"`)
}

// inProcess returns a plugin of cfgYAML reading the specs in dir, to call
// directly, closed when the test ends.
func inProcess(t *testing.T, cfgYAML, dir string, opts ...plugin.Option) *plugin.Plugin {
	t.Helper()
	cfg, err := config.Parse([]byte(cfgYAML))
	if err != nil {
		t.Fatal(err)
	}
	p, err := plugin.New(cfg, quiet(), append([]plugin.Option{plugin.WithSpecDirs([]string{dir})}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	synchronized(t, p)
	t.Cleanup(p.Close)
	return p
}

func hasKey(m map[string]string, key string) bool {
	_, ok := m[key]
	return ok
}

// TestThousandSpecs has nri-gpu serve a request with 1000 spec files
// loaded, through the runtime side, whose request timeout (NRI's default,
// 2 s) fails a plugin that is too slow. Speed itself is measured by the
// benchmarks, not here.
func TestThousandSpecs(t *testing.T) {
	r := runtime(t, "")
	for i := 0; i < 1000; i++ {
		spec := fmt.Sprintf(`cdiVersion: "0.6.0"
kind: nvidia.com/gpu
devices:
  - name: "x%d"
    containerEdits:
      env: ["X=%d"]
      deviceNodes: [{path: /dev/x%d, hostPath: /dev/null}]
`, i, i, i)
		if err := os.WriteFile(filepath.Join(r.specDir, fmt.Sprintf("x%04d.yaml", i)), []byte(spec), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	req := createRequest(map[string]string{"gpus.nri-gpu.io": "x999,0"}, nil)
	deadline := time.Now().Add(10 * time.Second)
	for {
		adj, err := r.create(req.Pod, req.Container)
		if err == nil {
			if got := devicePaths(adj); !slices.Equal(got, []string{"/dev/x999", "/dev/nvidia0"}) {
				t.Errorf("devices %v", got)
			}
			return
		}
		if !strings.Contains(err.Error(), "unresolvable") || time.Now().After(deadline) {
			t.Fatalf("with 1000 specs: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestConcurrentRequests has many containers of many pods created at
// once, each asking for its own devices: every one gets exactly those, in
// its devices and in its annotation, whatever the others asked for.
func TestConcurrentRequests(t *testing.T) {
	const gpus = 8
	var b strings.Builder
	b.WriteString("cdiVersion: \"0.6.0\"\nkind: nvidia.com/gpu\ncontainerEdits: {env: [NVIDIA_VISIBLE_DEVICES=void]}\ndevices:\n")
	for i := 0; i < gpus; i++ {
		fmt.Fprintf(&b, "  - {name: \"%d\", containerEdits: {deviceNodes: [{path: /dev/nvidia%d, hostPath: /dev/null}]}}\n", i, i)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "gpu.yaml"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := plugin.New(config.Default(), quiet(), plugin.WithSpecDirs([]string{dir}))
	if err != nil {
		t.Fatal(err)
	}
	synchronized(t, p)
	t.Cleanup(func() { p.Close() })

	var wg sync.WaitGroup
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 100; i++ {
				// Worker w asks for w%gpus+1 devices starting at GPU i%gpus.
				var items, paths []string
				for k := 0; k <= w%gpus; k++ {
					g := (i + k) % gpus
					items = append(items, fmt.Sprint(g))
					paths = append(paths, fmt.Sprintf("/dev/nvidia%d", g))
				}
				id := fmt.Sprintf("pod-%d-%d", w, i)
				pod := &api.PodSandbox{Id: id, Name: id, Namespace: "ns", Annotations: map[string]string{"gpus.nri-gpu.io": strings.Join(items, ",")}}
				ctr := &api.Container{Id: id + "-c", PodSandboxId: id, Name: "c", Linux: &api.LinuxContainer{}}
				adj, _, err := p.CreateContainer(context.Background(), pod, ctr)
				if err != nil {
					t.Errorf("%s: %v", id, err)
					return
				}
				slices.Sort(paths)
				got := devicePaths(adj)
				slices.Sort(got)
				if !slices.Equal(got, paths) {
					t.Errorf("%s asked for %v, got devices %v", id, items, got)
				}
				if ann := adj.GetAnnotations()[plugin.DevicesAnnotation]; ann != "nvidia.com/gpu="+strings.Join(items, ",nvidia.com/gpu=") {
					t.Errorf("%s asked for %v, annotated %q", id, items, ann)
				}
				_ = p.RemovePodSandbox(context.Background(), pod)
			}
		}()
	}
	wg.Wait()
}

// TestFailedInjectionHoldsNothing: a container whose devices are admitted
// but cannot be injected (here an edit NRI cannot express) leaves its pod
// holding none of them, so another pod may have them.
func TestFailedInjectionHoldsNothing(t *testing.T) {
	dir := t.TempDir()
	const spec = `cdiVersion: "0.7.0"
kind: nvidia.com/gpu
devices:
  - {name: "0", containerEdits: {deviceNodes: [{path: /dev/nvidia0, hostPath: /dev/null}]}}
  - {name: "1", containerEdits: {deviceNodes: [{path: /dev/nvidia1, hostPath: /dev/zero}], additionalGids: [44]}}
`
	if err := os.WriteFile(filepath.Join(dir, "gpu.yaml"), []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	p := inProcess(t, "policy: {exclusive: true}", dir)
	create := func(podName, devices string) error {
		pod := &api.PodSandbox{Id: podName, Name: podName, Namespace: "ns", Annotations: map[string]string{"gpus.nri-gpu.io": devices}}
		ctr := &api.Container{Id: podName + "-c", PodSandboxId: podName, Name: "c", Linux: &api.LinuxContainer{},
			User: &api.User{Uid: 1000, Gid: 1000}} // lacks group 44, which the spec adds
		_, _, err := p.CreateContainer(context.Background(), pod, ctr)
		return err
	}
	err := create("a", "0,1")
	testutil.ErrorSays(t, err, `device "nvidia.com/gpu=1"`, "additionalGids")
	if err := create("b", "0"); err != nil {
		t.Errorf("GPU 0 is still held by the pod whose container failed: %v", err)
	}
}

// TestRuntimeCDIDevicesAreHeld: a device the runtime injects itself (the
// CRI request's CDI devices, from a device plugin) is held by its pod
// like one nri-gpu injected, so that policy.exclusive keeps other pods
// off it.
func TestRuntimeCDIDevicesAreHeld(t *testing.T) {
	r := runtime(t, "policy: {exclusive: true}")
	a := &api.PodSandbox{Id: "id-a", Name: "a", Namespace: "tenant"}
	ctrA := &api.Container{Id: "a-c", PodSandboxId: a.Id, Name: "c", Linux: &api.LinuxContainer{},
		CDIDevices: []*api.CDIDevice{{Name: "nvidia.com/gpu=1"}}}
	adj, err := r.create(a, ctrA)
	if err != nil {
		t.Fatal(err)
	}
	if len(adj.GetLinux().GetDevices()) != 0 || adj.GetAnnotations()[plugin.DevicesAnnotation] != "nvidia.com/gpu=1" {
		t.Errorf("adjustment %v: want nothing injected and GPU 1 recorded as the pod's", adj)
	}
	b := &api.PodSandbox{Id: "id-b", Name: "b", Namespace: "tenant", Annotations: map[string]string{"gpus.nri-gpu.io": "1"}}
	_, err = r.create(b, &api.Container{Id: "b-c", PodSandboxId: b.Id, Name: "c", Linux: &api.LinuxContainer{}})
	testutil.ErrorSays(t, err, `device "nvidia.com/gpu=1" is held by pod tenant/a`)
}

// TestErrorsStayShort asks for the most devices an annotation may name,
// none of them defined, while many spec files are broken: the error the
// runtime gets is short (it must fit a ttrpc message and a kubelet
// event), names the spec problems by count, and keeps its cause.
func TestErrorsStayShort(t *testing.T) {
	dir := t.TempDir()
	for i := 0; i < 50; i++ {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("broken%02d.yaml", i)), []byte("cdiVersion: \"0.6.0\"\nkind: nvidia.com/gpu\ndevices: [{name: \"x\"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	p, err := plugin.New(config.Default(), quiet(), plugin.WithSpecDirs([]string{dir}))
	if err != nil {
		t.Fatal(err)
	}
	synchronized(t, p)
	defer p.Close()
	var items []string
	for i := 0; i < 256; i++ {
		items = append(items, fmt.Sprint(1000+i))
	}
	pod := &api.PodSandbox{Id: "p", Name: "p", Namespace: "ns", Annotations: map[string]string{"gpus.nri-gpu.io": strings.Join(items, ",")}}
	_, _, err = p.CreateContainer(context.Background(), pod, &api.Container{Id: "c", PodSandboxId: "p", Name: "c", Linux: &api.LinuxContainer{}})
	testutil.ErrorSays(t, err, `request "1000" (nvidia.com/gpu=1000)`, "one of 50 spec files not used", "more bytes")
	if n := len(err.Error()); n > 4096 {
		t.Errorf("the error is %d bytes long", n)
	}
	if !errors.Is(err, specs.ErrUnresolvable) {
		t.Errorf("error %v does not wrap ErrUnresolvable", err)
	}
}

// TestRestoreSkipsOverlongRecords has the runtime report, with no state
// file, a container whose devices annotation is longer than any
// container's could be: the plugin registers in time, the annotation
// decides nothing, and a container that asks for the GPU it has holds
// it, judged as a new one.
func TestRestoreSkipsOverlongRecords(t *testing.T) {
	const cfg = "policy: {exclusive: true}"
	r := runtime(t, cfg)
	a := &api.PodSandbox{Id: "id-a", Name: "a", Namespace: "tenant"}
	huge := &api.Container{Id: "huge", PodSandboxId: a.Id, Name: "huge", Linux: &api.LinuxContainer{},
		Annotations: map[string]string{plugin.DevicesAnnotation: strings.Repeat("nvidia.com/gpu=0,", 200000) + "nvidia.com/gpu=0"}}
	b := &api.PodSandbox{Id: "id-b", Name: "b", Namespace: "tenant", Annotations: map[string]string{"gpus.nri-gpu.io": "1"}}
	e := &api.PodSandbox{Id: "id-e", Name: "e", Namespace: "tenant"}
	held := &api.Container{Id: "held", PodSandboxId: b.Id, Name: "held", Linux: &api.LinuxContainer{
		Devices: []*api.LinuxDevice{{Path: "/dev/nvidia1", Type: "c", Major: 1, Minor: 5}}, // GPU 1 is /dev/zero
	}, Annotations: map[string]string{plugin.DevicesAnnotation: "nvidia.com/gpu=1"}}
	r.mu.Lock()
	r.pods[a.Id], r.pods[b.Id], r.pods[e.Id] = a, b, e
	// A privileged container has every node of the host, GPU 0 too, but
	// asks for none of them: it holds nothing.
	privileged := &api.Container{Id: "privileged", PodSandboxId: e.Id, Name: "agent", Linux: &api.LinuxContainer{
		Devices: []*api.LinuxDevice{{Path: "/dev/nvidia0", Type: "c", Major: 1, Minor: 3}},
	}}
	r.containers = append(r.containers, huge, held, privileged)
	r.stateFile = ""
	r.mu.Unlock()

	r.restart(t, cfg) // Synchronize within NRI's timeout, or the plugin would not register

	c := &api.PodSandbox{Id: "id-c", Name: "c", Namespace: "tenant", Annotations: map[string]string{"gpus.nri-gpu.io": "0"}}
	if _, err := r.create(c, &api.Container{Id: "c", PodSandboxId: c.Id, Name: "c", Linux: &api.LinuxContainer{}}); err != nil {
		t.Errorf("GPU 0, named only by the overlong record and in a privileged container, is held: %v", err)
	}
	d := &api.PodSandbox{Id: "id-d", Name: "d", Namespace: "tenant", Annotations: map[string]string{"gpus.nri-gpu.io": "1"}}
	_, err := r.create(d, &api.Container{Id: "d", PodSandboxId: d.Id, Name: "d", Linux: &api.LinuxContainer{}})
	testutil.ErrorSays(t, err, "held by pod tenant/b")
}

// TestExclusiveByNodeIdentity: two specs name one device (c 1:3) by two
// host nodes of different paths; under policy.exclusive a pod holding the
// device of one keeps the other's from every other pod.
func TestExclusiveByNodeIdentity(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("making device nodes needs root")
	}
	dir, nodes := t.TempDir(), t.TempDir()
	for _, n := range []string{"one", "other"} {
		if err := unix.Mknod(filepath.Join(nodes, n), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
			t.Fatal(err)
		}
	}
	for file, spec := range map[string]string{
		"a.yaml": "cdiVersion: \"0.6.0\"\nkind: example.com/a\ndevices: [{name: x, containerEdits: {deviceNodes: [{path: /dev/x, hostPath: " + nodes + "/one}]}}]\n",
		"b.yaml": "cdiVersion: \"0.6.0\"\nkind: example.com/b\ndevices: [{name: y, containerEdits: {deviceNodes: [{path: /dev/y, hostPath: " + nodes + "/other}]}}]\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, file), []byte(spec), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	p := inProcess(t, "policy: {exclusive: true, devices: [\"*/*\"]}", dir)
	create := func(podName, device string) error {
		pod := &api.PodSandbox{Id: podName, Name: podName, Namespace: "ns", Annotations: map[string]string{"gpus.nri-gpu.io": device}}
		_, _, err := p.CreateContainer(context.Background(), pod, &api.Container{Id: podName + "-c", PodSandboxId: podName, Name: "c", Linux: &api.LinuxContainer{}})
		return err
	}
	if err := create("a", "example.com/a=x"); err != nil {
		t.Fatal(err)
	}
	testutil.ErrorSays(t, create("b", "example.com/b=y"), `device "example.com/b=y" is held by pod ns/a (as "example.com/a=x")`)
}

// TestRecoveredPodsReleasedByTheirContainers: containerd, restarted,
// reports its running pods at Synchronize but never their StopPodSandbox
// or RemovePodSandbox, only their containers' removal (seen on 1.7.35 on
// the test cluster: a deleted pod's GPU stayed held, and every later pod
// kubelet gave it was refused). A pod known from Synchronize releases its
// devices when its last container is removed, not before, and again
// when a container it was given after that is removed; a pod of the
// current connection keeps them until its sandbox stops.
func TestRecoveredPodsReleasedByTheirContainers(t *testing.T) {
	const cfg = "policy: {exclusive: true}"
	r := runtime(t, cfg)
	pod := func(name, gpu string) *api.PodSandbox {
		return &api.PodSandbox{Id: "id-" + name, Name: name, Namespace: "tenant", Annotations: map[string]string{"gpus.nri-gpu.io": gpu}}
	}
	ctr := func(p *api.PodSandbox, name string) *api.Container {
		return &api.Container{Id: p.Id + "-" + name, PodSandboxId: p.Id, Name: name, Linux: &api.LinuxContainer{}}
	}
	removeContainer := func(p *api.PodSandbox, c *api.Container) {
		t.Helper()
		if err := r.RemoveContainer(context.Background(), &adaptation.RemoveContainerRequest{Pod: p, Container: c}); err != nil {
			t.Fatal(err)
		}
	}
	heldBy := func(gpu, holder string) {
		t.Helper()
		asker := pod("asker-"+gpu, gpu)
		_, err := r.create(asker, ctr(asker, "main"))
		if holder == "" {
			if err != nil {
				t.Errorf("GPU %s: %v, want it free", gpu, err)
			}
			r.removePod(t, asker)
			return
		}
		if err == nil || !strings.Contains(err.Error(), "held by pod tenant/"+holder) {
			t.Errorf("GPU %s: %v, want it held by %s", gpu, err, holder)
		}
	}
	one, two := pod("one", "1"), pod("two", "0")
	oneMain, twoMain, twoSide := ctr(one, "main"), ctr(two, "main"), ctr(two, "side")
	for _, c := range []struct {
		p *api.PodSandbox
		c *api.Container
	}{{one, oneMain}, {two, twoMain}, {two, twoSide}} {
		if _, err := r.create(c.p, c.c); err != nil {
			t.Fatal(err)
		}
	}
	// The runtime restarts: it reports the pods at Synchronize.
	r.restart(t, cfg)
	heldBy("1", "one")

	removeContainer(one, oneMain)
	heldBy("1", "")
	// A new container of that pod is admitted anew, and tracked: its
	// removal releases the GPU again.
	oneAgain := ctr(one, "again")
	if _, err := r.create(one, oneAgain); err != nil {
		t.Fatal(err)
	}
	heldBy("1", "one")
	removeContainer(one, oneAgain)
	heldBy("1", "")

	removeContainer(two, twoMain)
	heldBy("0", "two")
	removeContainer(two, twoSide)
	heldBy("0", "")

	// A pod of this connection: a container removed (a restart's old
	// one) leaves its devices held.
	three := pod("three", "1")
	first := ctr(three, "first")
	if _, err := r.create(three, first); err != nil {
		t.Fatal(err)
	}
	removeContainer(three, first)
	heldBy("1", "three")
}

// TestRecoveredPodsWithNoContainer: containerd reports no exited
// container at Synchronize, and a stopped sandbox with pid 0. After it
// restarted, a pod whose containers exited and whose sandbox stopped
// (being deleted: kubelet removes its containers soon, its sandbox later,
// and containerd tells nri-gpu of neither) holds nothing (seen on 2.3.7
// on the test cluster: a GPU held after its pod was gone); one whose
// sandbox still runs (its container crashed, to be started again) keeps
// its GPU, and releases it when the container it is given next is
// removed, or when its sandbox process (a real one here) ends with no
// container (the pod deleted while its container waited to be started
// again) but not when a process that is not its sandbox ends.
func TestRecoveredPodsWithNoContainer(t *testing.T) {
	const cfg = "policy: {exclusive: true}"
	for _, tc := range []struct {
		name    string
		sandbox string // "stopped" (pid 0), "running", "ends", "another ends"
		running bool   // a container of it still runs
		held    bool
	}{
		{"sandbox stopped, containers exited", "stopped", false, false},
		{"sandbox running, containers exited", "running", false, true},
		{"sandbox stopped, a container running", "stopped", true, true},
		{"containers exited, then the sandbox ends", "ends", false, true},
		{"containers exited, then a process not its sandbox ends", "another ends", false, true},
		{"containers exited, nri-gpu stopped, then the sandbox ends", "ends once stopped", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var pid int
			if tc.sandbox != "stopped" {
				proc := exec.Command("sleep", "60")
				if err := proc.Start(); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = proc.Process.Kill(); _ = proc.Wait() })
				pid = proc.Process.Pid
			}
			var asked atomic.Int32 // whether a process is the sandbox
			isSandbox := func(p int, podID string) bool {
				asked.Add(1)
				return tc.sandbox != "another ends" && p == pid && podID == "id-one"
			}
			r := runtimeSetUp(t, "v1.7.35", cfg, func() []plugin.Option { return []plugin.Option{plugin.WithSandboxCheck(isSandbox)} })
			one := &api.PodSandbox{Id: "id-one", Name: "one", Namespace: "tenant", Annotations: map[string]string{"gpus.nri-gpu.io": "0"}}
			if _, err := r.create(one, &api.Container{Id: "one-main", PodSandboxId: one.Id, Name: "main", Linux: &api.LinuxContainer{}}); err != nil {
				t.Fatal(err)
			}
			r.mu.Lock()
			r.pods[one.Id] = &api.PodSandbox{Id: one.Id, Name: one.Name, Namespace: one.Namespace, Annotations: one.Annotations, Pid: uint32(pid)}
			if !tc.running {
				r.containers = nil
			}
			r.mu.Unlock()
			r.restart(t, cfg) // the runtime restarted: no StopPodSandbox will come
			if tc.sandbox == "ends once stopped" {
				// Its record is another nri-gpu's once it stopped: the
				// stopped one's watch of the sandbox ended with it, and
				// the sandbox's end changes nothing.
				r.stopPlugin()
				before, err := os.ReadFile(r.stateFile)
				if err != nil || !strings.Contains(string(before), "id-one") {
					t.Fatalf("the record %q (%v), want pod one in it", before, err)
				}
				if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
				if after, err := os.ReadFile(r.stateFile); err != nil || string(after) != string(before) {
					t.Errorf("the record changed after nri-gpu stopped (%v):\n%s\nwas\n%s", err, after, before)
				}
				return
			}

			asker := &api.PodSandbox{Id: "id-asker", Name: "asker", Namespace: "tenant", Annotations: map[string]string{"gpus.nri-gpu.io": "0"}}
			ask := func() error {
				_, err := r.create(asker, &api.Container{Id: "asker-main", PodSandboxId: asker.Id, Name: "main", Linux: &api.LinuxContainer{}})
				if err == nil {
					r.removePod(t, asker)
				}
				return err
			}
			heldBy := func(holder string) {
				t.Helper()
				err := ask()
				if holder == "" && err != nil {
					t.Errorf("GPU 0: %v, want it free", err)
				}
				if holder != "" && (err == nil || !strings.Contains(err.Error(), "held by pod tenant/"+holder)) {
					t.Errorf("GPU 0: %v, want it held by %s", err, holder)
				}
			}
			if !tc.held {
				heldBy("")
				return
			}
			heldBy("one")
			switch {
			case tc.running:
				return
			case strings.HasSuffix(tc.sandbox, "ends"):
				if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
				if tc.sandbox == "ends" {
					testutil.Within(t, 5*time.Second, "GPU 0 released once the sandbox ended", func() bool { return ask() == nil })
					return
				}
				// Not its sandbox: no watch began, and the pod keeps it.
				if asked.Load() == 0 {
					t.Error("not asked whether the process is the pod's sandbox")
				}
				heldBy("one")
				return
			}
			again := &api.Container{Id: "one-again", PodSandboxId: one.Id, Name: "main", Linux: &api.LinuxContainer{}}
			if _, err := r.create(one, again); err != nil {
				t.Fatalf("the pod's container started again: %v", err)
			}
			if err := r.RemoveContainer(context.Background(), &adaptation.RemoveContainerRequest{Pod: one, Container: again}); err != nil {
				t.Fatal(err)
			}
			heldBy("")
		})
	}
}

// TestConcurrentCounts: as many pods as there are GPUs ask for one at
// once, round after round: each gets one, none the same, though several
// choose the same free GPU at first and all but one must choose again.
func TestConcurrentCounts(t *testing.T) {
	const gpus = 8
	p, err := plugin.New(config.Default(), quiet(), plugin.WithSpecDirs([]string{gpuSpecDir(t, gpus)}))
	if err != nil {
		t.Fatal(err)
	}
	synchronized(t, p)
	t.Cleanup(func() { p.Close() })
	for round := range 20 {
		got := make([]string, gpus)
		var wg sync.WaitGroup
		for i := range gpus {
			wg.Add(1)
			go func() {
				defer wg.Done()
				pod := gpuPod(fmt.Sprintf("r%d-%d", round, i), map[string]string{"gpu-count.nri-gpu.io": "1"})
				adj, _, err := p.CreateContainer(context.Background(), pod, ctrOf(pod, nil))
				if err != nil {
					t.Errorf("round %d, pod %d: %v", round, i, err)
					return
				}
				got[i] = strings.Join(devicePaths(adj), ",")
			}()
		}
		wg.Wait()
		seen := map[string]bool{}
		for i, g := range got {
			if g == "" || seen[g] {
				t.Fatalf("round %d: pod %d got %q; all: %v", round, i, g, got)
			}
			seen[g] = true
		}
		for i := range gpus {
			if err := p.RemovePodSandbox(context.Background(), gpuPod(fmt.Sprintf("r%d-%d", round, i), nil)); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestUserNamespaceContainer: over NRI's runtime side, a container with a
// user namespace of its own gets a node whose hostPath differs from its
// path as a bind mount with its cgroup rule on containerd 2.x, asked by
// its pod or by kubelet for the device plugin (the runtime's CDI off),
// and is refused on 1.7, which applies no cgroup rule from NRI; a
// container without one gets the device node.
func TestUserNamespaceContainer(t *testing.T) {
	for _, tc := range []struct {
		version, wantErr string
		userNS           bool
		mount            bool
		// kubelet asks through the device plugin, under this container
		// annotation (cdi.k8s.io with the runtime's own CDI off, or
		// devices.nri-gpu.io), instead of the pod.
		kubelet string
	}{
		{version: "v2.3.7", userNS: true, mount: true},
		{version: "v2.3.7", userNS: true, mount: true, kubelet: "cdi.k8s.io/nri-gpu_nvidia.com_gpu"},
		{version: "v2.3.7", userNS: true, mount: true, kubelet: "devices.nri-gpu.io/nvidia.com_gpu"},
		{version: "v2.3.7"},
		{version: "v1.7.35", userNS: true, wantErr: `device node "/dev/nvidia0" (host "/dev/null"): in a user namespace the runtime cannot create it`},
	} {
		r := runtimeSetUp(t, tc.version, "policy: {exclusive: true}\n", nil)
		pod := gpuPod("a", map[string]string{"gpus.nri-gpu.io": "0"})
		ctr := ctrOf(pod, nil)
		if tc.kubelet != "" {
			pod = gpuPod("a", nil)
			ctr = ctrOf(pod, map[string]string{tc.kubelet: "nvidia.com/gpu=0"})
		}
		if tc.userNS {
			ctr.Linux.Namespaces = []*api.LinuxNamespace{{Type: "user", Path: "/proc/1/ns/user"}}
		}
		adj, err := r.create(pod, ctr)
		if tc.wantErr != "" {
			testutil.ErrorSays(t, err, tc.wantErr)
			continue
		}
		if err != nil {
			t.Fatalf("%s, user namespace %v: %v", tc.version, tc.userNS, err)
		}
		mounted := slices.ContainsFunc(adj.GetMounts(), func(m *api.Mount) bool { return m.Destination == "/dev/nvidia0" && m.Source == "/dev/null" })
		node := slices.ContainsFunc(adj.GetLinux().GetDevices(), func(d *api.LinuxDevice) bool { return d.Path == "/dev/nvidia0" })
		if mounted != tc.mount || node == tc.mount {
			t.Errorf("%s, user namespace %v: bind mount %v, device node %v; want the mount %v", tc.version, tc.userNS, mounted, node, tc.mount)
		}
	}
}

// gate is a DRA claim finder that holds a pod's request until let is
// closed, having said so on entered.
type gate struct {
	pod          string
	entered, let chan struct{}
}

func (g *gate) Uses(ctx context.Context, pod link.PodRef, _ string) ([]link.ClaimUse, error) {
	if pod.Name == g.pod {
		close(g.entered)
		select {
		case <-g.let:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return nil, nil
}

// TestRecoveredPodKeepsItsGPUWhileAContainerIsCreated: a pod known from
// Synchronize whose last container is removed while a new container of
// it is being created keeps its GPU for that container: another pod
// asking for it meanwhile is refused (it was once given it, the pod's
// holding released under the new container).
func TestRecoveredPodKeepsItsGPUWhileAContainerIsCreated(t *testing.T) {
	const cfg = "policy: {exclusive: true}"
	g := &gate{pod: "one", entered: make(chan struct{}), let: make(chan struct{})}
	open := true
	r := runtimeSetUp(t, "v1.7.35", cfg, func() []plugin.Option {
		if open {
			open = false
			return nil
		}
		return []plugin.Option{claimsOf(g)} // the nri-gpu after the restart
	})
	one := &api.PodSandbox{Id: "id-one", Name: "one", Namespace: "tenant", Annotations: map[string]string{"gpus.nri-gpu.io": "1"}}
	main := &api.Container{Id: "one-main", PodSandboxId: one.Id, Name: "main", Linux: &api.LinuxContainer{}}
	if _, err := r.create(one, main); err != nil {
		t.Fatal(err)
	}
	r.restart(t, cfg)
	p := r.plugin
	ctx := context.Background()
	done := make(chan error, 1)
	go func() {
		_, _, err := p.CreateContainer(ctx, one, &api.Container{Id: "one-side", PodSandboxId: one.Id, Name: "side", Linux: &api.LinuxContainer{}})
		done <- err
	}()
	<-g.entered
	if err := p.RemoveContainer(ctx, one, main); err != nil {
		t.Fatal(err)
	}
	asker := &api.PodSandbox{Id: "id-asker", Name: "asker", Namespace: "tenant", Annotations: map[string]string{"gpus.nri-gpu.io": "1"}}
	_, _, err := p.CreateContainer(ctx, asker, &api.Container{Id: "asker-main", PodSandboxId: asker.Id, Name: "main", Linux: &api.LinuxContainer{}})
	testutil.ErrorSays(t, err, "held by pod tenant/one")
	close(g.let)
	if err := <-done; err != nil {
		t.Fatalf("the pod's new container: %v", err)
	}
}
