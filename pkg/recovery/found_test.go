package recovery_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/adjust"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/recovery"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// reported is a pod reported at Synchronize, its sandbox process pid.
func reported(id string, pid uint32) *api.PodSandbox {
	return &api.PodSandbox{Id: id, Namespace: "team", Name: "pod-" + id, Uid: "uid-" + id, Pid: pid}
}

// container is a container of pod id with the device nodes of gpus,
// its annotations annotations.
func container(pod, name string, state api.ContainerState, annotations map[string]string, gpus ...int) *api.Container {
	c := &api.Container{Id: pod + "-" + name, PodSandboxId: pod, Name: name, State: state, Annotations: annotations, Linux: &api.LinuxContainer{}}
	for _, g := range gpus {
		c.Linux.Devices = append(c.Linux.Devices, &api.LinuxDevice{Path: fmt.Sprintf("/dev/nvidia%d", g), Type: "c", Major: 195, Minor: int64(g)})
	}
	return c
}

const running = api.ContainerState_CONTAINER_RUNNING

// created gives c its creation time.
func created(c *api.Container, at int64) *api.Container {
	c.CreatedAt = at
	return c
}

func TestSort(t *testing.T) {
	pods := []*api.PodSandbox{reported("runs", 1), reported("stopped", 1), reported("empty", 7), reported("gone", 0)}
	containers := []*api.Container{
		container("runs", "a", running, nil),
		container("runs", "b", api.ContainerState_CONTAINER_STOPPED, nil),
		container("stopped", "a", api.ContainerState_CONTAINER_STOPPED, nil),
	}
	got := recovery.Sort(pods, containers)
	// A pod with a running container, or none reported and its sandbox
	// running, may run containers; one whose containers all stopped, or
	// with none and no sandbox process, cannot.
	var live []string
	for id := range got.Live {
		live = append(live, id)
	}
	slices.Sort(live)
	if want := []string{"empty", "runs"}; !slices.Equal(live, want) {
		t.Errorf("live pods %v, want %v", live, want)
	}
	if p := got.Live["runs"]; p != (policy.Pod{ID: "runs", Namespace: "team", Name: "pod-runs"}) {
		t.Errorf("live pod %+v: want its ID, namespace and name", p)
	}
	if len(got.Sandboxes) != len(pods) {
		t.Errorf("%d sandboxes, want every pod reported (%d)", len(got.Sandboxes), len(pods))
	}
	if !got.WithContainers["runs"] || !got.WithContainers["stopped"] || got.WithContainers["empty"] {
		t.Errorf("with containers %v, want runs and stopped", got.WithContainers)
	}
	var alone []string
	for _, pod := range got.Alone() {
		alone = append(alone, pod.GetId())
	}
	if want := []string{"empty"}; !slices.Equal(alone, want) {
		t.Errorf("live pods alone %v, want %v", alone, want)
	}
}

func TestFind(t *testing.T) {
	ours := map[string]string{adjust.DevicesAnnotation: "nvidia.com/gpu=0"}
	gpu := func(i int) string { return fmt.Sprintf("nvidia.com/gpu=%d", i) }
	for _, tc := range []struct {
		name       string
		containers []*api.Container
		// asks is what pod p asks for, by its annotation; count how many
		// it counts.
		asks, count string
		recorded    []policy.Holding
		// record says the record was read back whole.
		record  bool
		claimed []int
		// held are the devices held, by pod, as "pod:device"; stop the
		// containers to stop, with words of why; others the running
		// containers nri-gpu did not create (or, with no record, may not
		// have); admit those of them the admission is to judge.
		held, others, admit []string
		stop                map[string]string
	}{{
		name:       "ours, recorded",
		containers: []*api.Container{container("p", "c", running, ours, 0)},
		recorded:   []policy.Holding{{Pod: policy.Pod{ID: "p"}, Named: []specs.Device{{Name: gpu(0)}}}},
		record:     true,
		held:       []string{"p:" + gpu(0)},
	}, {
		name:       "no record: nri-gpu's annotation is not read back, the container judged by what it asks",
		containers: []*api.Container{container("p", "c", running, ours, 1)},
		asks:       gpu(1),
		others:     []string{"p/c"},
		admit:      []string{"p/c"},
	}, {
		name:       "no record: the record's holdings kept (a newer record's claims), its pod's containers judged",
		containers: []*api.Container{container("p", "c", running, ours, 1)},
		recorded:   []policy.Holding{{Pod: policy.Pod{ID: "p"}, Claims: []string{"u"}}},
		count:      "1",
		others:     []string{"p/c"},
		admit:      []string{"p/c"},
	}, {
		name:     "the record of a pod no longer live holds nothing",
		recorded: []policy.Holding{{Pod: policy.Pod{ID: "gone"}, Named: []specs.Device{{Name: gpu(0)}}}},
	}, {
		name:       "stopped containers hold nothing",
		containers: []*api.Container{container("p", "c", api.ContainerState_CONTAINER_STOPPED, ours, 0), container("p", "d", running, nil)},
		others:     []string{"p/d"},
	}, {
		name:       "a device of a prepared claim is the claim's",
		containers: []*api.Container{container("p", "c", running, nil, 0)},
		count:      "1",
		claimed:    []int{0},
		stop:       map[string]string{"p/c": "without 1 of the 1 devices it counts"},
	}, {
		name:       "not ours, asking for nothing, with a GPU's nodes: holds nothing",
		containers: []*api.Container{container("p", "priv", running, nil, 0, 1)},
		others:     []string{"p/priv"},
	}, {
		name:       "not ours, has what it asks for: judged by the admission",
		containers: []*api.Container{container("p", "c", running, nil, 1)},
		asks:       gpu(1),
		others:     []string{"p/c"},
		admit:      []string{"p/c"},
	}, {
		name:       "ours, with a record: held as the record says, not every GPU it sees",
		containers: []*api.Container{container("p", "priv", running, ours, 0, 1)},
		recorded:   []policy.Holding{{Pod: policy.Pod{ID: "p"}, Named: []specs.Device{{Name: gpu(0)}}}},
		record:     true,
		held:       []string{"p:" + gpu(0)},
	}, {
		name:       "nri-gpu's annotation on a pod the record does not hold: not nri-gpu's, judged",
		containers: []*api.Container{container("p", "forged", running, ours, 1)},
		asks:       gpu(1),
		record:     true,
		others:     []string{"p/forged"},
		admit:      []string{"p/forged"},
	}, {
		name:       "a forged annotation, asking for nothing: holds nothing",
		containers: []*api.Container{container("p", "forged", running, ours, 0)},
		record:     true,
		others:     []string{"p/forged"},
	}, {
		name:       "judged oldest first, not by name",
		containers: []*api.Container{created(container("p", "a", running, nil, 1), 20), created(container("p", "b", running, nil, 1), 10)},
		asks:       gpu(1),
		others:     []string{"p/b", "p/a"},
		admit:      []string{"p/b", "p/a"},
	}, {
		name:       "with a record, a container of a recorded pod, then one judged",
		containers: []*api.Container{created(container("p", "ours", running, ours, 0), 1), created(container("p", "away", running, nil, 1), 2)},
		recorded:   []policy.Holding{{Pod: policy.Pod{ID: "p"}, Named: []specs.Device{{Name: gpu(0)}}}},
		record:     true,
		asks:       gpu(1),
		held:       []string{"p:" + gpu(0)},
		others:     []string{"p/away"},
		admit:      []string{"p/away"},
	}, {
		name:       "no record: forged annotations, asking for nothing, hold nothing",
		containers: []*api.Container{created(container("p", "none", running, ours), 1), created(container("p", "d", running, ours, 1), 2)},
		others:     []string{"p/none", "p/d"},
	}, {
		name:       "not ours, lacks what it asks for",
		containers: []*api.Container{container("p", "c", running, nil, 0)},
		asks:       gpu(1),
		stop:       map[string]string{"p/c": "without " + gpu(1)},
	}, {
		name:       "not ours, its ask unreadable",
		containers: []*api.Container{container("p", "c", running, nil)},
		asks:       "nvidia.com/gpu=0,,",
		stop:       map[string]string{"p/c": "what it asks for is refused"},
	}, {
		name:       "a container stopped, the next one judged",
		containers: []*api.Container{container("p", "c", running, nil, 0), container("p", "d", running, ours, 1)},
		asks:       gpu(1),
		others:     []string{"p/d"},
		admit:      []string{"p/d"},
		stop:       map[string]string{"p/c": "without " + gpu(1)},
	}, {
		name:       "a container with no device, the next one asking nothing",
		containers: []*api.Container{container("p", "c", running, nil), container("p", "d", running, ours, 1)},
		others:     []string{"p/c", "p/d"},
	}, {
		name:       "not ours, a count it has",
		containers: []*api.Container{container("p", "c", running, nil, 1)},
		count:      "1",
		others:     []string{"p/c"},
		admit:      []string{"p/c"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			snap := testutil.Snapshot(t, testutil.GPUSpec(2))
			parser, err := policy.NewParser("nvidia.com/gpu", true)
			if err != nil {
				t.Fatal(err)
			}
			judge := recovery.Judge{Parser: parser, Snap: snap, Kind: "nvidia.com/gpu", Record: tc.record}
			var claimed []specs.Device
			for _, g := range tc.claimed {
				claimed = append(claimed, snap.Footprints([]string{gpu(g)})...)
			}
			pod := reported("p", 1)
			pod.Annotations = map[string]string{}
			if tc.asks != "" {
				pod.Annotations[policy.AnnotationKey] = tc.asks
			}
			if tc.count != "" {
				pod.Annotations[policy.CountAnnotationKey] = tc.count
			}
			reported := recovery.Sort([]*api.PodSandbox{pod}, tc.containers)
			found := judge.Find(reported, tc.containers, tc.recorded, claimed)
			var held, others, admit []string
			for _, h := range found.Holdings {
				for _, d := range h.Named {
					held = append(held, h.Pod.ID+":"+d.Name)
				}
			}
			for _, h := range found.Holdings {
				if len(h.Named)+len(h.Counted)+len(h.Claims) == 0 {
					t.Errorf("a holding of nothing: %+v", h)
				}
			}
			for _, s := range found.Others {
				others = append(others, s.Pod.GetId()+"/"+s.Ctr.GetName())
			}
			for _, s := range found.Admit {
				admit = append(admit, s.Pod.GetId()+"/"+s.Ctr.GetName())
			}
			if !slices.Equal(held, tc.held) || !slices.Equal(others, tc.others) || !slices.Equal(admit, tc.admit) {
				t.Errorf("held %v, others %v, judged %v; want %v, %v, %v", held, others, admit, tc.held, tc.others, tc.admit)
			}
			if len(found.Stop) != len(tc.stop) {
				t.Fatalf("stopped %+v, want %v", found.Stop, tc.stop)
			}
			for _, s := range found.Stop {
				if want, ok := tc.stop[s.Pod.GetId()+"/"+s.Ctr.GetName()]; !ok || !strings.Contains(s.Why, want) {
					t.Errorf("stopped %s/%s because %q; want %q", s.Pod.GetId(), s.Ctr.GetName(), s.Why, want)
				}
			}
		})
	}
}

func TestMayUseClaims(t *testing.T) {
	found := []recovery.Stopping{
		{Pod: &api.PodSandbox{Namespace: "team"}, Ctr: &api.Container{Name: "a"}},
		{Pod: &api.PodSandbox{Namespace: "other"}, Ctr: &api.Container{Name: "b"}},
	}
	claims := []policy.ClaimHolding{{Claim: policy.Claim{UID: "u", Namespace: "team", Name: "c"}}}
	got := recovery.MayUseClaims(slices.Clone(found), claims)
	if len(got) != 1 || got[0].Ctr.GetName() != "a" {
		t.Errorf("may use claims: %+v; want container a of namespace team", got)
	}
	if got := recovery.MayUseClaims(slices.Clone(found), nil); len(got) != 0 {
		t.Errorf("with no claim prepared: %+v; want none", got)
	}
}

// finder answers Uses with uses and err, counting its questions.
type finder struct {
	uses  []link.ClaimUse
	err   error
	asked int
}

func (f *finder) Uses(context.Context, link.PodRef, string) ([]link.ClaimUse, error) {
	f.asked++
	return f.uses, f.err
}

func TestClaimCheck(t *testing.T) {
	snap := testutil.Snapshot(t, testutil.GPUSpec(2))
	pol := policy.New(config.Policy{Devices: config.DefaultDevices})
	pool := policy.NewAllocations()
	dev := snap.Footprints([]string{"nvidia.com/gpu=1"})[0]
	claim := policy.Claim{UID: "u1", Namespace: "team", Name: "gpu"}
	// A claim's device of no node is not seen in a container, and not
	// looked for.
	nodeless := policy.ClaimHolding{Claim: policy.Claim{UID: "u3", Namespace: "team", Name: "nodeless"},
		Devices: []policy.ClaimDevice{{Device: snap.Footprints([]string{"nvidia.com/gpu=0"})[0]}, {Device: specs.Device{Name: "nvidia.com/gpu=none"}}}}
	if err := pool.RestoreClaims(pol, []policy.ClaimHolding{{Claim: claim, Devices: []policy.ClaimDevice{{Device: dev, Requests: []string{"r"}}}}, nodeless}); err != nil {
		t.Fatal(err)
	}
	uses := []link.ClaimUse{{UID: "u1", Namespace: "team", Name: "gpu"}}
	unknown := []link.ClaimUse{{UID: "u2", Namespace: "team", Name: "elsewhere"}}
	down := errors.New("the API server does not answer")
	for _, tc := range []struct {
		name   string
		finder *finder
		gpus   []int
		// why has words of why the container is to be stopped ("" when
		// it runs on); err the error; asked how often the finder is
		// asked (within a deadline shorter than one retry: once).
		why, also string
		err       error
		asked     int
	}{
		{name: "has the claim's devices", finder: &finder{uses: uses}, gpus: []int{1}, asked: 1},
		{name: "lacks them", finder: &finder{uses: uses}, gpus: []int{0}, why: "without the devices of claim team/gpu", asked: 1},
		{name: "a claim not prepared here", finder: &finder{uses: unknown}, gpus: []int{1}, why: "claim team/elsewhere", asked: 1},
		{name: "a claim not prepared here, and one lacked", finder: &finder{uses: append(slices.Clone(unknown), uses...)}, gpus: []int{0},
			why: "claim team/elsewhere", also: "the devices of claim team/gpu", asked: 1},
		{name: "a claim with a device of no node", finder: &finder{uses: []link.ClaimUse{{UID: "u3", Namespace: "team", Name: "nodeless"}}}, gpus: []int{0}, asked: 1},
		{name: "uses none", finder: &finder{}, asked: 1},
		{name: "names a claim not reserved for its pod", finder: &finder{err: fmt.Errorf("claim x: %w", link.ErrNotReserved)}, why: "not reserved for its pod", asked: 1},
		{name: "cannot tell", finder: &finder{err: down}, err: down, asked: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := recovery.Stopping{Pod: reported("p", 1), Ctr: container("p", "c", running, nil, tc.gpus...)}
			check := recovery.ClaimCheck{Finder: tc.finder, Pool: pool}
			why, uses, err := check.Unserved(context.Background(), s, time.Now().Add(time.Millisecond))
			if tc.finder.err == nil && !slices.EqualFunc(uses, tc.finder.uses, func(a, b link.ClaimUse) bool { return a.UID == b.UID }) {
				t.Errorf("the claims it uses: %v, want the driver's %v", uses, tc.finder.uses)
			}
			if !errors.Is(err, tc.err) || (tc.why == "") != (why == "") || !strings.Contains(why, tc.why) || !strings.Contains(why, tc.also) || tc.finder.asked != tc.asked {
				t.Errorf("why %q, error %v, asked %d times; want %q, %v, %d", why, err, tc.finder.asked, tc.why, tc.err, tc.asked)
			}
		})
	}
}

// TestClaimCheckRetries: a DRA driver that cannot tell yet is asked
// again until it can, within the deadline; and no more once the context
// is done.
func TestClaimCheckRetries(t *testing.T) {
	s := recovery.Stopping{Pod: reported("p", 1), Ctr: container("p", "c", running, nil)}
	f := &flaky{fails: 1}
	why, _, err := recovery.ClaimCheck{Finder: f}.Unserved(context.Background(), s, time.Now().Add(time.Minute))
	if err != nil || why != "" || f.asked != 2 {
		t.Errorf("why %q, error %v, asked %d times; want it to run on, asked twice", why, err, f.asked)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	f = &flaky{fails: 100}
	if _, _, err := (recovery.ClaimCheck{Finder: f}).Unserved(ctx, s, time.Now().Add(time.Minute)); err == nil || f.asked != 1 {
		t.Errorf("with its context done: error %v, asked %d times; want the driver's error, asked once", err, f.asked)
	}
}

// flaky fails its first fails questions, then tells no claim used.
type flaky struct{ fails, asked int }

func (f *flaky) Uses(context.Context, link.PodRef, string) ([]link.ClaimUse, error) {
	f.asked++
	if f.asked <= f.fails {
		return nil, errors.New("not yet")
	}
	return nil, nil
}
