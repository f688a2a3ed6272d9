package plugin_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
	"github.com/nri-gpu/nri-gpu/pkg/plugin"
)

// TestReloadChecked: a reload is checked as a start is, and one that is
// refused leaves the configuration in force serving: a spec directory
// that is a file, a change of what only a start reads (the device
// plugin's resources, DRA).
func TestReloadChecked(t *testing.T) {
	specDir := gpuSpecDir(t, 1)
	notADir := filepath.Join(t.TempDir(), "specs")
	writeFile(t, notADir, nil)
	inForce := "cdiSpecDirs: [" + specDir + "]\n"
	for _, tc := range []struct {
		name, yaml string
		want       []string
		startOnly  bool
	}{
		{"spec dir a file", "cdiSpecDirs: [" + specDir + ", " + notADir + "]\n", []string{"cdiSpecDirs", notADir, "not a directory"}, false},
		{"device plugin", inForce + "devicePlugin: {resources: [{name: nvidia.com/gpu, kind: nvidia.com/gpu}]}\n", []string{"devicePlugin", "restart nri-gpu"}, true},
		{"dra", inForce + "dra: {enabled: true, nodeName: n}\n", []string{"dra", "restart nri-gpu"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, _ := logged(t, inForce)
			next, err := config.Parse([]byte(tc.yaml))
			if err != nil {
				t.Fatal(err)
			}
			err = p.Reload(next)
			testutil.ErrorSays(t, err, tc.want...)
			if errors.Is(err, plugin.ErrStartOnly) != tc.startOnly {
				t.Errorf("%v: wraps ErrStartOnly %v, want %v", err, !tc.startOnly, tc.startOnly)
			}
			pod := gpuPod("a", map[string]string{"gpus.nri-gpu.io": "0"})
			if adj, _, err := p.CreateContainer(context.Background(), pod, ctrOf(pod, nil)); err != nil || len(devicePaths(adj)) != 1 {
				t.Errorf("after the refused reload: %v, %v; want GPU 0", devicePaths(adj), err)
			}
		})
	}
}

// TestReloadKeepsWhatPodsHold: after a new configuration whose
// policy.devices gives neither GPU, put in force by a reload or handed
// over by the runtime at Configure (the same checks either way), pod a
// (GPU 0 by name) and pod b (GPU 1 for a count) both keep theirs for
// their new containers, one way whatever the door; the change says so
// once per holding; a new pod is refused either GPU.
func TestReloadKeepsWhatPodsHold(t *testing.T) {
	const narrower = "policy: {devices: [\"example.com/*\"]}"
	for _, tc := range []struct {
		name string
		put  func(p *plugin.Plugin, specDir string) error
	}{
		{name: "reload", put: func(p *plugin.Plugin, specDir string) error {
			cfg, err := config.Parse([]byte(narrower + "\ncdiSpecDirs: [" + specDir + "]\n"))
			if err != nil {
				return err
			}
			return p.Reload(cfg)
		}},
		{name: "configuration from the runtime", put: func(p *plugin.Plugin, specDir string) error {
			_, err := p.Configure(context.Background(), narrower+"\ncdiSpecDirs: ["+specDir+"]\n", "containerd", "v1.7.35")
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			specDir := gpuSpecDir(t, 2)
			p, hook := logged(t, "cdiSpecDirs: ["+specDir+"]\n")
			a := gpuPod("a", map[string]string{"gpus.nri-gpu.io": "0"})
			b := gpuPod("b", map[string]string{"gpu-count.nri-gpu.io": "1"})
			create := func(pod *api.PodSandbox, id string) ([]string, error) {
				c := ctrOf(pod, nil)
				c.Id = id
				adj, _, err := p.CreateContainer(context.Background(), pod, c)
				return devicePaths(adj), err
			}
			for _, pod := range []*api.PodSandbox{a, b} {
				if _, err := create(pod, pod.Name+"1"); err != nil {
					t.Fatal(err)
				}
			}
			if err := tc.put(p, specDir); err != nil {
				t.Fatal(err)
			}
			said := entries(hook, logrus.WarnLevel, "would not give some pods what they hold")
			if len(said) != 1 {
				t.Fatalf("the change said %d times that pods keep what it would not give, want once", len(said))
			}
			for _, held := range []string{`pod tenant/a holds "nvidia.com/gpu=0"`, `pod tenant/b holds "nvidia.com/gpu=1"`} {
				if !strings.Contains(said[0].Message, held) {
					t.Errorf("the change's warning does not say %q:\n%s", held, said[0].Message)
				}
			}
			for _, tc := range []struct {
				pod  *api.PodSandbox
				want string
			}{{a, "/dev/nvidia0"}, {b, "/dev/nvidia1"}} {
				if got, err := create(tc.pod, tc.pod.Name+"2"); err != nil || !slices.Equal(got, []string{tc.want}) {
					t.Errorf("pod %s's new container: %v, %v; want %s, kept", tc.pod.Name, got, err, tc.want)
				}
			}
			for _, ann := range []map[string]string{{"gpus.nri-gpu.io": "0"}, {"gpus.nri-gpu.io": "1"}} {
				_, err := create(gpuPod("c", ann), "c")
				testutil.ErrorSays(t, err, "matches none of policy.devices")
			}
			if len(entries(hook, logrus.WarnLevel, "would not give some pods what they hold")) != 1 {
				t.Error("the kept holdings were said again at a request")
			}
		})
	}
}

// TestReady: the readiness probe's answer follows the connection: not
// ready before the runtime synchronized the plugin, ready once it did,
// not ready again once its connection is gone.
func TestReady(t *testing.T) {
	idle, _ := loggedAtStart(t, "")
	if err := idle.Ready(); !errors.Is(err, plugin.ErrNotReady) {
		t.Errorf("a plugin never connected: %v, want ErrNotReady", err)
	}
	r := runtimeSetUp(t, "v1.7.35", "", nil)
	testutil.Within(t, 5*time.Second, "ready once synchronized", func() bool { return r.plugin.Ready() == nil })
	r.stopPlugin()
	testutil.Within(t, 5*time.Second, "not ready once disconnected", func() bool { return errors.Is(r.plugin.Ready(), plugin.ErrNotReady) })
	testutil.ErrorSays(t, r.plugin.Ready(), "not registered with the runtime")
}

// registering is a DRA driver kubelet has registered when why is nil.
type registering struct {
	notified
	why atomic.Pointer[error]
}

func (r *registering) Registered(context.Context) error {
	if err := r.why.Load(); err != nil {
		return *err
	}
	return nil
}

// TestReadyWithDRA: with DRA, nri-gpu is ready only while kubelet has
// registered its DRA driver, and says why not.
func TestReadyWithDRA(t *testing.T) {
	d := &registering{notified: notified{&finder{}}}
	p, _ := logged(t, "", plugin.WithSpecDirs([]string{gpuSpecDir(t, 1)}), plugin.WithDRA(d))
	if err := p.Ready(); err != nil {
		t.Errorf("registered: %v", err)
	}
	why := fmt.Errorf("%w: kubelet refused its registration: no such version", link.ErrNotRegistered)
	d.why.Store(&why)
	err := p.Ready()
	testutil.ErrorSays(t, err, "the DRA driver", "kubelet refused its registration: no such version")
	if !errors.Is(err, plugin.ErrNotReady) || !errors.Is(err, link.ErrNotRegistered) {
		t.Errorf("%v: want ErrNotReady and the driver's ErrNotRegistered", err)
	}
}
