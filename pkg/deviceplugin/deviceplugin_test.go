package deviceplugin

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/policy"

	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// source is a Source whose devices the test sets.
type source struct {
	mu   sync.Mutex
	devs []Device
	// looks counts the calls of Devices.
	looks int
}

func (s *source) Devices() []Device {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.looks++
	return slices.Clone(s.devs)
}

// looked returns how often Devices was called.
func (s *source) looked() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.looks
}

// counting is a Source whose looks are counted.
type counting struct {
	Source
	looks atomic.Int32
}

func (c *counting) Devices() []Device { c.looks.Add(1); return c.Source.Devices() }

func (s *source) set(devs ...Device) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.devs = devs
}

func (s *source) Preferred(available, mustInclude []string, size int) []string {
	// The test's choice: must-include, then the available from the end.
	out := slices.Clone(mustInclude)
	for i := len(available) - 1; i >= 0 && len(out) < size; i-- {
		if !slices.Contains(out, available[i]) {
			out = append(out, available[i])
		}
	}
	return out
}

func quiet() logrus.FieldLogger {
	l := logrus.New()
	l.SetOutput(os.Stderr)
	l.SetLevel(logrus.WarnLevel)
	return l
}

var gpu = config.Resource{Name: "nvidia.com/gpu", Kind: "nvidia.com/gpu"}

func TestAllocate(t *testing.T) {
	src := &source{devs: []Device{{ID: "0", Healthy: true}, {ID: "1", Healthy: true}, {ID: "2::0", Healthy: true}, {ID: "2::1", Healthy: true}, {ID: "3::0", Healthy: true}}}
	tests := []struct {
		name    string
		mode    config.CDIDevices
		ids     [][]string
		want    *api.AllocateResponse
		wantErr error
	}{
		{
			name: "annotations", mode: config.CDIAnnotations, ids: [][]string{{"1", "0"}, {"0"}},
			want: &api.AllocateResponse{ContainerResponses: []*api.ContainerAllocateResponse{
				{Annotations: map[string]string{"cdi.k8s.io/nri-gpu_nvidia.com_gpu": "nvidia.com/gpu=1,nvidia.com/gpu=0"}},
				{Annotations: map[string]string{"cdi.k8s.io/nri-gpu_nvidia.com_gpu": "nvidia.com/gpu=0"}},
			}},
		},
		{
			name: "CRI CDI devices", mode: config.CDICRI, ids: [][]string{{"1"}},
			want: &api.AllocateResponse{ContainerResponses: []*api.ContainerAllocateResponse{
				{CdiDevices: []*api.CDIDevice{{Name: "nvidia.com/gpu=1"}}},
			}},
		},
		{
			name: "an annotation only nri-gpu reads", mode: config.CDINRIGPU, ids: [][]string{{"1", "0"}, {"2::1"}},
			want: &api.AllocateResponse{ContainerResponses: []*api.ContainerAllocateResponse{
				{Annotations: map[string]string{"devices.nri-gpu.io/nvidia.com_gpu": "nvidia.com/gpu=1,nvidia.com/gpu=0"}},
				{Annotations: map[string]string{"devices.nri-gpu.io/nvidia.com_gpu": "nvidia.com/gpu=2"}},
			}},
		},
		{name: "a device the resource does not offer", mode: config.CDIAnnotations, ids: [][]string{{"0"}, {"7"}}, wantErr: ErrUnknownDevice},
		{
			name: "replicas of shared devices are their devices", mode: config.CDIAnnotations, ids: [][]string{{"2::1", "3::0"}, {"2::0"}},
			want: &api.AllocateResponse{ContainerResponses: []*api.ContainerAllocateResponse{
				{Annotations: map[string]string{"cdi.k8s.io/nri-gpu_nvidia.com_gpu": "nvidia.com/gpu=2,nvidia.com/gpu=3"}},
				{Annotations: map[string]string{"cdi.k8s.io/nri-gpu_nvidia.com_gpu": "nvidia.com/gpu=2"}},
			}},
		},
		{
			name: "replicas as CRI CDI devices", mode: config.CDICRI, ids: [][]string{{"2::1"}},
			want: &api.AllocateResponse{ContainerResponses: []*api.ContainerAllocateResponse{
				{CdiDevices: []*api.CDIDevice{{Name: "nvidia.com/gpu=2"}}},
			}},
		},
		{name: "two replicas of one device for one container", mode: config.CDIAnnotations, ids: [][]string{{"2::0", "2::1"}}, wantErr: policy.ErrSameDeviceTwice},
		{name: "a replica the resource does not offer", mode: config.CDIAnnotations, ids: [][]string{{"3::1"}}, wantErr: ErrUnknownDevice},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := New(gpu, testutil.ShortDir(t), tc.mode, src, quiet())
			req := &api.AllocateRequest{}
			for _, ids := range tc.ids {
				req.ContainerRequests = append(req.ContainerRequests, &api.ContainerAllocateRequest{DevicesIds: ids})
			}
			got, err := p.Allocate(context.Background(), req)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("error %v, want %v", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.want, got, protocmp.Transform()); diff != "" {
				t.Errorf("response (-want +got):\n%s", diff)
			}
		})
	}
}

// allotting is a source that agrees to allocations as refuse says.
type allotting struct {
	*source
	refuse error
	mu     sync.Mutex
	told   [][]string
}

func (a *allotting) Allot(_ context.Context, ids []string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.told = append(a.told, ids)
	return a.refuse
}

// allotted returns the IDs it was told, call by call.
func (a *allotting) allotted() [][]string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.told)
}

// TestAllocateAllotted: an Allotting source is told every ID kubelet
// chose, through Later too, before the answer; its refusal is kubelet's
// answer, naming the resource and the IDs, and no annotation is given.
func TestAllocateAllotted(t *testing.T) {
	errHeld := errors.New("held by pod ns/counted")
	for _, tc := range []struct {
		name   string
		refuse error
		later  bool
	}{
		{name: "agrees"},
		{name: "refuses", refuse: errHeld},
		{name: "refuses, through Later", refuse: errHeld, later: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &allotting{source: &source{devs: []Device{{ID: "0", Healthy: true}, {ID: "1", Healthy: true}, {ID: "2::0", Healthy: true}}}, refuse: tc.refuse}
			var src Source = a
			if tc.later {
				l := &Later{}
				l.Set(a)
				src = l
			}
			p := New(gpu, testutil.ShortDir(t), config.CDIAnnotations, src, quiet())
			got, err := p.Allocate(context.Background(), &api.AllocateRequest{ContainerRequests: []*api.ContainerAllocateRequest{{DevicesIds: []string{"1"}}, {DevicesIds: []string{"0", "2::0"}}}})
			if want := [][]string{{"1", "0", "2::0"}}; !slices.EqualFunc(a.allotted(), want, slices.Equal) {
				t.Errorf("told %v, want %v", a.allotted(), want)
			}
			if tc.refuse == nil {
				if err != nil || len(got.GetContainerResponses()) != 2 {
					t.Fatalf("%v, %v: want two answers", got, err)
				}
				return
			}
			if got != nil || !errors.Is(err, tc.refuse) {
				t.Fatalf("%v, %v: want the refusal", got, err)
			}
			testutil.ErrorSays(t, err, "nvidia.com/gpu: kubelet chose 1, 0, 2::0: held by pod ns/counted")
		})
	}
	// Before Later is set, nothing is told (no ID is known either).
	l := &Later{}
	if err := l.Allot(context.Background(), []string{"0"}); err != nil {
		t.Errorf("Later before Set: %v", err)
	}
}

func TestGetPreferredAllocation(t *testing.T) {
	p := New(gpu, testutil.ShortDir(t), config.CDIAnnotations, &source{}, quiet())
	// kubelet asks for a preferred allocation only of a plugin that
	// says it answers.
	if opts, err := p.GetDevicePluginOptions(context.Background(), &api.Empty{}); err != nil || !opts.GetGetPreferredAllocationAvailable() {
		t.Errorf("options %v (%v): want GetPreferredAllocationAvailable", opts, err)
	}
	got, err := p.GetPreferredAllocation(context.Background(), &api.PreferredAllocationRequest{
		ContainerRequests: []*api.ContainerPreferredAllocationRequest{
			{AvailableDeviceIDs: []string{"0", "1", "2"}, MustIncludeDeviceIDs: []string{"0"}, AllocationSize: 2},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if ids := got.GetContainerResponses()[0].GetDeviceIDs(); !slices.Equal(ids, []string{"0", "2"}) {
		t.Errorf("preferred %v, want the source's choice [0 2]", ids)
	}
}

// kubelet is a fake kubelet registration server on dir/kubelet.sock.
type kubelet struct {
	api.UnimplementedRegistrationServer
	srv  *grpc.Server
	regs chan *api.RegisterRequest
	// refuse is how many registrations it refuses first.
	refuse int
	mu     sync.Mutex
}

func (k *kubelet) Register(_ context.Context, r *api.RegisterRequest) (*api.Empty, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.refuse > 0 {
		k.refuse--
		return nil, errors.New("kubelet is not ready")
	}
	k.regs <- r
	return &api.Empty{}, nil
}

// startKubelet starts a fake kubelet in dir, as kubelet starts: it first
// empties the directory.
func startKubelet(t *testing.T, dir string, regs chan *api.RegisterRequest) *kubelet {
	t.Helper()
	return startRefusingKubelet(t, dir, regs, 0)
}

// startRefusingKubelet starts a fake kubelet that refuses the first
// refuse registrations.
func startRefusingKubelet(t *testing.T, dir string, regs chan *api.RegisterRequest, refuse int) *kubelet {
	t.Helper()
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		_ = os.Remove(filepath.Join(dir, e.Name()))
	}
	l, err := net.Listen("unix", filepath.Join(dir, "kubelet.sock"))
	if err != nil {
		t.Fatal(err)
	}
	k := &kubelet{srv: grpc.NewServer(), regs: regs, refuse: refuse}
	api.RegisterRegistrationServer(k.srv, k)
	go func() { _ = k.srv.Serve(l) }()
	t.Cleanup(k.srv.Stop)
	return k
}

func registration(t *testing.T, regs chan *api.RegisterRequest) *api.RegisterRequest {
	t.Helper()
	select {
	case r := <-regs:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("the plugin did not register")
		return nil
	}
}

func received(t *testing.T, stream api.DevicePlugin_ListAndWatchClient) []*api.Device {
	t.Helper()
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetDevices()
}

// health lists devices as "ID Health".
func health(devs []*api.Device) []string {
	var out []string
	for _, d := range devs {
		out = append(out, d.GetID()+" "+d.GetHealth())
	}
	return out
}

// socketName is how the plugin's sockets are named.
var socketName = regexp.MustCompile(`^nri-gpu-nvidia\.com-gpu-[0-9a-z]+\.sock$`)

// TestRun: the plugin registers once kubelet's socket is there, tells
// kubelet the devices and their changes, registers again when kubelet
// restarts, and removes its socket when it stops.
func TestRun(t *testing.T) {
	dir := testutil.ShortDir(t)
	src := &source{devs: []Device{{ID: "0", Healthy: true}, {ID: "1", Healthy: true}}}
	log, hook := logtest.NewNullLogger()
	p := New(gpu, dir, config.CDIAnnotations, src, log)
	p.poll = 20 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- p.Run(ctx) }()

	// kubelet's socket appears once the plugin waits for it.
	testutil.Within(t, 10*time.Second, "waiting for kubelet", func() bool { return logged(hook, "waiting for kubelet's registration socket") == 1 })
	regs := make(chan *api.RegisterRequest, 4)
	startKubelet(t, dir, regs)
	r := registration(t, regs)
	want := &api.RegisterRequest{Version: "v1beta1", Endpoint: r.GetEndpoint(), ResourceName: "nvidia.com/gpu",
		Options: &api.DevicePluginOptions{GetPreferredAllocationAvailable: true}}
	if diff := cmp.Diff(want, r, protocmp.Transform()); diff != "" {
		t.Errorf("registration (-want +got):\n%s", diff)
	}
	if !socketName.MatchString(r.GetEndpoint()) {
		t.Errorf("endpoint %q, want nri-gpu-nvidia.com-gpu-<id>.sock", r.GetEndpoint())
	}

	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, r.GetEndpoint()), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	stream, err := api.NewDevicePluginClient(conn).ListAndWatch(ctx, &api.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	if got := health(received(t, stream)); !slices.Equal(got, []string{"0 Healthy", "1 Healthy"}) {
		t.Errorf("first list %v", got)
	}
	// Unchanged over several polls: not sent again; the next list kubelet
	// gets is the changed one.
	from := src.looked()
	testutil.Within(t, 10*time.Second, "ten polls", func() bool { return src.looked() >= from+10 })
	src.set(Device{ID: "0", Healthy: false}, Device{ID: "1", Healthy: true})
	p.Notify()
	if got := health(received(t, stream)); !slices.Equal(got, []string{"0 Unhealthy", "1 Healthy"}) {
		t.Errorf("after a change, list %v", got)
	}

	// kubelet restarts: it empties the directory and listens anew. The
	// plugin registers again on a socket of another name: kubelet 1.37
	// refuses a registration at a path whose earlier endpoint it did not
	// see go away, and it does not always see it.
	startKubelet(t, dir, regs)
	again := registration(t, regs)
	if again.GetResourceName() != "nvidia.com/gpu" {
		t.Errorf("registered again as %q", again.GetResourceName())
	}
	if again.GetEndpoint() == r.GetEndpoint() || !socketName.MatchString(again.GetEndpoint()) {
		t.Errorf("registered again at %q, first at %q: want a new nri-gpu-nvidia.com-gpu-<id>.sock", again.GetEndpoint(), r.GetEndpoint())
	}
	if _, err := os.Stat(filepath.Join(dir, again.GetEndpoint())); err != nil {
		t.Errorf("the new socket: %v", err)
	}
	testutil.Within(t, 10*time.Second, "the second registration logged", func() bool { return logged(hook, "registered with kubelet") == 2 })

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run returned %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return when its context was done")
	}
	if _, err := os.Stat(p.socket); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the plugin's socket is left behind: %v", err)
	}
	// The warning about pods admitted before the first registration is
	// given once, not again when kubelet restarts.
	if n := logged(hook, "kubelet hands out nvidia.com/gpu from now on"); n != 1 {
		t.Errorf("the first registration's warning logged %d times, want once", n)
	}
}

// TestRunRegistrationRefused: a registration kubelet refuses is tried
// again, and the plugin says so; it is not taken as registered.
func TestRunRegistrationRefused(t *testing.T) {
	dir := testutil.ShortDir(t)
	log, hook := logtest.NewNullLogger()
	p := New(gpu, dir, config.CDIAnnotations, &source{}, log)
	p.poll = 20 * time.Millisecond
	regs := make(chan *api.RegisterRequest, 4)
	startRefusingKubelet(t, dir, regs, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- p.Run(ctx) }()
	r := registration(t, regs)
	if r.GetResourceName() != "nvidia.com/gpu" {
		t.Errorf("registered as %q", r.GetResourceName())
	}
	const refused = "registering with kubelet: rpc error: code = Unknown desc = kubelet is not ready; trying again"
	testutil.Within(t, 10*time.Second, "the registration logged", func() bool { return logged(hook, "registered with kubelet") > 0 })
	// A registration taken for done before kubelet answered would be
	// logged before the refusal it then met.
	for _, e := range hook.AllEntries() {
		if strings.HasPrefix(e.Message, refused) {
			break
		}
		if strings.HasPrefix(e.Message, "registered with kubelet") {
			t.Errorf("logged %q before the refusal", e.Message)
		}
	}
	cancel()
	<-done // all it logs, logged
	warned, registered := logged(hook, refused), logged(hook, "registered with kubelet")
	if warned != 1 || registered != 1 {
		t.Errorf("logged the refusal %d times and a registration %d times, want once each", warned, registered)
	}
}

// logged counts the entries that start with prefix.
func logged(hook *logtest.Hook, prefix string) int {
	n := 0
	for _, e := range hook.AllEntries() {
		if strings.HasPrefix(e.Message, prefix) {
			n++
		}
	}
	return n
}

// TestListAndWatchEmpty: with no devices, kubelet is told so at once
// (an empty list), not left waiting for a first one.
func TestListAndWatchEmpty(t *testing.T) {
	p := New(gpu, testutil.ShortDir(t), config.CDIAnnotations, &source{}, quiet())
	srv, err := p.serve()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	conn, err := grpc.NewClient("unix://"+p.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stream, err := api.NewDevicePluginClient(conn).ListAndWatch(ctx, &api.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	if devs := received(t, stream); len(devs) != 0 {
		t.Errorf("first list %v, want none", devs)
	}
}
