package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/policy"

	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// serveAt serves nri-gpu's device plugin of src's devices at path, as
// nri-gpu does for the relay, until the returned stop is called.
func serveAt(ctx context.Context, t *testing.T, path string, src Source) (stop func()) {
	t.Helper()
	np := New(gpu, filepath.Dir(path), config.CDIAnnotations, src, quiet())
	np.poll = 20 * time.Millisecond
	nctx, ncancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- np.ServeAt(nctx, path) }()
	return func() {
		ncancel()
		if err := <-done; err != nil {
			t.Errorf("ServeAt: %v", err)
		}
	}
}

// TestRelaySocketUnderUmask0: under umask 0, the relay's directory is
// nri-gpu's alone (0700) and its socket only its owner may connect to
// (0600): no other local user learns which GPUs are held or gets
// Allocate's answers.
func TestRelaySocketUnderUmask0(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	dir := filepath.Join(testutil.ShortDir(t), "relay")
	path := RelaySocket(dir, gpu.Name)
	stop := serveAt(context.Background(), t, path, &source{devs: []Device{{ID: "0", Healthy: true}}})
	defer stop()
	// Served: its socket listens (the kernel makes it before nri-gpu
	// sets its mode), and answers.
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	testutil.Within(t, 5*time.Second, "the relay socket answering", func() bool {
		_, err := api.NewDevicePluginClient(conn).GetDevicePluginOptions(context.Background(), &api.Empty{})
		return err == nil
	})
	for p, want := range map[string]os.FileMode{dir: 0o700, path: 0o600} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != want {
			t.Errorf("%s: %v, %v; want %v", p, fi.Mode(), err, want)
		}
	}
}

// TestRelay: the relay registers with kubelet and tells it the devices
// nri-gpu's device plugin tells (served at RelaySocket), and their
// changes; when nri-gpu's process goes away, kubelet's stream stays open,
// the devices stay as last told, Allocate answers as nri-gpu's would and
// a preferred allocation is kubelet's own order; once nri-gpu is back,
// its changes and its preferences reach kubelet again.
func TestRelay(t *testing.T) {
	relayDir, kubeletDir := testutil.ShortDir(t), testutil.ShortDir(t)
	path := RelaySocket(relayDir, gpu.Name)
	if filepath.Base(path) != "nvidia.com-gpu.sock" {
		t.Errorf("relay socket %s", path)
	}
	src := &source{devs: []Device{{ID: "0", Healthy: true}, {ID: "1", Healthy: true}, {ID: "2", Healthy: true}}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// nri-gpu's side.
	serveNRIGPU := func() (stop func()) { return serveAt(ctx, t, path, src) }
	// The relay's side, registering with kubelet once nri-gpu has told
	// its devices, as nri-gpu relay does: not before.
	up := NewUpstream(path, quiet())
	up.retry = 20 * time.Millisecond
	counted := &counting{Source: up}
	relay := New(gpu, kubeletDir, config.CDIAnnotations, counted, quiet())
	relay.poll = 20 * time.Millisecond
	regs := make(chan *api.RegisterRequest, 4)
	startKubelet(t, kubeletDir, regs)
	go up.Run(ctx, relay.Notify)
	go func() {
		<-up.Answered()
		_ = relay.Run(ctx)
	}()
	select {
	case <-regs:
		t.Fatal("the relay registered before nri-gpu told its devices")
	case <-time.After(200 * time.Millisecond):
	}
	stopNRIGPU := serveNRIGPU()
	r := registration(t, regs)
	conn, err := grpc.NewClient("unix://"+filepath.Join(kubeletDir, r.GetEndpoint()), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	kubelet := api.NewDevicePluginClient(conn)
	stream, err := kubelet.ListAndWatch(ctx, &api.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"0 Healthy", "1 Healthy", "2 Healthy"}
	if got := health(received(t, stream)); !slices.Equal(got, want) {
		t.Errorf("kubelet told first %v, want nri-gpu's %v", got, want)
	}
	src.set(Device{ID: "0", Healthy: true}, Device{ID: "1", Healthy: false}, Device{ID: "2", Healthy: true})
	if got := health(received(t, stream)); !slices.Equal(got, []string{"0 Healthy", "1 Unhealthy", "2 Healthy"}) {
		t.Errorf("after a change, kubelet told %v", got)
	}
	prefer := func() []string {
		resp, err := kubelet.GetPreferredAllocation(ctx, &api.PreferredAllocationRequest{ContainerRequests: []*api.ContainerPreferredAllocationRequest{
			{AvailableDeviceIDs: []string{"0", "2"}, AllocationSize: 1},
		}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetContainerResponses()[0].GetDeviceIDs()
	}
	if got := prefer(); !slices.Equal(got, []string{"2"}) {
		t.Errorf("preferred %v, want nri-gpu's choice [2]", got)
	}

	// nri-gpu goes away.
	stopNRIGPU()
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("nri-gpu's socket left behind: %v", err)
	}
	recvd := make(chan []*api.Device, 8)
	streamErr := make(chan error, 1)
	go func() {
		for {
			resp, err := stream.Recv()
			if err != nil {
				streamErr <- err
				return
			}
			recvd <- resp.GetDevices()
		}
	}()
	from := counted.looks.Load()
	testutil.Within(t, 10*time.Second, "twenty polls of the relay", func() bool { return counted.looks.Load() >= from+20 })
	select {
	case err := <-streamErr:
		t.Fatalf("kubelet's stream ended with nri-gpu away: %v", err)
	case devs := <-recvd:
		t.Errorf("kubelet told %v with nri-gpu away", health(devs))
	default:
	}
	resp, err := kubelet.Allocate(ctx, &api.AllocateRequest{ContainerRequests: []*api.ContainerAllocateRequest{{DevicesIds: []string{"2"}}}})
	if err != nil {
		t.Fatalf("Allocate with nri-gpu away: %v", err)
	}
	if got := resp.GetContainerResponses()[0].GetAnnotations(); got["cdi.k8s.io/nri-gpu_nvidia.com_gpu"] != "nvidia.com/gpu=2" {
		t.Errorf("Allocate with nri-gpu away: %v", got)
	}
	if got := prefer(); !slices.Equal(got, []string{"0"}) {
		t.Errorf("preferred with nri-gpu away %v, want kubelet's order [0]", got)
	}

	// nri-gpu is back, with a change.
	src.set(Device{ID: "0", Healthy: true}, Device{ID: "1", Healthy: true}, Device{ID: "2", Healthy: true})
	stopNRIGPU = serveNRIGPU()
	defer stopNRIGPU()
	select {
	case devs := <-recvd:
		if got := health(devs); !slices.Equal(got, want) {
			t.Errorf("nri-gpu back: kubelet told %v, want %v", got, want)
		}
	case err := <-streamErr:
		t.Fatal(err)
	case <-time.After(10 * time.Second):
		t.Fatal("nri-gpu back: kubelet was not told its devices")
	}
	testutil.Within(t, 10*time.Second, "nri-gpu's preferences again", func() bool { return slices.Equal(prefer(), []string{"2"}) })
}

// TestUpstreamAcrossOutages: nri-gpu served at a path whose directory
// does not exist yet (made private), then where a stale file is left; the
// relay says once per outage that nri-gpu does not answer, with why
// (also before nri-gpu first answers), and once per connection that it
// answers, however many lists follow.
func TestUpstreamAcrossOutages(t *testing.T) {
	dir := filepath.Join(testutil.ShortDir(t), "relay")
	path := RelaySocket(dir, gpu.Name)
	log, hook := logtest.NewNullLogger()
	log.SetLevel(logrus.DebugLevel)
	up := NewUpstream(path, log)
	up.retry = 10 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go up.Run(ctx, func() {})
	said := func(prefix string) int { return logged(hook, prefix) }
	// saidOnce waits until the relay has said it does not answer n times,
	// and checks it says no more over many tries.
	saidOnce := func(when string, n int) {
		t.Helper()
		testutil.Within(t, 10*time.Second, when+": said nri-gpu does not answer", func() bool { return said("nri-gpu's device plugin does not answer") >= n })
		from := said("trying nri-gpu's device plugin again")
		testutil.Within(t, 10*time.Second, when+": twenty tries more", func() bool { return said("trying nri-gpu's device plugin again") >= from+20 })
		if got := said("nri-gpu's device plugin does not answer"); got != n {
			t.Errorf("%s: said %d times that nri-gpu does not answer, want %d", when, got, n)
		}
	}
	saidOnce("before nri-gpu answered", 1)
	for _, e := range hook.AllEntries() {
		if strings.Contains(e.Message, "<nil>") || !strings.Contains(e.Message, "Unavailable") {
			t.Errorf("said %q: want why (gRPC's Unavailable)", e.Message)
		}
	}

	src := &source{devs: []Device{{ID: "0", Healthy: true}}}
	serve := func() func() { return serveAt(ctx, t, path, src) }
	// Its directory is not there yet.
	stop := serve()
	select {
	case <-up.Answered():
	case <-time.After(10 * time.Second):
		t.Fatal("nri-gpu served in a directory not there before: the relay was not answered")
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("the relay directory made: %v %v, want mode 0700", fi, err)
	}
	for _, h := range []bool{false, true, false} {
		src.set(Device{ID: "0", Healthy: h})
		testutil.Within(t, 10*time.Second, "the list passed on", func() bool { return slices.Equal(up.Devices(), []Device{{ID: "0", Healthy: h}}) })
	}
	if n := said("nri-gpu's device plugin answers"); n != 1 {
		t.Errorf("said %d times that nri-gpu answers, over one connection", n)
	}
	stop()
	saidOnce("the first outage", 2)

	// A second outage, after nri-gpu answered again over a stale file
	// left at the path.
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	stop = serve()
	testutil.Within(t, 10*time.Second, "nri-gpu answers again", func() bool { return said("nri-gpu's device plugin answers") == 2 })
	stop()
	saidOnce("the second outage", 3)
}

// TestRelayAllot: the relay asks nri-gpu to agree to kubelet's
// allocation and refuses what nri-gpu's admission denies, in its words;
// what nri-gpu cannot tell yet (restoring), or an nri-gpu away, leaves
// the allocation to kubelet, judged when the container is created.
func TestRelayAllot(t *testing.T) {
	denied := fmt.Errorf("%w: device \"nvidia.com/gpu=0\" is held by pod ns/counted", policy.ErrDenied)
	for _, tc := range []struct {
		name    string
		refuse  error
		away    bool
		wantErr string
	}{
		{name: "agreed"},
		{name: "denied", refuse: denied, wantErr: "nri-gpu's device plugin refuses it: nvidia.com/gpu: kubelet chose 0, 1: denied by policy: device \"nvidia.com/gpu=0\" is held by pod ns/counted"},
		{name: "restoring", refuse: errors.New("nri-gpu is restoring what pods hold")},
		{name: "nri-gpu away", away: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := RelaySocket(filepath.Join(testutil.ShortDir(t), "relay"), gpu.Name)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			src := &allotting{source: &source{devs: []Device{{ID: "0", Healthy: true}, {ID: "1", Healthy: true}}}, refuse: tc.refuse}
			stop := serveAt(ctx, t, path, src)
			up := NewUpstream(path, quiet())
			go up.Run(ctx, func() {})
			<-up.Answered()
			if tc.away {
				stop()
				testutil.Within(t, 10*time.Second, "the relay seeing nri-gpu gone", func() bool {
					up.mu.Lock()
					defer up.mu.Unlock()
					return up.client == nil
				})
			} else {
				defer stop()
			}
			relay := New(gpu, testutil.ShortDir(t), config.CDIAnnotations, up, quiet())
			got, err := relay.Allocate(ctx, &api.AllocateRequest{ContainerRequests: []*api.ContainerAllocateRequest{{DevicesIds: []string{"0", "1"}}}})
			if tc.wantErr != "" {
				testutil.ErrorSays(t, err, tc.wantErr)
				return
			}
			if err != nil || len(got.GetContainerResponses()) != 1 {
				t.Fatalf("%v, %v: want an answer", got, err)
			}
			if want := [][]string{{"0", "1"}}; !tc.away && !slices.EqualFunc(src.allotted(), want, slices.Equal) {
				t.Errorf("nri-gpu told %v, want %v", src.allotted(), want)
			}
		})
	}
}

// TestLater: a device plugin made before the view it serves offers no
// device and prefers in kubelet's order until the view is set, then asks
// it; a second view set is not asked.
func TestLater(t *testing.T) {
	var l Later
	if got := l.Devices(); len(got) > 0 {
		t.Errorf("before its view: %v, want no device", got)
	}
	if got := l.Preferred([]string{"0", "1", "2"}, []string{"2"}, 2); !slices.Equal(got, []string{"2", "0"}) {
		t.Errorf("preferred before its view: %v, want kubelet's order after mustInclude", got)
	}
	src := &source{devs: []Device{{ID: "1", Healthy: true}}}
	l.Set(src)
	l.Set(&source{devs: []Device{{ID: "9"}}})
	if got := l.Devices(); !slices.Equal(got, src.devs) {
		t.Errorf("with its view: %v, want %v", got, src.devs)
	}
	if got := l.Preferred([]string{"0", "1", "2"}, nil, 1); !slices.Equal(got, []string{"2"}) {
		t.Errorf("preferred with its view: %v, want the view's choice (the last available)", got)
	}
}

// TestLaterRestored: a Later is restored when its view is, and at once
// where there is no view or the view is never restoring.
func TestLaterRestored(t *testing.T) {
	isClosed := func(c <-chan struct{}) bool {
		select {
		case <-c:
			return true
		default:
			return false
		}
	}
	var none, plain, restoring Later
	if !isClosed(none.Restored()) {
		t.Error("with no view: not restored")
	}
	plain.Set(&source{})
	if !isClosed(plain.Restored()) {
		t.Error("with a view that is never restoring: not restored")
	}
	view := &restoringSource{done: make(chan struct{})}
	restoring.Set(view)
	if isClosed(restoring.Restored()) {
		t.Error("restored before its view is")
	}
	close(view.done)
	if !isClosed(restoring.Restored()) {
		t.Error("not restored once its view is")
	}
}

// restoringSource is a source restored once done is closed.
type restoringSource struct {
	source
	done chan struct{}
}

func (r *restoringSource) Restored() <-chan struct{} { return r.done }
