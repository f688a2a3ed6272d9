package plugin_test

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/plugin"
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

// pluginCount signals each change of the runtime's plugin count.
type pluginCount struct {
	adaptation.Metrics
	ch chan int
}

func (m pluginCount) UpdatePluginCount(n int) {
	select {
	case m.ch <- n:
	default: // nobody waits any more
	}
}

// runtime starts NRI's real runtime side on a socket in a temp dir and
// connects nri-gpu to it with the given configuration.
func runtime(t *testing.T, cfgYAML string) *adaptation.Adaptation {
	t.Helper()
	dir := t.TempDir()
	specDir := filepath.Join(dir, "cdi")
	if err := os.MkdirAll(specDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(specDir, "gpu.yaml"), []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(dir, "nri.sock")
	counts := pluginCount{Metrics: noMetrics{}, ch: make(chan int, 4)}
	syncFn := func(ctx context.Context, cb adaptation.SyncCB) error {
		_, err := cb(ctx, nil, nil)
		return err
	}
	update := func(context.Context, []*adaptation.ContainerUpdate) ([]*adaptation.ContainerUpdate, error) {
		return nil, nil
	}
	r, err := adaptation.New("containerd", "v1.7.35", syncFn, update,
		adaptation.WithSocketPath(socket),
		adaptation.WithPluginPath(filepath.Join(dir, "plugins")),
		adaptation.WithPluginConfigPath(filepath.Join(dir, "conf.d")),
		adaptation.WithMetrics(counts))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)

	cfg, err := config.Parse([]byte(cfgYAML))
	if err != nil {
		t.Fatal(err)
	}
	log := logrus.New()
	log.SetOutput(io.Discard)
	p, err := plugin.New(cfg, []string{specDir}, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	s, err := stub.New(p, stub.WithSocketPath(socket), stub.WithPluginName("nri-gpu"), stub.WithPluginIdx("10"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = s.Run(ctx) }()
	t.Cleanup(func() { cancel(); wg.Wait() })

	for registered := false; !registered; {
		select {
		case n := <-counts.ch:
			registered = n > 0
		case <-time.After(10 * time.Second):
			t.Fatal("nri-gpu did not register with the runtime")
		}
	}
	return r
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

func TestCreateContainerOverNRI(t *testing.T) {
	tests := []struct {
		name        string
		config      string
		podAnn      map[string]string
		ctrAnn      map[string]string
		wantDevices []string
		wantErr     []string
	}{
		{
			name:        "pod annotation",
			podAnn:      map[string]string{"gpus.nri-gpu.io": "0"},
			wantDevices: []string{"/dev/nvidia0"},
		},
		{
			name:        "container-scoped pod annotation wins",
			podAnn:      map[string]string{"gpus.nri-gpu.io": "0", "gpus.nri-gpu.io/container.main": "1"},
			wantDevices: []string{"/dev/nvidia1"},
		},
		{
			name:        "pod and cdi.k8s.io requests merged",
			podAnn:      map[string]string{"gpus.nri-gpu.io": "0"},
			ctrAnn:      map[string]string{"cdi.k8s.io/dp": "nvidia.com/gpu=1,nvidia.com/gpu=0"},
			wantDevices: []string{"/dev/nvidia0", "/dev/nvidia1"},
		},
		{
			name:   "cdi.k8s.io ignored when honorCDIAnnotations is false",
			config: "honorCDIAnnotations: false",
			ctrAnn: map[string]string{"cdi.k8s.io/dp": "nvidia.com/gpu=1"},
		},
		{
			name:   "no request, no adjustment",
			podAnn: map[string]string{"other": "0"},
		},
		{
			name:        "all with allowAll",
			config:      "policy: {allowAll: true}",
			podAnn:      map[string]string{"gpus.nri-gpu.io": "all"},
			wantDevices: []string{"/dev/nvidia0", "/dev/nvidia1"},
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
			rpl, err := r.CreateContainer(context.Background(), createRequest(tc.podAnn, tc.ctrAnn))
			if len(tc.wantErr) > 0 {
				if err == nil {
					t.Fatalf("got %v, want an error", rpl)
				}
				for _, w := range tc.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not say %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := devicePaths(rpl.GetAdjust())
			if strings.Join(got, ",") != strings.Join(tc.wantDevices, ",") {
				t.Errorf("devices %v, want %v", got, tc.wantDevices)
			}
			hasEnv := len(rpl.GetAdjust().GetEnv()) > 0
			if hasEnv != (len(tc.wantDevices) > 0) {
				t.Errorf("env %v with devices %v: spec-level edits must come with the devices, and only then", rpl.GetAdjust().GetEnv(), got)
			}
		})
	}
}

func TestConfigureFromRuntime(t *testing.T) {
	log := logrus.New()
	log.SetOutput(io.Discard)
	p, err := plugin.New(config.Default(), []string{t.TempDir()}, log)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := p.Configure(context.Background(), "defaultKind: example.com/fpga\nunsupportedEdits: warn\n", "containerd", "1.7.35"); err != nil {
		t.Fatal(err)
	}
	if got := p.Config(); got.DefaultKind != "example.com/fpga" || got.UnsupportedEdits != config.UnsupportedWarn {
		t.Errorf("configuration from the runtime not applied: %+v", got)
	}
	_, err = p.Configure(context.Background(), "bogus: 1\n", "containerd", "1.7.35")
	if err == nil || !strings.Contains(err.Error(), "bogus") {
		t.Errorf("unknown key from the runtime: error %v, want one naming the key", err)
	}
	if got := p.Config(); got.DefaultKind != "example.com/fpga" {
		t.Error("a rejected configuration replaced the one in force")
	}
}
