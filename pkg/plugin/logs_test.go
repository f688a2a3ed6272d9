package plugin_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/metrics"
	"github.com/nri-gpu/nri-gpu/pkg/plugin"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
	"github.com/nri-gpu/nri-gpu/pkg/specs/nvidia"
)

// logged starts a plugin of cfgYAML whose log the test reads, with the
// given options, and synchronizes it as a runtime running no pod would.
func logged(t *testing.T, cfgYAML string, opts ...plugin.Option) (*plugin.Plugin, *logtest.Hook) {
	t.Helper()
	p, hook := loggedAtStart(t, cfgYAML, opts...)
	synchronized(t, p)
	return p, hook
}

// synchronized has the plugin synchronized as a runtime running no pod
// would: its pool restored, its doors open.
func synchronized(t *testing.T, p *plugin.Plugin) {
	t.Helper()
	if _, err := p.Synchronize(context.Background(), nil, nil); err != nil {
		t.Fatal(err)
	}
}

// loggedAtStart starts a plugin of cfgYAML whose log the test reads,
// with the given options, not yet synchronized.
func loggedAtStart(t *testing.T, cfgYAML string, opts ...plugin.Option) (*plugin.Plugin, *logtest.Hook) {
	t.Helper()
	cfg, err := config.Parse([]byte(cfgYAML))
	if err != nil {
		t.Fatal(err)
	}
	log, hook := logtest.NewNullLogger()
	log.SetLevel(logrus.DebugLevel)
	p, err := plugin.New(cfg, log, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p, hook
}

// entries returns the messages logged at level containing s.
func entries(hook *logtest.Hook, level logrus.Level, s string) []*logrus.Entry {
	var out []*logrus.Entry
	for _, e := range hook.AllEntries() {
		if e.Level == level && strings.Contains(e.Message, s) {
			out = append(out, e)
		}
	}
	return out
}

func gpuPod(name string, ann map[string]string) *api.PodSandbox {
	return &api.PodSandbox{Id: "id-" + name, Name: name, Namespace: "tenant", Annotations: ann}
}

func ctrOf(pod *api.PodSandbox, ann map[string]string) *api.Container {
	return &api.Container{Id: pod.Name + "-c", PodSandboxId: pod.Id, Name: "c", Annotations: ann, Linux: &api.LinuxContainer{},
		State: api.ContainerState_CONTAINER_RUNNING}
}

// TestSpecDirsFromConfig: without --cdi-spec-dirs, the configuration's
// cdiSpecDirs are read.
func TestSpecDirsFromConfig(t *testing.T) {
	specDir := gpuSpecDir(t, 2)
	p, _ := logged(t, "cdiSpecDirs: ["+specDir+"]\n")
	adj, _, err := p.CreateContainer(context.Background(), gpuPod("a", map[string]string{"gpus.nri-gpu.io": "1"}), ctrOf(gpuPod("a", nil), nil))
	if err != nil || !strings.Contains(strings.Join(devicePaths(adj), ","), "/dev/nvidia1") {
		t.Errorf("GPU 1 from the configured spec dir: %v, %v", devicePaths(adj), err)
	}
}

// TestSpecProblemsLoggedOnce: a broken spec is logged when it appears,
// not again at each reload of the specs, and its going is logged.
func TestSpecProblemsLoggedOnce(t *testing.T) {
	specDir := gpuSpecDir(t, 1)
	bad := filepath.Join(specDir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("cdiVersion: \"0.6.0\"\nkind: bad\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p, hook := logged(t, "policy: {devices: [\"*/*\"]}", plugin.WithSpecDirs([]string{specDir}))
	for i := range 3 { // changes beside it: the specs are loaded again
		env := fmt.Sprintf("A=%d", i)
		if err := os.WriteFile(filepath.Join(specDir, "other.yaml"), []byte("cdiVersion: \"0.6.0\"\nkind: example.com/x\ndevices: [{name: \"0\", containerEdits: {env: ["+env+"]}}]\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		pod := gpuPod("x", map[string]string{"gpus.nri-gpu.io": "example.com/x=0"})
		testutil.Within(t, 5*time.Second, "the specs loaded again ("+env+")", func() bool {
			adj, _, err := p.CreateContainer(context.Background(), pod, ctrOf(pod, nil))
			_ = p.StopPodSandbox(context.Background(), pod)
			return err == nil && slices.ContainsFunc(adj.GetEnv(), func(kv *api.KeyValue) bool { return kv.Key+"="+kv.Value == env })
		})
	}
	if n := len(entries(hook, logrus.WarnLevel, "CDI spec not used")); n != 1 {
		t.Errorf("the broken spec was logged %d times, want once", n)
	}
	// Broken another way: its new problem is logged.
	if err := os.WriteFile(bad, []byte("cdiVersion: \"0.6.0\"\nkind: example.com/bad\ndevices: [{name: \"\"}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	testutil.Within(t, 5*time.Second, "the spec's new problem logged", func() bool {
		return len(entries(hook, logrus.WarnLevel, "CDI spec not used")) == 2
	})
	if err := os.Remove(bad); err != nil {
		t.Fatal(err)
	}
	testutil.Within(t, 5*time.Second, "the problem's going logged", func() bool {
		return len(entries(hook, logrus.InfoLevel, "CDI spec problem gone")) == 1
	})
}

// TestConfigureOutsideServe: a plugin configured without Serve (no stub)
// by a runtime NRI does not know (so no known NRI version) subscribes to
// what every runtime knows.
func TestConfigureOutsideServe(t *testing.T) {
	p, hook := logged(t, "", plugin.WithSpecDirs([]string{gpuSpecDir(t, 1)}))
	ev, err := p.Configure(context.Background(), "", "other", "v2.3.7")
	if err != nil {
		t.Fatal(err)
	}
	if !ev.IsSet(api.Event_CREATE_CONTAINER) || ev.IsSet(api.Event_VALIDATE_CONTAINER_ADJUSTMENT) {
		t.Errorf("events %s", ev.PrettyString())
	}
	if len(entries(hook, logrus.InfoLevel, "asks no validators")) != 1 {
		t.Error("no word that the runtime's validation is not used")
	}
}

// messages are the entries' messages.
func messages(es []*logrus.Entry) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.Message)
	}
	return out
}

// TestRuntimeNRIVersionInferred: where the runtime does not report its
// NRI version, what it applies is told by NRI's own map of its releases,
// CRI-O's (reported without a "v") as containerd's, but where a release
// was read to run another (CRI-O 1.34: adjust.InferNRI); the events it is
// asked for are not.
func TestRuntimeNRIVersionInferred(t *testing.T) {
	for _, tc := range []struct{ runtime, version, want string }{
		{"cri-o", "1.34.0", "cri-o 1.34.0 (NRI v0.9.1-0.20250219030224-e597e7849f24) does not apply cgroup rules, net devices, RDT"},
		{"cri-o", "1.35.0", "cri-o 1.35.0 (NRI v0.11.0) applies cgroup rules, net devices, RDT"},
		{"cri-o", "1.31.2", "cri-o 1.31.2 (NRI v0.6.1) does not apply cgroup rules, net devices, RDT"},
		{"containerd", "1.7.35", "containerd 1.7.35 (NRI v0.8.0) does not apply cgroup rules, net devices, RDT"},
		{"containerd", "v2.3.7", "containerd v2.3.7 (NRI v0.11.0) applies cgroup rules, net devices, RDT"},
	} {
		p, hook := logged(t, "", plugin.WithSpecDirs([]string{gpuSpecDir(t, 1)}))
		ev, err := p.Configure(context.Background(), "", tc.runtime, tc.version)
		if err != nil {
			t.Fatal(err)
		}
		// The map's word is not taken for the events: CRI-O 1.34.0 refuses
		// a validator, whatever the map says of its NRI.
		if ev.IsSet(api.Event_VALIDATE_CONTAINER_ADJUSTMENT) {
			t.Errorf("%s %s: subscribed to validation on NRI's map's word", tc.runtime, tc.version)
		}
		said := entries(hook, logrus.InfoLevel, "what the runtime can apply")
		if len(said) != 1 || said[0].Message != "what the runtime can apply: "+tc.want {
			t.Errorf("%s %s: said %v, want %q", tc.runtime, tc.version, messages(said), tc.want)
		}
	}
}

// TestSynchronizeRestores: after a restart on a broken state file (said)
// the plugin judges the running containers of live pods as new ones: one
// that asks for a GPU it has holds it; a gone pod's container, a stopped
// one, one asking for nothing and a node-less device of the kind hold
// nothing.
func TestSynchronizeRestores(t *testing.T) {
	specDir := gpuSpecDir(t, 3)
	// A device of the kind with no device node of its own.
	if err := os.WriteFile(filepath.Join(specDir, "env.yaml"), []byte("cdiVersion: \"0.6.0\"\nkind: nvidia.com/gpu\ndevices: [{name: env, containerEdits: {env: [E=1]}}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(t.TempDir(), "state.json")
	if err := os.WriteFile(state, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	p, hook := loggedAtStart(t, "policy: {exclusive: true}", plugin.WithSpecDirs([]string{specDir}), plugin.WithStateFile(state))
	withGPU := func(pod *api.PodSandbox, gpu int64, state api.ContainerState) *api.Container {
		c := ctrOf(pod, map[string]string{plugin.DevicesAnnotation: "nvidia.com/gpu=x"})
		c.Id = c.Id + string(rune('0'+gpu))
		c.State = state
		c.Linux.Devices = []*api.LinuxDevice{{Path: "/dev/nvidia", Type: "c", Major: 195, Minor: gpu}}
		return c
	}
	gone, live, quiet := gpuPod("gone", nil), gpuPod("live", map[string]string{"gpu-count.nri-gpu.io": "1"}), gpuPod("quiet", nil)
	_, err := p.Synchronize(context.Background(), []*api.PodSandbox{live, quiet}, []*api.Container{
		withGPU(gone, 0, api.ContainerState_CONTAINER_RUNNING),
		withGPU(live, 1, api.ContainerState_CONTAINER_STOPPED),
		withGPU(live, 2, api.ContainerState_CONTAINER_RUNNING),
		ctrOf(quiet, map[string]string{plugin.DevicesAnnotation: ""}),
	})
	if err != nil {
		t.Fatal(err)
	}
	if said := entries(hook, logrus.ErrorLevel, "the record of what pods hold is unusable"); len(said) != 1 || !strings.Contains(said[0].Message, "kept as "+state+".damaged-") {
		t.Errorf("the unreadable state file is not said, with where it is kept: %v", said)
	}
	restored := entries(hook, logrus.InfoLevel, "restored devices held by pod")
	if len(restored) != 1 || restored[0].Data["pod"] != "live" || restored[0].Data["devices"] != "nvidia.com/gpu=2" {
		t.Errorf("restored %v, want pod live holding GPU 2 only", restored)
	}
	for _, tc := range []struct {
		gpu  string
		free bool
	}{{"0", true}, {"1", true}, {"2", false}, {"env", true}} {
		pod := gpuPod("new-"+tc.gpu, map[string]string{"gpus.nri-gpu.io": tc.gpu})
		_, _, err := p.CreateContainer(context.Background(), pod, ctrOf(pod, nil))
		if (err == nil) != tc.free {
			t.Errorf("GPU %s after the restart: %v, want free %v", tc.gpu, err, tc.free)
		}
		p.StopPodSandbox(context.Background(), pod)
	}
}

// TestSynchronizeConflictsSaid: a record in which two live pods hold one
// GPU under exclusive (an earlier policy's): both keep it, and the
// conflict is logged.
func TestSynchronizeConflictsSaid(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state.json")
	held := func(name string) string {
		return `{"id":"id-` + name + `","namespace":"tenant","name":"` + name + `","named":[{"name":"nvidia.com/gpu=0"}]}`
	}
	writeFile(t, state, []byte(`{"version":1,"pods":[`+held("a")+`,`+held("b")+`]}`))
	p, hook := loggedAtStart(t, "policy: {exclusive: true}", plugin.WithSpecDirs([]string{gpuSpecDir(t, 1)}), plugin.WithStateFile(state))
	var pods []*api.PodSandbox
	var ctrs []*api.Container
	for _, name := range []string{"a", "b"} {
		pod := gpuPod(name, nil)
		c := ctrOf(pod, map[string]string{plugin.DevicesAnnotation: "nvidia.com/gpu=0"})
		c.Linux.Devices = []*api.LinuxDevice{{Path: "/dev/nvidia0", Type: "c", Major: 195, Minor: 0}}
		pods, ctrs = append(pods, pod), append(ctrs, c)
	}
	if _, err := p.Synchronize(context.Background(), pods, ctrs); err != nil {
		t.Fatal(err)
	}
	if len(entries(hook, logrus.WarnLevel, "restored holdings conflict")) != 1 {
		t.Errorf("the conflict is not logged: %v", hook.AllEntries())
	}
	if held := entries(hook, logrus.InfoLevel, "restored devices held by pod"); len(held) != 2 {
		t.Errorf("restored %v, want both pods holding GPU 0", held)
	}
}

// TestLifecycleLogs: the log says what a decision did, once: devices
// released only for a pod that held some; annotations removed from a
// container that asked for nothing said as a warning, nothing said at
// info for one that had none.
func TestLifecycleLogs(t *testing.T) {
	p, hook := logged(t, "", plugin.WithSpecDirs([]string{gpuSpecDir(t, 1)}))
	ctx := context.Background()
	holder := gpuPod("holder", map[string]string{"gpus.nri-gpu.io": "0"})
	if _, _, err := p.CreateContainer(ctx, holder, ctrOf(holder, nil)); err != nil {
		t.Fatal(err)
	}
	plain := gpuPod("plain", nil)
	adj, _, err := p.CreateContainer(ctx, plain, ctrOf(plain, nil))
	if err != nil || adj != nil {
		t.Errorf("a container asking for nothing: %v, %v; want no adjustment", adj, err)
	}
	forged := gpuPod("forged", nil)
	adj, _, err = p.CreateContainer(ctx, forged, ctrOf(forged, map[string]string{plugin.DevicesAnnotation: "nvidia.com/gpu=0"}))
	if err != nil || adj == nil {
		t.Fatalf("a container with a forged annotation: %v, %v", adj, err)
	}
	if w := entries(hook, logrus.WarnLevel, "no devices requested; removed the annotations"); len(w) != 1 || w[0].Data["pod"] != "forged" {
		t.Errorf("warnings about removed annotations: %v", w)
	}
	for _, pod := range []*api.PodSandbox{plain, holder} {
		if err := p.StopPodSandbox(ctx, pod); err != nil {
			t.Fatal(err)
		}
	}
	if r := entries(hook, logrus.InfoLevel, "released devices"); len(r) != 1 || r[0].Data["pod"] != "holder" {
		t.Errorf("released: %v, want pod holder's only", r)
	}
	if inj := entries(hook, logrus.InfoLevel, "injected devices"); len(inj) != 1 || inj[0].Data["topologyScore"] != nil {
		t.Errorf("injected: %v, want one line without a topology score (no topology known)", inj)
	}
}

// TestTopologyAndHealthLogs: a count request chosen by topology logs the
// set's score; a GPU turning unhealthy is a warning, its recovery an
// info line.
func TestTopologyAndHealthLogs(t *testing.T) {
	specDir := gpuSpecDir(t, 4)
	s := testutil.NVML(4)
	for i, d := range s.Devices {
		dev := d.(*dgxa100.Device)
		dev.GetTopologyCommonAncestorFunc = func(o nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) {
			if j := slices.Index(s.Devices, o); i%2 == j%2 {
				return nvml.TOPOLOGY_NODE, nvml.SUCCESS
			}
			return nvml.TOPOLOGY_SYSTEM, nvml.SUCCESS
		}
	}
	events := testutil.NVMLEvents(s)
	p, hook := logged(t, "healthInterval: 20ms\nhealthRecoverAfter: 100ms\n", plugin.WithSpecDirs([]string{specDir}), plugin.WithNVML(s))
	pod := gpuPod("pair", map[string]string{"gpu-count.nri-gpu.io": "2"})
	if _, _, err := p.CreateContainer(context.Background(), pod, ctrOf(pod, nil)); err != nil {
		t.Fatal(err)
	}
	if inj := entries(hook, logrus.InfoLevel, "injected devices"); len(inj) != 1 || inj[0].Data["topologyScore"] != nvidia.ScoreNUMA {
		t.Errorf("injected: %v, want the pair's score %d", inj, nvidia.ScoreNUMA)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		_ = p.Serve(ctx, stub.WithSocketPath(filepath.Join(testutil.ShortDir(t), "no-runtime.sock")), stub.WithPluginName("nri-gpu"), stub.WithPluginIdx("10"))
	}()
	testutil.Within(t, 5*time.Second, "the health watch", func() bool { return len(entries(hook, logrus.InfoLevel, "watching the health")) == 1 })
	events <- nvml.EventData{Device: s.Devices[3], EventType: nvml.EventTypeXidCriticalError, EventData: 79}
	testutil.Within(t, 5*time.Second, "the GPU's trouble and recovery logged", func() bool {
		return len(entries(hook, logrus.WarnLevel, "GPU unhealthy")) == 1 && len(entries(hook, logrus.InfoLevel, "GPU healthy again")) == 1
	})
	if w := entries(hook, logrus.WarnLevel, "GPU unhealthy"); w[0].Data["gpu"] != specs.NodeID("c", nvidia.Major, 3) || !strings.Contains(w[0].Message, "critical Xid error 79") {
		t.Errorf("the warning %q names %v, want GPU 3's node and the Xid", w[0].Message, w[0].Data["gpu"])
	}
}

// TestRuntimeDevicesHeld: every device the runtime injects itself (CRI
// CDI devices) is the pod's, beside the annotation's, which nri-gpu
// injects: another pod is refused each of them.
func TestRuntimeDevicesHeld(t *testing.T) {
	p, _ := logged(t, "policy: {exclusive: true}", plugin.WithSpecDirs([]string{gpuSpecDir(t, 3)}))
	pod := gpuPod("a", map[string]string{"gpus.nri-gpu.io": "1"})
	c := ctrOf(pod, nil)
	c.CDIDevices = []*api.CDIDevice{{Name: "nvidia.com/gpu=0"}, {Name: "nvidia.com/gpu=2"}}
	adj, _, err := p.CreateContainer(context.Background(), pod, c)
	if err != nil {
		t.Fatal(err)
	}
	if got := devicePaths(adj); !slices.Equal(got, []string{"/dev/nvidia1"}) {
		t.Errorf("injected %v, want GPU 1 only (the runtime injects GPUs 0 and 2)", got)
	}
	if got := adj.GetAnnotations()[plugin.DevicesAnnotation]; got != "nvidia.com/gpu=1,nvidia.com/gpu=0,nvidia.com/gpu=2" {
		t.Errorf("recorded %q, want all three GPUs", got)
	}
	for _, gpu := range []string{"0", "1", "2"} {
		other := gpuPod("other-"+gpu, map[string]string{"gpus.nri-gpu.io": gpu})
		_, _, err := p.CreateContainer(context.Background(), other, ctrOf(other, nil))
		testutil.ErrorSays(t, err, "is held by pod tenant/a")
	}
}

// TestStateFileUnwritable: nri-gpu does not start on a state file whose
// directory cannot be made, and says which file and why.
func TestStateFileUnwritable(t *testing.T) {
	notADir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notADir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(notADir, "state.json")
	_, err := plugin.New(config.Default(), discard(), plugin.WithStateFile(state))
	testutil.ErrorSays(t, err, "state file "+state, "not a directory")
}

// TestDevicesHeldMetric: the devices-held metric follows what pods hold.
func TestDevicesHeldMetric(t *testing.T) {
	m := metrics.New()
	p, _ := logged(t, "", plugin.WithSpecDirs([]string{gpuSpecDir(t, 2)}), plugin.WithMetrics(m))
	pod := gpuPod("a", map[string]string{"gpus.nri-gpu.io": "0,1"})
	if _, _, err := p.CreateContainer(context.Background(), pod, ctrOf(pod, nil)); err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if !strings.Contains(rec.Body.String(), "nri_gpu_devices_held 2") {
		t.Errorf("metrics after two GPUs given:\n%s", rec.Body.String())
	}
}

// TestRequestsMetric: each request is counted once by its result: a
// container given one device or two is "injected", one that asked for
// none "none", one refused "denied".
func TestRequestsMetric(t *testing.T) {
	m := metrics.New()
	p, _ := logged(t, "policy: {exclusive: true}", plugin.WithSpecDirs([]string{gpuSpecDir(t, 3)}), plugin.WithMetrics(m))
	for i, ann := range []map[string]string{
		{"gpus.nri-gpu.io": "0"},
		{"gpus.nri-gpu.io": "1,2"},
		nil,
		{},
		{"gpus.nri-gpu.io": "0"}, // held by the first pod
	} {
		pod := gpuPod(fmt.Sprintf("pod-%d", i), ann)
		_, _, _ = p.CreateContainer(context.Background(), pod, ctrOf(pod, nil))
	}
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	for _, want := range []string{`nri_gpu_requests_total{result="injected"} 2`, `nri_gpu_requests_total{result="none"} 2`, `nri_gpu_requests_total{result="denied"} 1`} {
		if !strings.Contains(rec.Body.String(), want) {
			t.Errorf("no %s in the metrics:\n%s", want, rec.Body.String())
		}
	}
}

// TestMountOnlyCDIDevice: a device asked for by a cdi.k8s.io annotation
// whose edits have no node and no env (mounts only) cannot be told
// injected by the runtime, and is injected.
func TestMountOnlyCDIDevice(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "mnt.yaml"), []byte("cdiVersion: \"0.6.0\"\nkind: example.com/mnt\ndevices: [{name: \"0\", containerEdits: {mounts: [{hostPath: /opt/x, containerPath: /opt/x, options: [ro, bind]}]}}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p, _ := logged(t, "policy: {devices: ['example.com/mnt=*']}", plugin.WithSpecDirs([]string{dir}))
	pod := gpuPod("a", nil)
	adj, _, err := p.CreateContainer(context.Background(), pod, ctrOf(pod, map[string]string{"cdi.k8s.io/x": "example.com/mnt=0"}))
	if err != nil {
		t.Fatal(err)
	}
	if m := adj.GetMounts(); len(m) != 1 || m[0].Destination != "/opt/x" {
		t.Errorf("mounts %v, want /opt/x", m)
	}
}

// TestReconnectBackoff: with no runtime to connect to, the plugin tries
// again and again, each attempt numbered, the wait doubling.
func TestReconnectBackoff(t *testing.T) {
	p, hook := logged(t, "", plugin.WithSpecDirs([]string{gpuSpecDir(t, 1)}))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		_ = p.Serve(ctx, stub.WithSocketPath(filepath.Join(testutil.ShortDir(t), "none.sock")), stub.WithPluginName("nri-gpu"), stub.WithPluginIdx("10"))
	}()
	testutil.Within(t, 10*time.Second, "a third attempt", func() bool {
		return len(entries(hook, logrus.WarnLevel, "(attempt 3)")) == 1
	})
	for _, want := range []string{"reconnecting in 500ms (attempt 1)", "reconnecting in 1s (attempt 2)", "reconnecting in 2s (attempt 3)"} {
		if len(entries(hook, logrus.WarnLevel, want)) != 1 {
			t.Errorf("no warning %q", want)
		}
	}
}

// TestClaimLogs: a restart restores the prepared claims of the state file
// and logs each, warning of one the policy no longer gives; unpreparing
// a claim logs what it released, and a claim not prepared logs nothing.
func TestClaimLogs(t *testing.T) {
	dir := t.TempDir()
	specDir := gpuSpecDir(t, 2)
	state := filepath.Join(dir, "allocations.json")
	data := `{"version":1,"pods":[],"claims":[{"uid":"uid-c","namespace":"ns","name":"c","devices":[{"name":"nvidia.com/gpu=1","nodes":["c 195:1"]}]}]}`
	if err := os.WriteFile(state, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	p, hook := logged(t, "", plugin.WithSpecDirs([]string{specDir}), plugin.WithStateFile(state))
	if got := entries(hook, logrus.InfoLevel, "restored devices held by prepared DRA claim"); len(got) != 1 || got[0].Data["devices"] != "nvidia.com/gpu=1" {
		t.Errorf("restore logged %v", got)
	}
	if w := entries(hook, logrus.WarnLevel, ""); len(w) != 0 {
		t.Errorf("a clean restore warned: %v", w[0].Message)
	}
	_, narrow := loggedAtStart(t, `policy: {devices: ["nvidia.com/gpu=0"]}`, plugin.WithSpecDirs([]string{specDir}), plugin.WithRecord(state))
	if w := entries(narrow, logrus.WarnLevel, `claim ns/c holds "nvidia.com/gpu=1", which policy.devices does not allow`); len(w) != 1 {
		t.Errorf("a claim the policy no longer gives: warnings %v", narrow.AllEntries())
	}

	view := p.DRAView(config.Default().Start.DRA)
	hook.Reset()
	if err := view.Unprepare(context.Background(), "uid-unknown"); err != nil {
		t.Errorf("unpreparing a claim not prepared: %v", err)
	}
	if len(hook.AllEntries()) != 0 {
		t.Errorf("unpreparing a claim not prepared logged %v", hook.AllEntries()[0].Message)
	}
	if err := view.Unprepare(context.Background(), "uid-c"); err != nil {
		t.Fatal(err)
	}
	if got := entries(hook, logrus.InfoLevel, "released devices of DRA claim"); len(got) != 1 || got[0].Data["devices"] != "nvidia.com/gpu=1" {
		t.Errorf("unprepare logged %v", got)
	}
	saved, err := os.ReadFile(state)
	if err != nil || strings.Contains(string(saved), "uid-c") {
		t.Errorf("after unprepare the state file holds %s, %v", saved, err)
	}
}

// TestSynchronizeWithRecord: after a restart with its record intact, a
// pod's running container that nri-gpu created holds what the record
// says.
func TestSynchronizeWithRecord(t *testing.T) {
	specDir := gpuSpecDir(t, 3)
	state := filepath.Join(t.TempDir(), "state", "allocations.json")
	first, _ := logged(t, "policy: {exclusive: true}", plugin.WithSpecDirs([]string{specDir}), plugin.WithStateFile(state))
	if _, err := first.Synchronize(context.Background(), nil, nil); err != nil {
		t.Fatal(err)
	}
	live := gpuPod("live", map[string]string{"gpus.nri-gpu.io": "2"})
	ctr := ctrOf(live, nil)
	adj, _, err := first.CreateContainer(context.Background(), live, ctr)
	if err != nil {
		t.Fatal(err)
	}
	first.Close()

	ctr.Linux.Devices = adj.GetLinux().GetDevices()
	ctr.Annotations = adj.GetAnnotations()
	p, _ := loggedAtStart(t, "policy: {exclusive: true}", plugin.WithSpecDirs([]string{specDir}), plugin.WithStateFile(state))
	if _, err := p.Synchronize(context.Background(), []*api.PodSandbox{live}, []*api.Container{ctr}); err != nil {
		t.Fatal(err)
	}
	_, _, err = p.CreateContainer(context.Background(), gpuPod("other", map[string]string{"gpus.nri-gpu.io": "2"}), ctrOf(gpuPod("other", nil), nil))
	testutil.ErrorSays(t, err, `held by pod tenant/live`)
}
