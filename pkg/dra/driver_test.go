package dra_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	drahealth "k8s.io/kubelet/pkg/apis/dra-health/v1"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/dra"
	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
	"github.com/nri-gpu/nri-gpu/pkg/metrics"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
)

// source is a Source whose devices a test sets, recording what was
// prepared and unprepared.
type source struct {
	mu         sync.Mutex
	devices    []link.Device
	refuse     error
	prepared   map[string][]link.Allocated
	claims     map[string]policy.Claim
	unprepared []string
	// unrecorded, when set, is Unprepare's error.
	unrecorded error
	// looks counts the calls of Devices, sweeps those of Prepared.
	looks, sweeps int
	// down, when set, is the error of Devices and Prepared: nri-gpu
	// cannot be asked (the link is down).
	down error
	// unrecordedUID, when set, is the claim whose release Unprepare
	// cannot record.
	unrecordedUID string
	// used are the claims Release keeps: pods' containers still use
	// them.
	used []string
}

func newSource(names ...string) *source {
	s := &source{prepared: map[string][]link.Allocated{}, claims: map[string]policy.Claim{}}
	s.set(names...)
	return s
}

func (s *source) set(names ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.devices = nil
	for _, n := range names {
		minor, err := strconv.Atoi(strings.TrimPrefix(n, "gpu-"))
		if err != nil {
			panic("not a GPU's name: " + n)
		}
		s.devices = append(s.devices, link.Device{CDI: "nvidia.com/gpu=" + strconv.Itoa(minor),
			Info: link.Info{Kind: "nvidia.com/gpu", Name: strconv.Itoa(minor), Type: link.TypeGPU, Index: minor, Minor: minor}})
	}
}

func (s *source) Devices(context.Context) ([]link.Device, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.looks++
	if s.down != nil {
		return nil, s.down
	}
	return slices.Clone(s.devices), nil
}

func (s *source) Prepare(_ context.Context, c policy.Claim, devs []link.Allocated) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.refuse != nil {
		return s.refuse
	}
	s.prepared[c.UID], s.claims[c.UID] = devs, c
	return nil
}

func (s *source) Unprepare(_ context.Context, uid string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.unrecorded != nil {
		return s.unrecorded
	}
	if uid == s.unrecordedUID {
		return errors.New("state file: no space left on device")
	}
	s.unprepared = append(s.unprepared, uid)
	delete(s.claims, uid)
	return nil
}

func (s *source) Release(ctx context.Context, uid string) error {
	s.mu.Lock()
	used := slices.Contains(s.used, uid)
	s.mu.Unlock()
	if used {
		return fmt.Errorf("claim %s %w pod ns/p", uid, policy.ErrClaimInUse)
	}
	return s.Unprepare(ctx, uid)
}

func (s *source) Prepared(context.Context) ([]policy.Claim, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweeps++
	if s.down != nil {
		return nil, s.down
	}
	var out []policy.Claim
	for _, c := range s.claims {
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b policy.Claim) int { return strings.Compare(a.UID, b.UID) })
	return out, nil
}

// started is a driver serving kubelet's DRA API in a temporary kubelet
// directory, with a client of its socket.
type started struct {
	src    *source
	client *fake.Clientset
	dra    drapb.DRAPluginClient
	health drahealth.DRAResourceHealthClient
	cfg    config.DRA
	logs   *test.Hook
	driver *dra.Driver
	// metrics are the driver's.
	metrics *metrics.DRA
}

func start(t *testing.T, src *source, objects ...*resourceapi.ResourceClaim) *started {
	t.Helper()
	return startWith(t, config.Default().Start.DRA, src, objects...)
}

// startWith starts a driver of cfg, in directories of the test's own.
func startWith(t *testing.T, cfg config.DRA, src *source, objects ...*resourceapi.ResourceClaim) *started {
	t.Helper()
	dir := testutil.ShortDir(t) // it holds unix sockets, whatever TMPDIR is
	cfg.PluginDir, cfg.RegistryDir = filepath.Join(dir, "plugins"), filepath.Join(dir, "registry")
	for _, d := range []string{filepath.Join(cfg.PluginDir, cfg.DriverName), cfg.RegistryDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, UID: "node-uid"}})
	for _, c := range objects {
		if _, err := client.ResourceV1().ResourceClaims(c.Namespace).Create(context.Background(), c, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	log, hook := test.NewNullLogger()
	log.SetLevel(logrus.DebugLevel)
	d := dra.New(cfg, node, src, log)
	d.Metrics = metrics.NewDRA(nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx, client) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	sock := filepath.Join(cfg.PluginDir, cfg.DriverName, "dra.sock")
	waitFor(t, "the driver's socket", func() bool { _, err := os.Stat(sock); return err == nil })
	// The helper makes the registration socket after the driver's.
	reg := filepath.Join(cfg.RegistryDir, cfg.DriverName+"-reg.sock")
	waitFor(t, "the registration socket for kubelet", func() bool { _, err := os.Stat(reg); return err == nil })
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &started{src: src, client: client, dra: drapb.NewDRAPluginClient(conn), health: drahealth.NewDRAResourceHealthClient(conn), cfg: cfg, logs: hook, driver: d, metrics: d.Metrics}
}

// sample returns the value of the driver's sample whose line starts with
// name (its labels included), or "" if it has none.
func (s *started) sample(t *testing.T, name string) string {
	t.Helper()
	rec := httptest.NewRecorder()
	s.metrics.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	for _, line := range strings.Split(rec.Body.String(), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return v
		}
	}
	return ""
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !ok(); {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not in 10s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// published returns the device names of the node's ResourceSlices.
func (s *started) published(t *testing.T) []string {
	t.Helper()
	list, err := s.client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, sl := range list.Items {
		if sl.Spec.Driver != s.cfg.DriverName || sl.Spec.NodeName == nil || *sl.Spec.NodeName != node || sl.Spec.Pool.Name != node {
			t.Errorf("slice %s: driver %s, node %v, pool %s", sl.Name, sl.Spec.Driver, sl.Spec.NodeName, sl.Spec.Pool.Name)
		}
		for _, d := range sl.Spec.Devices {
			out = append(out, d.Name)
		}
	}
	slices.Sort(out)
	return out
}

// TestPublish: the node's ResourceSlice offers the source's devices, and
// follows them when they change.
func TestPublish(t *testing.T) {
	s := start(t, newSource("gpu-0", "gpu-1"))
	waitFor(t, "slice of gpu-0 and gpu-1", func() bool { return slices.Equal(s.published(t), []string{"gpu-0", "gpu-1"}) })
	s.logged(t, "gpu-0,gpu-1")
	// Told of changes that changed nothing: looked at, not published
	// again; and looked at only then, or at a poll (every 2 s), not all
	// the time.
	looks := func() int {
		s.src.mu.Lock()
		defer s.src.mu.Unlock()
		return s.src.looks
	}
	before, since := looks(), time.Now()
	for i := range 3 {
		s.driver.Notify()
		waitFor(t, "a look on Notify", func() bool { return looks() > before+i })
	}
	if n, polls := looks()-before, int(time.Since(since)/(2*time.Second)); n > 3+polls+1 {
		t.Errorf("the devices were looked at %d times for 3 changes told and %d polls", n, polls)
	}
	if n := s.publishedLogs(); n != 1 {
		t.Errorf("the unchanged slice was published %d times", n)
	}
	if got := s.sample(t, "nri_gpu_dra_slice_follow_seconds_count"); got != "0" {
		t.Errorf("changes told that changed nothing measured as followed %s times", got)
	}
	s.src.set("gpu-0")
	s.driver.Notify()
	waitFor(t, "slice of gpu-0 only", func() bool { return slices.Equal(s.published(t), []string{"gpu-0"}) })
	s.logged(t, "gpu-0")
	s.src.set()
	s.driver.Notify()
	waitFor(t, "an empty slice", func() bool { return len(s.published(t)) == 0 })
	s.logged(t, "none")
	// Each change told is measured once published (one the driver saw on
	// its own look first is not told).
	if got := s.sample(t, "nri_gpu_dra_slice_follow_seconds_count"); got != "1" && got != "2" {
		t.Errorf("2 changes told and published, %q measured", got)
	}
}

// TestPublishNothing: a node with no device to offer publishes its
// ResourceSlice all the same, empty (the scheduler then knows it has
// none), at once.
func TestPublishNothing(t *testing.T) {
	s := start(t, newSource())
	s.logged(t, "none")
	if got := s.published(t); len(got) != 0 {
		t.Errorf("published %v, want no device", got)
	}
}

// TestPublishWhileThePoolCannotTell: while nri-gpu cannot be asked
// (its link to the driver is down), the slice published last stays:
// not emptied, which would tell the scheduler the node has no device,
// nor published from a guess; it follows the pool again once it answers.
func TestPublishWhileThePoolCannotTell(t *testing.T) {
	s := start(t, newSource("gpu-0", "gpu-1"))
	waitFor(t, "slice of gpu-0 and gpu-1", func() bool { return slices.Equal(s.published(t), []string{"gpu-0", "gpu-1"}) })
	s.src.mu.Lock()
	s.src.down = errors.New("link down")
	s.src.devices = nil
	s.src.mu.Unlock()
	s.driver.Notify()
	waitFor(t, "the warning", func() bool {
		for _, e := range s.logs.AllEntries() {
			if strings.Contains(e.Message, "not published again: link down") {
				return true
			}
		}
		return false
	})
	if got := s.published(t); !slices.Equal(got, []string{"gpu-0", "gpu-1"}) {
		t.Errorf("published %v while the pool could not be asked, want the last slice kept", got)
	}
	s.src.mu.Lock()
	s.src.down = nil
	s.src.mu.Unlock()
	s.src.set("gpu-1")
	s.driver.Notify()
	waitFor(t, "slice of gpu-1", func() bool { return slices.Equal(s.published(t), []string{"gpu-1"}) })
}

// publishedLogs counts the driver's logs of publishing its slice.
func (s *started) publishedLogs() int {
	n := 0
	for _, e := range s.logs.AllEntries() {
		if e.Message == "published the node's ResourceSlice" {
			n++
		}
	}
	return n
}

// warned reports whether the driver logged a warning saying what.
func (s *started) warned(what string) bool {
	for _, e := range s.logs.AllEntries() {
		if e.Level == logrus.WarnLevel && strings.Contains(e.Message, what) {
			return true
		}
	}
	return false
}

// TestStartWhileThePoolCannotTell: a driver that starts while nri-gpu's
// pool cannot be asked says that the prepared claims were not checked
// against the API server, publishes no slice (not an empty one: the
// scheduler would take the node for one without devices), and publishes
// once the pool answers. A driver that could ask says nothing of it, nor
// of claims in use not held.
func TestStartWhileThePoolCannotTell(t *testing.T) {
	src := newSource("gpu-0")
	src.down = errors.New("link down")
	s := start(t, src)
	waitFor(t, "the warning", func() bool {
		return s.warned("prepared claims not checked against the API server") && s.warned("link down")
	})
	if n := s.publishedLogs(); n != 0 || len(s.published(t)) != 0 {
		t.Errorf("published %v (%d times) before the pool answered", s.published(t), n)
	}
	src.mu.Lock()
	src.down = nil
	src.mu.Unlock()
	s.driver.Notify()
	waitFor(t, "slice of gpu-0", func() bool { return slices.Equal(s.published(t), []string{"gpu-0"}) })

	up := start(t, newSource("gpu-0"))
	up.logged(t, "gpu-0")
	if up.warned("not checked") {
		t.Error("warned that the prepared claims were not checked, with the pool answering")
	}
	if up.warned("not all held") {
		t.Error("warned that claims in use were not all held, with the pool and the API server answering")
	}
}

// TestRegistration: kubelet is told of the DRA service and the health
// stream, and the stream, through kubelet's own gRPC API, tells each
// offered device's health.
func TestRegistration(t *testing.T) {
	s := start(t, newSource("gpu-0"))
	conn, err := grpc.NewClient("unix://"+filepath.Join(s.cfg.RegistryDir, s.cfg.DriverName+"-reg.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	info, err := registerapi.NewRegistrationClient(conn).GetInfo(context.Background(), &registerapi.InfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if info.Type != registerapi.DRAPlugin || info.Name != s.cfg.DriverName || len(info.SupportedVersions) == 0 {
		t.Errorf("registration %+v", info)
	}
	// Registered once kubelet says so; not while it has not, or refused.
	if err := s.driver.Registered(); err == nil || !strings.Contains(err.Error(), "kubelet has not registered it yet") {
		t.Errorf("before kubelet's word: %v", err)
	}
	for _, st := range []*registerapi.RegistrationStatus{{PluginRegistered: false, Error: "no such version"}, {PluginRegistered: true}} {
		// The helper answers a refusal with an error of its own.
		if _, err := registerapi.NewRegistrationClient(conn).NotifyRegistrationStatus(context.Background(), st); (err == nil) != st.PluginRegistered {
			t.Fatalf("telling %+v: %v", st, err)
		}
		err := s.driver.Registered()
		if st.PluginRegistered && err != nil || !st.PluginRegistered && (err == nil || !strings.Contains(err.Error(), "kubelet refused its registration: no such version")) {
			t.Errorf("kubelet said %+v: %v", st, err)
		}
	}
	if !slices.ContainsFunc(info.SupportedVersions, func(v string) bool { return strings.Contains(v, "v1.DRAResourceHealth") }) {
		t.Errorf("kubelet is offered %v, no health stream", info.SupportedVersions)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := s.health.NodeWatchResources(ctx, &drahealth.NodeWatchResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Devices) != 1 || resp.Devices[0].Device.GetDeviceName() != "gpu-0" || resp.Devices[0].Device.GetPoolName() != node || resp.Devices[0].Health != drahealth.HealthStatus_HEALTHY {
		t.Errorf("health stream said %v, want gpu-0 healthy", resp.Devices)
	}
}

// TestPrepareDeviceNotYetPublished: a claim allocated a device the pool
// offers but the driver has not published yet (kubelet may ask before the
// next look, or after a restart) is prepared; while the pool cannot be
// asked, such a claim fails with the pool's reason.
func TestPrepareDeviceNotYetPublished(t *testing.T) {
	src := newSource("gpu-0")
	s := start(t, src,
		allocated("new", "uid-new", result("gpus", driver, node, "gpu-1")),
		allocated("later", "uid-later", result("gpus", driver, node, "gpu-2")))
	s.logged(t, "gpu-0")
	src.set("gpu-0", "gpu-1")
	ctx := context.Background()
	resp, err := s.dra.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{{Namespace: "ns", Name: "new", Uid: "uid-new"}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.Claims["uid-new"]; got.GetError() != "" || len(got.GetDevices()) != 1 || got.GetDevices()[0].CdiDeviceIds[0] != "nvidia.com/gpu=1" {
		t.Errorf("a device not yet published: %+v", got)
	}
	src.mu.Lock()
	src.down = errors.New("link down")
	src.mu.Unlock()
	resp, err = s.dra.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{{Namespace: "ns", Name: "later", Uid: "uid-later"}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.Claims["uid-later"].GetError(); !strings.Contains(got, "link down") {
		t.Errorf("a device not yet published, the pool down: error %q, want the pool's", got)
	}
}

// TestUnprepareOneNotRecorded: of two claims unprepared at once, one
// whose release cannot be recorded does not keep the other from being
// released.
func TestUnprepareOneNotRecorded(t *testing.T) {
	src := newSource("gpu-0", "gpu-1")
	src.unrecordedUID = "uid-one"
	s := start(t, src)
	resp, err := s.dra.NodeUnprepareResources(context.Background(), &drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{
		{Namespace: "ns", Name: "one", Uid: "uid-one"}, {Namespace: "ns", Name: "two", Uid: "uid-two"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Claims["uid-one"].GetError() == "" || resp.Claims["uid-two"].GetError() != "" || !slices.Equal(src.unprepared, []string{"uid-two"}) {
		t.Errorf("one of two not recorded: %v; released %v", resp.Claims, src.unprepared)
	}
	if ok, failed := s.sample(t, `nri_gpu_dra_unprepare_total{result="ok"}`), s.sample(t, `nri_gpu_dra_unprepare_total{result="error"}`); ok != "1" || failed != "1" {
		t.Errorf("unprepared ok %q, error %q; want 1 each", ok, failed)
	}
}

// logged checks that the driver logged publishing devices.
func (s *started) logged(t *testing.T, devices string) {
	t.Helper()
	waitFor(t, "the log of publishing "+devices, func() bool {
		for _, e := range s.logs.AllEntries() {
			if e.Message == "published the node's ResourceSlice" && e.Data["devices"] == devices {
				return true
			}
		}
		return false
	})
}

// allocated is claim ns/name allocated results, reserved for pod ns/p.
func allocated(name, uid string, results ...resourceapi.DeviceRequestAllocationResult) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID(uid)}}
	c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: results}}
	c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "p", UID: "pod-uid"}}
	return c
}

func result(request, drv, pool, device string) resourceapi.DeviceRequestAllocationResult {
	return resourceapi.DeviceRequestAllocationResult{Request: request, Driver: drv, Pool: pool, Device: device}
}

// TestPrepare: kubelet's NodePrepareResources, through the DRA API,
// returns the CDI devices of exactly the claim's devices of this driver
// on this node, after the source held them; a claim it cannot prepare
// gets the reason; NodeUnprepareResources releases.
func TestPrepare(t *testing.T) {
	claims := []*resourceapi.ResourceClaim{
		allocated("two", "uid-two", result("gpus", "gpu.nvidia.com", node, "gpu-0"), result("gpus", driver, "node-2", "gpu-1"),
			result("gpus", driver, node, "gpu-0"), result("gpus/big", driver, node, "gpu-1"), result("extra", driver, node, "gpu-0")),
		allocated("unknown", "uid-unknown", result("gpus", driver, node, "gpu-9")),
		allocated("refused", "uid-refused", result("gpus", driver, node, "gpu-1")),
	}
	src := newSource("gpu-0", "gpu-1")
	s := start(t, src, claims...)
	ctx := context.Background()
	prepare := func(c *resourceapi.ResourceClaim) *drapb.NodePrepareResourceResponse {
		t.Helper()
		resp, err := s.dra.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)}}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.Claims[string(c.UID)]
	}

	got := prepare(claims[0])
	if got.Error != "" {
		t.Fatalf("claim two: %s", got.Error)
	}
	var ids [][]string
	for _, d := range got.Devices {
		ids = append(ids, []string{strings.Join(d.RequestNames, ","), d.PoolName, d.DeviceName, strings.Join(d.CdiDeviceIds, ",")})
	}
	// kubelet hears of requests, not subrequests (the helper strips them).
	want := [][]string{{"gpus", node, "gpu-0", "nvidia.com/gpu=0"}, {"gpus", node, "gpu-1", "nvidia.com/gpu=1"}, {"extra", node, "gpu-0", "nvidia.com/gpu=0"}}
	if diff := cmp.Diff(want, ids); diff != "" {
		t.Errorf("prepared devices (-want +got):\n%s", diff)
	}
	// A device of two requests is held once, for both.
	wantHeld := []link.Allocated{{CDI: "nvidia.com/gpu=0", Requests: []string{"gpus", "extra"}}, {CDI: "nvidia.com/gpu=1", Requests: []string{"gpus"}}}
	if diff := cmp.Diff(wantHeld, src.prepared["uid-two"]); diff != "" {
		t.Errorf("held (-want +got):\n%s", diff)
	}
	if c := src.claims["uid-two"]; c.Namespace != "ns" || c.Name != "two" || !slices.Equal(c.Pods, []policy.PodName{{Namespace: "ns", Name: "p"}}) {
		t.Errorf("held for %+v, want claim ns/two of pod ns/p", c)
	}

	if got := prepare(claims[1]); !strings.Contains(got.Error, `device "gpu-9" of pool "node-1": not a device nri-gpu offers`) {
		t.Errorf("a claim of a device not offered: error %q", got.Error)
	}
	// Two claims in one call: the one that fails does not keep the
	// other from being prepared.
	resp, err := s.dra.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{
		{Namespace: "ns", Name: "unknown", Uid: "uid-unknown"}, {Namespace: "ns", Name: "refused", Uid: "uid-refused"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Claims["uid-unknown"].Error == "" || resp.Claims["uid-refused"].Error != "" || len(src.prepared["uid-refused"]) != 1 {
		t.Errorf("one failing claim of two: %v; prepared %v", resp.Claims, src.prepared)
	}
	src.refuse = errors.New("held by pod ns/other")
	if got := prepare(claims[2]); !strings.Contains(got.Error, "nri-gpu: held by pod ns/other") || len(got.Devices) > 0 {
		t.Errorf("a claim the source refuses: %+v", got)
	}

	if _, err := s.dra.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{{Namespace: "ns", Name: "two", Uid: "uid-two"}}}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(src.unprepared, []string{"uid-two"}) {
		t.Errorf("unprepared %v, want uid-two", src.unprepared)
	}
	for name, want := range map[string]string{
		`nri_gpu_dra_prepare_total{result="ok"}`:       "2",
		`nri_gpu_dra_prepare_total{result="error"}`:    "3",
		`nri_gpu_dra_unprepare_total{result="ok"}`:     "1",
		"nri_gpu_dra_prepare_duration_seconds_count":   "5",
		"nri_gpu_dra_unprepare_duration_seconds_count": "1",
		"nri_gpu_dra_requests_in_flight":               "0",
	} {
		if got := s.sample(t, name); got != want {
			t.Errorf("%s = %q, want %s", name, got, want)
		}
	}
}

// TestPrepareConsumedCapacity: what kube-scheduler allocated a claim of
// a device shared by consumable capacity is held: its shares and memory,
// summed over the claim's shares of one device (ShareID), one share for a
// share without a "shares" amount; whether a request or subrequest asked
// for an amount of memory goes with it; kubelet hears each share's ID.
func TestPrepareConsumedCapacity(t *testing.T) {
	share := func(r resourceapi.DeviceRequestAllocationResult, id string, consumed map[resourceapi.QualifiedName]string) resourceapi.DeviceRequestAllocationResult {
		uid := types.UID(id)
		r.ShareID = &uid
		r.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{}
		for k, v := range consumed {
			r.ConsumedCapacity[k] = resource.MustParse(v)
		}
		return r
	}
	c := allocated("shared", "uid-shared",
		share(result("small", driver, node, "gpu-0"), "s1", map[resourceapi.QualifiedName]string{"shares": "1", "memory": "4Gi"}),
		share(result("big/first", driver, node, "gpu-0"), "s2", map[resourceapi.QualifiedName]string{"shares": "2", "memory": "20Gi"}),
		share(result("plain", driver, node, "gpu-1"), "s3", nil))
	c.Spec.Devices.Requests = []resourceapi.DeviceRequest{
		{Name: "small", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu", Capacity: &resourceapi.CapacityRequirements{
			Requests: map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse("4Gi")}}}},
		{Name: "big", FirstAvailable: []resourceapi.DeviceSubRequest{{Name: "first", DeviceClassName: "gpu", Capacity: &resourceapi.CapacityRequirements{
			Requests: map[resourceapi.QualifiedName]resource.Quantity{"shares": resource.MustParse("2")}}}}},
		{Name: "plain", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu"}},
	}
	src := newSource("gpu-0", "gpu-1")
	s := start(t, src, c)
	resp, err := s.dra.NodePrepareResources(context.Background(), &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{{Namespace: "ns", Name: "shared", Uid: "uid-shared"}}})
	if err != nil {
		t.Fatal(err)
	}
	got := resp.Claims["uid-shared"]
	if got.Error != "" {
		t.Fatal(got.Error)
	}
	var shares []string
	for _, d := range got.Devices {
		shares = append(shares, d.DeviceName+"/"+d.GetShareId())
	}
	if want := []string{"gpu-0/s1", "gpu-0/s2", "gpu-1/s3"}; !slices.Equal(shares, want) {
		t.Errorf("kubelet heard of shares %v, want %v", shares, want)
	}
	want := []link.Allocated{
		{CDI: "nvidia.com/gpu=0", Requests: []string{"small", "big"}, Use: policy.Use{Shares: 3, Memory: 24 << 30}, MemoryAsked: true},
		{CDI: "nvidia.com/gpu=1", Requests: []string{"plain"}, Use: policy.Use{Shares: 1}},
	}
	if diff := cmp.Diff(want, src.prepared["uid-shared"]); diff != "" {
		t.Errorf("held (-want +got):\n%s", diff)
	}
}

// TestPrepareNotAllocated: a claim with no allocation is not prepared.
func TestPrepareNotAllocated(t *testing.T) {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "pending", Namespace: "ns", UID: "uid-p"}}
	src := newSource("gpu-0")
	log, _ := test.NewNullLogger()
	d := dra.New(config.Default().Start.DRA, node, src, log)
	res, err := d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{c})
	if err != nil {
		t.Fatal(err)
	}
	if e := res["uid-p"].Err; e == nil || !strings.Contains(e.Error(), "claim ns/pending is not allocated") {
		t.Errorf("error %v, want not allocated", e)
	}
	if len(src.prepared) > 0 {
		t.Errorf("the source held %v", src.prepared)
	}
}

// TestPrepareWhoInjects: with dra.cdiDevices "cri" the prepared devices
// carry their CDI device IDs, which kubelet hands the runtime; with
// "nri-gpu" they carry none (the runtime's own CDI injects nothing, and
// nri-gpu injects the claim's devices itself), and are held alike.
func TestPrepareWhoInjects(t *testing.T) {
	for _, tc := range []struct {
		mode config.CDIDevices
		want []string
	}{
		{config.CDICRI, []string{"nvidia.com/gpu=1"}},
		{config.CDINRIGPU, nil},
	} {
		t.Run(string(tc.mode), func(t *testing.T) {
			src := newSource("gpu-0", "gpu-1")
			cfg := config.Default().Start.DRA
			cfg.CDIDevices = tc.mode
			log, _ := test.NewNullLogger()
			d := dra.New(cfg, node, src, log)
			res, err := d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{
				allocated("one", "uid-one", result("gpus", driver, node, "gpu-1")),
			})
			if err != nil {
				t.Fatal(err)
			}
			r := res["uid-one"]
			if r.Err != nil || len(r.Devices) != 1 || r.Devices[0].DeviceName != "gpu-1" {
				t.Fatalf("prepared %+v", r)
			}
			if got := r.Devices[0].CDIDeviceIDs; !slices.Equal(got, tc.want) {
				t.Errorf("CDI device IDs for kubelet %v, want %v", got, tc.want)
			}
			if held := src.prepared["uid-one"]; len(held) != 1 || held[0].CDI != "nvidia.com/gpu=1" {
				t.Errorf("held %+v, want nvidia.com/gpu=1", held)
			}
		})
	}
}

// TestUnprepareNotRecorded: a release the source cannot record reaches
// kubelet as the claim's error (kubelet asks again), never as done.
func TestUnprepareNotRecorded(t *testing.T) {
	src := newSource("gpu-0")
	s := start(t, src, allocated("one", "uid-one", result("gpus", driver, node, "gpu-0")))
	ctx := context.Background()
	claim := []*drapb.Claim{{Namespace: "ns", Name: "one", Uid: "uid-one"}}
	if _, err := s.dra.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: claim}); err != nil {
		t.Fatal(err)
	}
	src.mu.Lock()
	src.unrecorded = errors.New("state file: no space left on device")
	src.mu.Unlock()
	resp, err := s.dra.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: claim})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.Claims["uid-one"].GetError(); !strings.Contains(got, "nri-gpu: state file: no space left on device") {
		t.Errorf("unprepare unrecorded: error %q, want the record's", got)
	}
	src.mu.Lock()
	src.unrecorded = nil
	src.mu.Unlock()
	resp, err = s.dra.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: claim})
	if err != nil || resp.Claims["uid-one"].GetError() != "" {
		t.Errorf("kubelet's next try: %v, %v; want done", resp, err)
	}
}

// TestReleaseGone: of the claims held when the driver starts, those the
// API server no longer has, has under another UID, no longer allocates,
// or allocates on another node or through another driver are released,
// but for one whose pods' containers still use it (a pod deleted while
// kubelet was away still runs); the others stay held, and so do all of
// them while the API server cannot tell.
func TestReleaseGone(t *testing.T) {
	kept := allocated("kept", "uid-kept", result("gpus", driver, node, "gpu-0"))
	replaced := allocated("replaced", "uid-new", result("gpus", driver, node, "gpu-0"))
	unallocated := allocated("unallocated", "uid-unallocated")
	unallocated.Status.Allocation = nil
	moved := allocated("moved", "uid-moved", result("gpus", driver, "node-2", "gpu-0"))
	other := allocated("other", "uid-other", result("gpus", "gpu.nvidia.com", node, "gpu-0"))
	held := []policy.Claim{
		{UID: "uid-deleted", Namespace: "ns", Name: "deleted"},
		{UID: "uid-kept", Namespace: "ns", Name: "kept"},
		{UID: "uid-moved", Namespace: "ns", Name: "moved"},
		{UID: "uid-other", Namespace: "ns", Name: "other"},
		{UID: "uid-old", Namespace: "ns", Name: "replaced"},
		{UID: "uid-unallocated", Namespace: "ns", Name: "unallocated"},
		{UID: "uid-used", Namespace: "ns", Name: "used"},
	}
	src := newSource("gpu-0")
	src.used = []string{"uid-used"}
	for _, c := range held {
		src.claims[c.UID] = c
	}
	client := fake.NewClientset()
	for _, c := range []*resourceapi.ResourceClaim{kept, replaced, unallocated, moved, other} {
		if _, err := client.ResourceV1().ResourceClaims("ns").Create(context.Background(), c, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	log, hook := test.NewNullLogger()
	d := dra.New(config.Default().Start.DRA, node, src, log)

	down := fake.NewClientset()
	down.PrependReactor("get", "resourceclaims", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("connection refused")
	})
	err := d.ReleaseGone(context.Background(), down)
	testutil.ErrorSays(t, err, "claim ns/kept", "connection refused")
	if len(src.unprepared) > 0 {
		t.Errorf("released %v while the API server could not tell", src.unprepared)
	}

	if err := d.ReleaseGone(context.Background(), client); err != nil {
		t.Fatal(err)
	}
	want := []string{"uid-deleted", "uid-moved", "uid-old", "uid-other", "uid-unallocated"}
	if diff := cmp.Diff(want, src.unprepared); diff != "" {
		t.Errorf("released (-want +got):\n%s", diff)
	}
	var why []string
	for _, e := range hook.AllEntries() {
		why = append(why, e.Data["claim"].(string)+": "+e.Message)
	}
	testutil.ErrorSays(t, errors.New(strings.Join(why, "\n")),
		"deleted: released a prepared claim that the API server no longer has",
		"replaced: released a prepared claim that the API server has replaced (UID uid-new, not uid-old)",
		"unallocated: released a prepared claim that is no longer allocated",
		"moved: released a prepared claim that is no longer allocated on this node",
		"used: kept a prepared claim that the API server no longer has: claim uid-used still used by the containers of pod ns/p (released at a sweep once they have ended)")
	if _, held := src.claims["uid-used"]; !held {
		t.Error("the claim still in use was released")
	}
}

// TestSweep: while the driver runs, a prepared claim the API server
// deletes, or allocates elsewhere, is released within the sweep interval
// without kubelet unpreparing it; one still allocated here stays held.
func TestSweep(t *testing.T) {
	kept := allocated("kept", "uid-kept", result("gpus", driver, node, "gpu-0"))
	deleted := allocated("deleted", "uid-deleted", result("gpus", driver, node, "gpu-1"))
	moved := allocated("moved", "uid-moved", result("gpus", driver, node, "gpu-1"))
	src := newSource("gpu-0", "gpu-1")
	for _, c := range []*resourceapi.ResourceClaim{kept, deleted, moved} {
		src.claims[string(c.UID)] = policy.Claim{UID: string(c.UID), Namespace: c.Namespace, Name: c.Name}
	}
	cfg := config.Default().Start.DRA
	cfg.SweepInterval = 100 * time.Millisecond
	s := startWith(t, cfg, src, kept, deleted, moved)
	s.sweeps(t, 3)
	if got := s.unprepared(); len(got) > 0 {
		t.Fatalf("released %v while the API server allocates each here", got)
	}
	ctx := context.Background()
	if err := s.client.ResourceV1().ResourceClaims("ns").Delete(ctx, "deleted", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	moved.Status.Allocation.Devices.Results[0].Pool = "node-2"
	if _, err := s.client.ResourceV1().ResourceClaims("ns").UpdateStatus(ctx, moved, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the deleted and moved claims released", func() bool { return len(s.unprepared()) == 2 })
	s.sweeps(t, 3)
	if diff := cmp.Diff([]string{"uid-deleted", "uid-moved"}, s.unprepared()); diff != "" {
		t.Errorf("released (-want +got):\n%s", diff)
	}
}

// sweeps waits until the driver has swept n more times (each sweep asks
// the source which claims are prepared).
func (s *started) sweeps(t *testing.T, n int) {
	t.Helper()
	swept := func() int {
		s.src.mu.Lock()
		defer s.src.mu.Unlock()
		return s.src.sweeps
	}
	from := swept()
	waitFor(t, fmt.Sprintf("%d sweeps", n), func() bool { return swept() >= from+n })
}

func (s *started) unprepared() []string {
	s.src.mu.Lock()
	defer s.src.mu.Unlock()
	out := slices.Clone(s.src.unprepared)
	slices.Sort(out)
	return out
}

// TestPrepareHeld: at start, the claims of this node's pods that the API
// server allocates here through this driver and reserves for them, which
// the pool does not hold (its record was lost), are prepared in it again,
// as kubelet would: with their pods and devices; claims held already, not
// reserved for the pod, of another node or driver, not made or not
// needed, and pods of another node are left alone; a claim two pods use
// is prepared once; one the pool refuses is named in the error, the
// others prepared all the same; an API server that cannot list the
// node's pods, or a pool that cannot say what it holds, changes nothing.
func TestPrepareHeld(t *testing.T) {
	inUse := allocated("in-use", "uid-in-use", result("gpus", driver, node, "gpu-1"))
	refused := allocated("refused", "uid-refused", result("gpus", driver, node, "gpu-9"))
	held := allocated("held", "uid-held", result("gpus", driver, node, "gpu-0"))
	notReserved := allocated("not-reserved", "uid-not-reserved", result("gpus", driver, node, "gpu-0"))
	notReserved.Status.ReservedFor = nil
	elsewhere := allocated("elsewhere", "uid-elsewhere", result("gpus", driver, "node-2", "gpu-0"))
	other := allocated("other", "uid-other", result("gpus", "gpu.nvidia.com", node, "gpu-0"))
	otherNodes := allocated("other-nodes", "uid-other-nodes", result("gpus", driver, node, "gpu-0"))
	// The claim kube-scheduler made pod p for its extended resources.
	ext := allocated("p-ext", "uid-p-ext", result("container-0-request-0", driver, node, "gpu-0"))
	client := fake.NewClientset()
	for _, c := range []*resourceapi.ResourceClaim{inUse, refused, held, notReserved, elsewhere, other, otherNodes, ext} {
		if _, err := client.ResourceV1().ResourceClaims("ns").Create(context.Background(), c, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	podOf := func(name, nodeName string, claims ...string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: "pod-uid"}, Spec: corev1.PodSpec{NodeName: nodeName}}
		for _, c := range claims {
			p.Spec.ResourceClaims = append(p.Spec.ResourceClaims, corev1.PodResourceClaim{Name: c, ResourceClaimName: &c})
		}
		return p
	}
	// Pod r shares claim in-use with p, and has two claims from a
	// template: one the API server decided is not needed, one not made
	// yet (kubelet has prepared neither). Pod a is another node's,
	// listed first (client-go's fake ignores the field selector).
	r := podOf("r", node, "in-use")
	template := "template"
	r.Spec.ResourceClaims = append(r.Spec.ResourceClaims,
		corev1.PodResourceClaim{Name: "unneeded", ResourceClaimTemplateName: &template},
		corev1.PodResourceClaim{Name: "unmade", ResourceClaimTemplateName: &template})
	r.Status.ResourceClaimStatuses = []corev1.PodResourceClaimStatus{{Name: "unneeded"}}
	p := podOf("p", node, "in-use", "refused", "held", "not-reserved", "elsewhere", "other", "gone")
	p.Status.ExtendedResourceClaimStatus = &corev1.PodExtendedResourceClaimStatus{ResourceClaimName: "p-ext",
		RequestMappings: []corev1.ContainerExtendedResourceRequest{{ContainerName: "c", ResourceName: "nvidia.com/gpu", RequestName: "container-0-request-0"}}}
	for _, p := range []*corev1.Pod{podOf("a", "node-2", "other-nodes"), p, r} {
		if _, err := client.CoreV1().Pods("ns").Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	src := newSource("gpu-0", "gpu-1")
	src.claims["uid-held"] = policy.Claim{UID: "uid-held", Namespace: "ns", Name: "held"}
	log, hook := test.NewNullLogger()
	d := dra.New(config.Default().Start.DRA, node, src, log)

	down := fake.NewClientset()
	down.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("connection refused")
	})
	testutil.ErrorSays(t, d.PrepareHeld(context.Background(), down), "connection refused")
	if len(src.prepared) > 0 {
		t.Errorf("prepared %v while the API server could not list", src.prepared)
	}
	src.down = errors.New("the record cannot be read")
	testutil.ErrorSays(t, d.PrepareHeld(context.Background(), client), "the record cannot be read")
	if len(src.prepared) > 0 {
		t.Errorf("prepared %v while the pool could not say what it holds", src.prepared)
	}
	src.down = nil

	err := d.PrepareHeld(context.Background(), client)
	testutil.ErrorSays(t, err, "claim ns/refused of pod ns/p", `device "gpu-9"`, `claim ns/gone of pod ns/p: resourceclaims.resource.k8s.io "gone" not found`)
	want := map[string][]link.Allocated{
		"uid-in-use": {{CDI: "nvidia.com/gpu=1", Requests: []string{"gpus"}}},
		"uid-p-ext":  {{CDI: "nvidia.com/gpu=0", Requests: []string{"container-0-request-0"}}},
	}
	if diff := cmp.Diff(want, src.prepared); diff != "" {
		t.Errorf("prepared (-want +got):\n%s", diff)
	}
	if c := src.claims["uid-in-use"]; !slices.Equal(c.Pods, []policy.PodName{{Namespace: "ns", Name: "p"}}) {
		t.Errorf("the claim prepared again is reserved for %v, want ns/p", c.Pods)
	}
	var logged []string
	for _, e := range hook.AllEntries() {
		logged = append(logged, fmt.Sprint(e.Data["claim"]))
	}
	if !slices.Equal(logged, []string{"in-use", "p-ext"}) {
		t.Errorf("logged claims %v, want in-use (once for its two pods) and p-ext", logged)
	}
}

// sicken sets why the source's device gpu-<minor> is unhealthy (nil:
// healthy again).
func (s *source) sicken(minor int, h *link.Health) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range s.devices {
		if s.devices[i].Info.Minor == minor {
			s.devices[i].Info.Unhealthy = h
		}
	}
}

// TestHealthReports: kubelet hears the health of every device offered at
// once, and again when one turns unhealthy (with the reason) and healthy
// again; the stream ends when kubelet goes.
func TestHealthReports(t *testing.T) {
	src := newSource("gpu-0", "gpu-1")
	log, _ := test.NewNullLogger()
	d := dra.New(config.Default().Start.DRA, node, src, log)
	ctx, cancel := context.WithCancel(context.Background())
	reports := make(chan kubeletplugin.DeviceHealthReport)
	done := make(chan error, 1)
	go func() { done <- d.WatchHealthStatus(ctx, reports) }()
	next := func() string {
		t.Helper()
		select {
		case r := <-reports:
			var out []string
			for _, h := range r.Devices {
				if h.PoolName != node || h.HealthCheckTimeout <= 0 || h.LastUpdated.IsZero() {
					t.Errorf("report %+v: want the node's pool, a timeout and a time", h)
				}
				out = append(out, fmt.Sprintf("%s:%s:%s", h.DeviceName, h.Health, h.Message))
			}
			return strings.Join(out, " ")
		case <-time.After(10 * time.Second):
			t.Fatal("no report")
		}
		return ""
	}
	if got := next(); got != "gpu-0:Healthy: gpu-1:Healthy:" {
		t.Errorf("first report %q", got)
	}
	src.sicken(1, &link.Health{Problem: link.ProblemXid, Value: "79", Reason: "critical Xid error 79"})
	d.Notify()
	if got := next(); got != "gpu-0:Healthy: gpu-1:Unhealthy:critical Xid error 79" {
		t.Errorf("after GPU 1's Xid %q", got)
	}
	src.sicken(1, nil)
	d.Notify()
	if got := next(); got != "gpu-0:Healthy: gpu-1:Healthy:" {
		t.Errorf("GPU 1 healthy again: %q", got)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("the stream ended with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the stream did not end when kubelet went")
	}
}

// TestOlderAPIServer: where the API server drops the fields of device
// taints and consumable capacity (Kubernetes before 1.36, or their gates
// off: the slice controller reports what it dropped), the driver
// publishes without them from then on, and says so once each: an
// unhealthy device leaves the slice instead of staying untainted, and a
// shared GPU is offered to one claim at a time.
func TestOlderAPIServer(t *testing.T) {
	src := newSource("gpu-0", "gpu-1")
	src.mu.Lock()
	src.devices[0].Info.Offer = &policy.Capacity{Shares: 2}
	src.mu.Unlock()
	s := start(t, src)
	slice := func() *resourceapi.ResourceSlice {
		list, err := s.client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
		if err != nil || len(list.Items) != 1 {
			return nil
		}
		return &list.Items[0]
	}
	src.sicken(1, &link.Health{Problem: link.ProblemGone, Reason: "its device nodes are not on the host"})
	s.driver.Notify()
	waitFor(t, "gpu-0 shared and gpu-1 tainted", func() bool {
		sl := slice()
		return sl != nil && len(sl.Spec.Devices) == 2 && sl.Spec.Devices[0].AllowMultipleAllocations != nil && len(sl.Spec.Devices[1].Taints) == 1
	})
	desired := slice()
	actual := desired.DeepCopy()
	for i := range actual.Spec.Devices {
		actual.Spec.Devices[i].Taints, actual.Spec.Devices[i].AllowMultipleAllocations = nil, nil
	}
	for range 2 {
		s.driver.HandleError(context.Background(), &resourceslice.DroppedFieldsError{PoolName: node, DesiredSlice: desired, ActualSlice: actual}, "update ResourceSlice")
	}
	waitFor(t, "gpu-0 alone, for one claim", func() bool {
		sl := slice()
		return sl != nil && len(sl.Spec.Devices) == 1 && sl.Spec.Devices[0].Name == "gpu-0" && sl.Spec.Devices[0].AllowMultipleAllocations == nil
	})
	for _, what := range []string{"does not keep device taints (DRADeviceTaints is off", "does not keep consumable capacity (DRAConsumableCapacity is off"} {
		n := 0
		for _, e := range s.logs.AllEntries() {
			if e.Level == logrus.WarnLevel && strings.Contains(e.Message, what) {
				n++
			}
		}
		if n != 1 {
			t.Errorf("warned %d times that the API server %s, want once", n, what)
		}
	}
	// Another error is only logged.
	s.driver.HandleError(context.Background(), errors.New("conflict"), "update ResourceSlice")
	if !s.warned("update ResourceSlice: conflict") {
		t.Error("an error publishing the slice was not logged")
	}
}
