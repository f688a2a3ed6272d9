package plugin_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"google.golang.org/grpc"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

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
			go func() { _ = door.ListAndWatch(&api.Empty{}, stream) }()
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

func (s *listAndWatch) Send(r *api.ListAndWatchResponse) error {
	s.once.Do(func() { close(s.asked) })
	var devs []deviceplugin.Device
	for _, d := range r.GetDevices() {
		devs = append(devs, deviceplugin.Device{ID: d.GetID(), Healthy: d.GetHealth() == api.Healthy})
	}
	s.told <- deviceplugin.Describe(devs)
	return nil
}
