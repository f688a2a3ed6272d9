package plugin_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
	"github.com/nri-gpu/nri-gpu/pkg/plugin"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
)

func gpuNode(i int32) *api.LinuxDevice {
	return &api.LinuxDevice{Path: "/dev/nvidia" + string(rune('0'+i)), Type: "c", Major: 195, Minor: int64(i)}
}

// TestUnservedStopped: nri-gpu comes back (Synchronize) to running
// containers the runtime created while it was away. Each that asks for
// devices it lacks, asks in a way nri-gpu refuses, or that the policy
// refuses, is stopped with the reason logged and told in the pod's
// events, so that kubelet creates it again through nri-gpu; one that has
// all it asks for (the runtime's own CDI injected it) runs on and holds
// its device; one that asks for nothing, one nri-gpu created and one
// already stopped are left alone.
func TestUnservedStopped(t *testing.T) {
	const cfg = "policy: {namespaces: [tenant], maxDevicesPerPod: 1, exclusive: true}"
	for _, tc := range []struct {
		name      string
		namespace string
		pod, ctr  map[string]string
		devices   []*api.LinuxDevice
		state     api.ContainerState
		stopped   string // the reason logged, "" when left alone
		holds     string // a GPU then held: another pod is refused it
	}{
		{name: "named and lacking it", pod: map[string]string{"gpus.nri-gpu.io": "0"},
			stopped: "created while nri-gpu was not serving, without nvidia.com/gpu=0"},
		{name: "counted and lacking it", pod: map[string]string{"gpu-count.nri-gpu.io": "1"},
			stopped: "without 1 of the 1 devices it counts"},
		{name: "counted and one of two", pod: map[string]string{"gpu-count.nri-gpu.io": "2"}, devices: []*api.LinuxDevice{gpuNode(1)},
			stopped: "without 1 of the 2 devices it counts"},
		{name: "device plugin's and lacking it", ctr: map[string]string{"cdi.k8s.io/nri-gpu_nvidia.com-gpu": "nvidia.com/gpu=1"},
			stopped: "without nvidia.com/gpu=1"},
		{name: "refused namespace", namespace: "other", pod: map[string]string{"gpus.nri-gpu.io": "0"}, devices: []*api.LinuxDevice{gpuNode(0)},
			stopped: "the admission refuses what it asks for"},
		{name: "unreadable ask", pod: map[string]string{"gpus.nri-gpu.io": "0,,../x"},
			stopped: "what it asks for is refused"},
		{name: "named and injected by the runtime", pod: map[string]string{"gpus.nri-gpu.io": "1"}, devices: []*api.LinuxDevice{gpuNode(1)},
			holds: "1"},
		{name: "counted and injected by the runtime", pod: map[string]string{"gpu-count.nri-gpu.io": "1"}, devices: []*api.LinuxDevice{gpuNode(1)},
			holds: "1"}, // the GPU it has, not the first free
		{name: "asks nothing"},
		{name: "nri-gpu's own", pod: map[string]string{"gpus.nri-gpu.io": "0"}, ctr: map[string]string{plugin.DevicesAnnotation: "nvidia.com/gpu=0"},
			devices: []*api.LinuxDevice{gpuNode(0)}, holds: "0"},
		{name: "already stopped", pod: map[string]string{"gpus.nri-gpu.io": "0"}, state: api.ContainerState_CONTAINER_STOPPED},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var events []link.Event
			p, hook := loggedAtStart(t, cfg, plugin.WithSpecDirs([]string{gpuSpecDir(t, 2)}), plugin.WithEvents(eventsTo(&events)))
			var stopped []string
			p.StopWith(func(c *api.Container) error { stopped = append(stopped, c.GetId()); return nil })
			pod := gpuPod("a", tc.pod)
			pod.Uid = "uid-a"
			if tc.namespace != "" {
				pod.Namespace = tc.namespace
			}
			ctr := ctrOf(pod, tc.ctr)
			ctr.Linux.Devices = tc.devices
			if tc.state != 0 {
				ctr.State = tc.state
			}
			if _, err := p.Synchronize(context.Background(), []*api.PodSandbox{pod}, []*api.Container{ctr}); err != nil {
				t.Fatal(err)
			}
			logs := entries(hook, logrus.WarnLevel, "stopped the container, to be created again through nri-gpu")
			switch {
			case tc.stopped == "" && (len(stopped) > 0 || len(logs) > 0):
				t.Errorf("stopped %v, logged %d; want it left running", stopped, len(logs))
			case tc.stopped != "" && (len(stopped) != 1 || stopped[0] != ctr.GetId() || len(logs) != 1):
				t.Errorf("stopped %v, logged %d; want container %s stopped once, and said", stopped, len(logs), ctr.GetId())
			case tc.stopped != "":
				testutil.ErrorSays(t, errors.New(logs[0].Message), tc.stopped)
				if logs[0].Data["pod"] != "a" || logs[0].Data["container"] != "c" {
					t.Errorf("logged for %v", logs[0].Data)
				}
			}
			// The pod's users are told, in its events, as the log says.
			switch {
			case tc.stopped == "" && len(events) > 0:
				t.Errorf("events %+v; want none", events)
			case tc.stopped != "" && len(events) != 1:
				t.Errorf("events %+v; want one", events)
			case tc.stopped != "":
				e := events[0]
				if e.Reason != plugin.StoppedReason || e.Namespace != pod.Namespace || e.Pod != "a" || e.UID != "uid-a" || e.Container != "c" {
					t.Errorf("event %+v: want %s of container c of pod %s/a (uid-a)", e, plugin.StoppedReason, pod.Namespace)
				}
				testutil.ErrorSays(t, errors.New(e.Note), "nri-gpu stopped container c, to be created again through nri-gpu", tc.stopped)
			}
			if tc.holds != "" {
				other := gpuPod("b", map[string]string{"gpus.nri-gpu.io": tc.holds})
				_, _, err := p.CreateContainer(context.Background(), other, ctrOf(other, nil))
				testutil.ErrorSays(t, err, "held by pod tenant/a")
			}
		})
	}
}

// TestUnservedNotStopped: a container that cannot be stopped is said to
// run on, with the reason it should not and the error, in the log and
// the pod's events.
func TestUnservedNotStopped(t *testing.T) {
	var events []link.Event
	p, hook := loggedAtStart(t, "", plugin.WithSpecDirs([]string{gpuSpecDir(t, 1)}), plugin.WithEvents(eventsTo(&events)))
	p.StopWith(func(*api.Container) error { return errors.New("operation not permitted") })
	pod := gpuPod("a", map[string]string{"gpus.nri-gpu.io": "0"})
	if _, err := p.Synchronize(context.Background(), []*api.PodSandbox{pod}, []*api.Container{ctrOf(pod, nil)}); err != nil {
		t.Fatal(err)
	}
	got := entries(hook, logrus.ErrorLevel, "still runs")
	if len(got) != 1 {
		t.Fatalf("logged %d errors saying it still runs", len(got))
	}
	testutil.ErrorSays(t, errors.New(got[0].Message), "without nvidia.com/gpu=0", "operation not permitted")
	if len(events) != 1 || events[0].Reason != plugin.NotStoppedReason {
		t.Fatalf("events %+v; want one %s", events, plugin.NotStoppedReason)
	}
	testutil.ErrorSays(t, errors.New(events[0].Note), "could not stop container c", "without nvidia.com/gpu=0", "operation not permitted")
}

// asked is a DRA driver that is not running for its first down
// questions, and counts them.
type asked struct {
	link.Finder
	mu          sync.Mutex
	calls, down int
}

func (a *asked) Uses(ctx context.Context, pod link.PodRef, ctr string) ([]link.ClaimUse, error) {
	a.mu.Lock()
	a.calls++
	n := a.calls
	a.mu.Unlock()
	if n <= a.down {
		return nil, link.ErrNotRunning
	}
	return a.Finder.Uses(ctx, pod, ctr)
}

func (a *asked) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.calls
}

// TestUnservedClaims: nri-gpu comes back (Synchronize) to running
// containers the runtime created while it was away, with claim c
// prepared on GPU 1 for a pod of namespace tenant. Once its DRA driver
// answers (it starts after nri-gpu), each container that uses a claim
// and lacks its devices, or names a claim not reserved for its pod, is
// stopped with the reason logged, so that kubelet creates it again
// through nri-gpu; one that has the claim's device (the runtime's own
// CDI injected it), one that uses none, and those of pods that can use
// no prepared claim (another namespace, asked nothing) run on.
func TestUnservedClaims(t *testing.T) {
	uses := []link.ClaimUse{{UID: "uid-c", Namespace: "tenant", Name: "c"}}
	for _, tc := range []struct {
		name      string
		namespace string
		uses      []link.ClaimUse
		err       error
		down      int // questions the driver is not running for
		devices   []*api.LinuxDevice
		ours      bool
		nodeless  bool   // the claim also has a device of no device node
		stopped   string // the reason logged, "" when left alone
		asks      bool   // the driver is asked
	}{
		{name: "uses the claim and lacks its GPU", uses: uses, asks: true,
			stopped: "created while nri-gpu was not serving, without the devices of claim tenant/c"},
		{name: "lacks it and the driver is up later", uses: uses, down: 2, asks: true,
			stopped: "without the devices of claim tenant/c"},
		{name: "a claim not prepared", uses: []link.ClaimUse{{UID: "uid-x", Namespace: "tenant", Name: "x"}}, asks: true,
			stopped: "without claim tenant/x"},
		{name: "a claim not reserved for its pod", err: fmt.Errorf("claim tenant/d: %w", link.ErrNotReserved), asks: true,
			stopped: "names a claim not reserved for its pod"},
		{name: "injected by the runtime", uses: uses, devices: []*api.LinuxDevice{gpuNode(1)}, asks: true},
		{name: "injected by the runtime with a device of no node", uses: uses, devices: []*api.LinuxDevice{gpuNode(1)}, nodeless: true, asks: true},
		{name: "uses no claim", asks: true},
		{name: "another namespace", namespace: "other", uses: uses},
		// Without a record, nri-gpu's annotation is not read back: the
		// container is checked as any other.
		{name: "nri-gpu's annotation, no record", uses: uses, ours: true, asks: true,
			stopped: "without the devices of claim tenant/c"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &finder{uses: map[string][]link.ClaimUse{"a/c": tc.uses}, errs: map[string]error{"a": tc.err}}
			driver := &asked{Finder: f, down: tc.down}
			dirs := []string{gpuSpecDir(t, 2)}
			allocated := []link.Allocated{{CDI: "nvidia.com/gpu=1", Requests: []string{"gpus"}}}
			if tc.nodeless {
				dirs = append(dirs, specDirWith(t, t.TempDir(), "env.yaml", "cdiVersion: \"0.6.0\"\nkind: example.com/env\ndevices:\n  - name: e\n    containerEdits:\n      env: [E=1]\n"))
				allocated = append(allocated, link.Allocated{CDI: "example.com/env=e", Requests: []string{"gpus"}})
			}
			p, hook := logged(t, "policy: {namespaces: [tenant, other], devices: [\"*/*\"]}", plugin.WithSpecDirs(dirs), claimsOf(driver))
			if err := p.DRAView(config.Default().Start.DRA).Prepare(context.Background(), claimC, allocated); err != nil {
				t.Fatal(err)
			}
			var (
				mu      sync.Mutex
				stopped []string
			)
			p.StopWith(func(c *api.Container) error {
				mu.Lock()
				defer mu.Unlock()
				stopped = append(stopped, c.GetId())
				return nil
			})
			pod := gpuPod("a", nil)
			if tc.namespace != "" {
				pod.Namespace = tc.namespace
			}
			ctr := ctrOf(pod, nil)
			if tc.ours {
				ctr.Annotations = map[string]string{plugin.DevicesAnnotation: "nvidia.com/gpu=1"}
			}
			ctr.Linux.Devices = tc.devices
			if _, err := p.Synchronize(context.Background(), []*api.PodSandbox{pod}, []*api.Container{ctr}); err != nil {
				t.Fatal(err)
			}
			if tc.asks {
				testutil.Within(t, 10*time.Second, "the driver asked", func() bool { return driver.count() > tc.down })
			}
			logs := func() []*logrus.Entry {
				return entries(hook, logrus.WarnLevel, "stopped the container, to be created again through nri-gpu")
			}
			switch {
			case tc.stopped != "":
				testutil.Within(t, 10*time.Second, "the container stopped", func() bool { return len(logs()) > 0 })
				got := logs()
				testutil.ErrorSays(t, errors.New(got[0].Message), tc.stopped)
			case tc.asks:
				testutil.Within(t, 10*time.Second, "the container checked and left running", func() bool {
					return len(entries(hook, logrus.InfoLevel, "has the devices of the DRA claims it uses: it runs on")) == 1
				})
				// It is the claim's user: the sweep of claims the API
				// server dropped keeps it while the container runs.
				if len(tc.uses) > 0 {
					err := p.DRAView(config.Default().Start.DRA).Release(context.Background(), claimC.UID)
					if !errors.Is(err, policy.ErrClaimInUse) {
						t.Errorf("the sweep released the claim of a running container: %v, want ErrClaimInUse", err)
					}
				}
			}
			mu.Lock()
			defer mu.Unlock()
			switch {
			case tc.stopped == "" && len(stopped) > 0:
				t.Errorf("stopped %v; want it left running", stopped)
			case tc.stopped != "" && (len(stopped) != 1 || stopped[0] != ctr.GetId()):
				t.Errorf("stopped %v; want container %s stopped once", stopped, ctr.GetId())
			}
			if !tc.asks && driver.count() > 0 {
				t.Errorf("the driver was asked %d times; want none", driver.count())
			}
		})
	}
}

// TestUnservedClaimsAfterClose: the claim check after Synchronize, still
// waiting for a DRA driver that does not answer, ends when the plugin is
// closed (it let its record go, and another nri-gpu serves): it asks no
// more and stops nothing.
func TestUnservedClaimsAfterClose(t *testing.T) {
	f := &finder{uses: map[string][]link.ClaimUse{"a/c": {{UID: "uid-c", Namespace: "tenant", Name: "c"}}}}
	driver := &asked{Finder: f, down: 1 << 30}
	p, hook := logged(t, "policy: {namespaces: [tenant], devices: [\"*/*\"]}", plugin.WithSpecDirs([]string{gpuSpecDir(t, 2)}), claimsOf(driver))
	if err := p.DRAView(config.Default().Start.DRA).Prepare(context.Background(), claimC, []link.Allocated{{CDI: "nvidia.com/gpu=1", Requests: []string{"gpus"}}}); err != nil {
		t.Fatal(err)
	}
	var stops atomic.Int32
	p.StopWith(func(*api.Container) error { stops.Add(1); return nil })
	pod := gpuPod("a", nil)
	if _, err := p.Synchronize(context.Background(), []*api.PodSandbox{pod}, []*api.Container{ctrOf(pod, nil)}); err != nil {
		t.Fatal(err)
	}
	testutil.Within(t, 10*time.Second, "the driver asked", func() bool { return driver.count() > 0 })
	p.Close()
	closed := driver.count()
	testutil.Within(t, 10*time.Second, "the check stopped", func() bool {
		return len(entries(hook, logrus.InfoLevel, "stopped checking the claims of containers created while nri-gpu was away")) == 1
	})
	if n := driver.count(); n > closed+1 {
		t.Errorf("the driver was asked %d more times after Close", n-closed)
	}
	if stops.Load() != 0 {
		t.Error("a container was stopped after Close")
	}
	if e := entries(hook, logrus.WarnLevel, "could not tell whether a container"); len(e) != 0 {
		t.Errorf("logged %q after Close", e[0].Message)
	}
}

// eventsTo is an event sink that appends each event to events.
func eventsTo(events *[]link.Event) plugin.EventSink { return appended{events} }

type appended struct{ events *[]link.Event }

func (a appended) Post(e link.Event) { *a.events = append(*a.events, e) }
