package plugin_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"google.golang.org/grpc"
	dpapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/deviceplugin"
	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
	"github.com/nri-gpu/nri-gpu/pkg/plugin"
)

// TestNoDoorBeforeRestore: a restarted nri-gpu, and one taking over from
// another, serve nothing from the pool until the runtime's Synchronize
// has put in it what the record and the running containers say is held.
// A pod holds GPU 0 exclusively through NRI's real runtime side; then,
// between the new nri-gpu's start and its Synchronize, each door is
// asked: the device plugin tells kubelet nothing until then, the DRA
// slice's offers and a DRA prepare wait (bounded inside their caller's
// deadline) and are refused as ErrRestoring, an NRI request too; a DRA
// prepare for GPU 0 still waiting when the runtime synchronizes is
// refused as GPU 0's holder forbids, not given beside it. After it, the
// doors answer from the restored pool: GPU 0 unhealthy and not offered,
// GPU 1 healthy and offered.
func TestNoDoorBeforeRestore(t *testing.T) {
	const cfg = `policy: {exclusive: true, namespaces: [tenant], devices: ["*/*"]}`
	res := config.Resource{Name: "nvidia.com/gpu", Kind: "nvidia.com/gpu", Devices: []string{"*"}}
	dra := config.Default().Start.DRA
	for _, edge := range []string{"restart", "take-over"} {
		t.Run(edge, func(t *testing.T) {
			r := runtime(t, cfg)
			holder := gpuPod("a", map[string]string{"gpus.nri-gpu.io": "0"})
			if _, err := r.create(holder, ctrOf(holder, nil)); err != nil {
				t.Fatal(err)
			}
			next := startNext(t, r, cfg, edge)

			// Kubelet asks the device plugin (ListAndWatch): it is told
			// nothing until the restore, then what the restore says.
			told := make(chan string, 8)
			asked := make(chan struct{})
			stream := &listAndWatch{ctx: t.Context(), asked: asked, told: told}
			door := deviceplugin.New(res, t.TempDir(), config.CDIAnnotations, next.Resource(res), quiet())
			go func() { _ = door.ListAndWatch(&dpapi.Empty{}, stream) }()
			<-asked
			short, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			if _, err := next.DRAView(dra).Devices(short); !errors.Is(err, plugin.ErrRestoring) {
				t.Errorf("the DRA slice's offers before the restore: %v, want ErrRestoring", err)
			}
			other := gpuPod("b", map[string]string{"gpus.nri-gpu.io": "1"})
			if _, _, err := next.CreateContainer(context.Background(), other, ctrOf(other, nil)); !errors.Is(err, plugin.ErrRestoring) {
				t.Errorf("an NRI request before the restore: %v, want ErrRestoring", err)
			}
			gpu0 := []link.Allocated{{CDI: "nvidia.com/gpu=0", Requests: []string{"gpu"}}}
			if err := next.DRAView(dra).Prepare(short, claimC, gpu0); !errors.Is(err, plugin.ErrRestoring) {
				t.Errorf("a DRA prepare past its bound: %v, want ErrRestoring", err)
			}
			// Kubelet's deadline (45 s) leaves it restoreWait.
			waiting := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
				defer cancel()
				waiting <- next.DRAView(dra).Prepare(ctx, claimC, gpu0)
			}()

			r.stopPlugin = r.serve(t, next)
			if got := <-told; got != "0 unhealthy, 1 healthy" {
				t.Errorf("the device plugin's first answer: %q, want GPU 0 unhealthy (held), GPU 1 healthy", got)
			}
			select {
			case err := <-waiting:
				if err == nil || errors.Is(err, plugin.ErrRestoring) {
					t.Fatalf("a DRA prepare for GPU 0 waiting across the restore: %v, want it refused for pod tenant/a", err)
				}
				testutil.ErrorSays(t, err, "tenant/a")
			case <-time.After(15 * time.Second):
				t.Fatal("a DRA prepare waiting for the restore did not end")
			}
			offered, err := next.DRAView(dra).Devices(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, d := range offered {
				names = append(names, d.CDI)
			}
			if len(names) != 1 || names[0] != "nvidia.com/gpu=1" {
				t.Errorf("the DRA slice's offers once restored: %v, want GPU 1 alone", names)
			}
		})
	}
}

// startNext starts the nri-gpu that follows the one serving r, not yet
// connected: after it stopped (a restart), or waiting for it to let the
// record go, then taking over.
func startNext(t *testing.T, r *testRuntime, cfg, edge string) *plugin.Plugin {
	t.Helper()
	if edge == "restart" {
		r.stopPlugin()
		return r.build(t, cfg)
	}
	log, hook := logtest.NewNullLogger()
	built := make(chan *plugin.Plugin, 1)
	go func() { built <- r.buildLogged(t, cfg, log, plugin.WithTakeOver(t.Context())) }()
	testutil.Within(t, 10*time.Second, "the next nri-gpu waiting to take over", func() bool {
		return len(entries(hook, logrus.InfoLevel, "is held by another nri-gpu")) > 0
	})
	r.stopPlugin()
	select {
	case p := <-built:
		t.Cleanup(p.Close)
		return p
	case <-time.After(10 * time.Second):
		t.Fatal("did not take over once the record was let go")
	}
	return nil
}

// listAndWatch is kubelet's end of a ListAndWatch stream, in process:
// asked is closed when the device plugin first looks at the stream (it
// has begun answering), told gets each list it sends.
type listAndWatch struct {
	grpc.ServerStream
	ctx   context.Context
	once  sync.Once
	asked chan struct{}
	told  chan string
}

func (s *listAndWatch) Context() context.Context {
	s.once.Do(func() { close(s.asked) })
	return s.ctx
}

func (s *listAndWatch) Send(r *dpapi.ListAndWatchResponse) error {
	s.once.Do(func() { close(s.asked) })
	var devs []deviceplugin.Device
	for _, d := range r.GetDevices() {
		devs = append(devs, deviceplugin.Device{ID: d.GetID(), Healthy: d.GetHealth() == dpapi.Healthy})
	}
	s.told <- deviceplugin.Describe(devs)
	return nil
}

// TestFoundJudgedLikeNew: the containers a restarted nri-gpu finds
// running (through NRI's real runtime side, its record kept) are
// requests like any other. One the runtime created while nri-gpu was
// away is judged by the admission against what the other pods hold: it
// is stopped, with the reason, when it has a GPU another pod holds
// exclusively, or is the second of its pod past policy.maxDevicesPerPod
// (the first created is judged first). A privileged container nri-gpu
// gave GPU 0, which sees every GPU's node, holds GPU 0 alone; a
// container bearing nri-gpu's annotation on a pod the record does not
// have (forged) holds nothing it names: another pod is given GPU 1.
func TestFoundJudgedLikeNew(t *testing.T) {
	gpuNodes := func(gpus ...int) []*api.LinuxDevice {
		var out []*api.LinuxDevice
		for _, g := range gpus {
			out = append(out, &api.LinuxDevice{Path: fmt.Sprintf("/dev/nvidia%d", g), Type: "c", Major: 1, Minor: []int64{3, 5}[g]})
		}
		return out
	}
	away := func(r *testRuntime, pod *api.PodSandbox, name string, at int64, ann map[string]string, gpus ...int) *api.Container {
		c := &api.Container{Id: pod.Name + "-" + name, PodSandboxId: pod.Id, Name: name, Annotations: ann, CreatedAt: at,
			State: api.ContainerState_CONTAINER_RUNNING, Linux: &api.LinuxContainer{Devices: gpuNodes(gpus...)}}
		r.mu.Lock()
		defer r.mu.Unlock()
		r.pods[pod.Id] = pod
		r.containers = append(r.containers, c)
		return c
	}
	const kubelet = "cdi.k8s.io/nri-gpu_nvidia.com-gpu"
	for _, tc := range []struct {
		name string
		cfg  string
		// setUp makes the node nri-gpu finds; it returns the containers
		// to be stopped, with words of why.
		setUp func(t *testing.T, r *testRuntime) map[string]string
		// free is a GPU another pod is then given.
		free string
	}{{
		name: "a GPU another pod holds exclusively",
		cfg:  "policy: {exclusive: true}",
		setUp: func(t *testing.T, r *testRuntime) map[string]string {
			holder := gpuPod("a", map[string]string{"gpus.nri-gpu.io": "0"})
			if _, err := r.create(holder, ctrOf(holder, nil)); err != nil {
				t.Fatal(err)
			}
			c := away(r, gpuPod("away", nil), "c", 1, map[string]string{kubelet: "nvidia.com/gpu=0"}, 0)
			return map[string]string{c.Id: "held by pod tenant/a"}
		},
		free: "1",
	}, {
		name: "the second container of a pod past maxDevicesPerPod",
		cfg:  "policy: {exclusive: true, maxDevicesPerPod: 1}",
		setUp: func(t *testing.T, r *testRuntime) map[string]string {
			pod := gpuPod("two", nil)
			second := away(r, pod, "second", 20, map[string]string{kubelet: "nvidia.com/gpu=1"}, 1)
			away(r, pod, "first", 10, map[string]string{kubelet: "nvidia.com/gpu=0"}, 0)
			return map[string]string{second.Id: "maxDevicesPerPod"}
		},
		free: "1",
	}, {
		name: "a privileged container sees every GPU",
		cfg:  "policy: {exclusive: true}",
		setUp: func(t *testing.T, r *testRuntime) map[string]string {
			priv := gpuPod("priv", map[string]string{"gpus.nri-gpu.io": "0"})
			if _, err := r.create(priv, ctrOf(priv, nil)); err != nil {
				t.Fatal(err)
			}
			r.mu.Lock()
			defer r.mu.Unlock()
			r.containers[len(r.containers)-1].Linux.Devices = gpuNodes(0, 1) // as the runtime gives a privileged one
			return nil
		},
		free: "1",
	}, {
		name: "a forged annotation",
		cfg:  "policy: {exclusive: true}",
		setUp: func(t *testing.T, r *testRuntime) map[string]string {
			away(r, gpuPod("forged", nil), "c", 1, map[string]string{plugin.DevicesAnnotation: "nvidia.com/gpu=1"}, 1)
			return nil
		},
		free: "1",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			r := runtime(t, tc.cfg)
			want := tc.setUp(t, r)
			r.stopPlugin()
			log, hook := logtest.NewNullLogger()
			next := r.buildLogged(t, tc.cfg, log)
			var mu sync.Mutex
			stopped := map[string]bool{}
			next.StopWith(func(c *api.Container) error {
				mu.Lock()
				defer mu.Unlock()
				stopped[c.GetId()] = true
				return nil
			})
			r.stopPlugin = r.serve(t, next)
			mu.Lock()
			for id := range stopped {
				if _, ok := want[id]; !ok {
					t.Errorf("stopped %s; want it left running", id)
				}
			}
			for id, why := range want {
				if !stopped[id] {
					t.Errorf("%s left running; want it stopped", id)
				}
				said := false
				for _, e := range entries(hook, logrus.WarnLevel, "stopped the container, to be created again through nri-gpu") {
					said = said || strings.Contains(e.Message, why) && strings.HasSuffix(id, "-"+e.Data["container"].(string))
				}
				if !said {
					t.Errorf("%s: no log says it was stopped because %q: %v", id, why, hook.AllEntries())
				}
			}
			mu.Unlock()
			other := gpuPod("other", map[string]string{"gpus.nri-gpu.io": tc.free})
			if _, err := r.create(other, ctrOf(other, nil)); err != nil {
				t.Errorf("GPU %s for another pod: %v", tc.free, err)
			}
		})
	}
}
