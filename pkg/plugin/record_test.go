package plugin_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"
	"github.com/sirupsen/logrus"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/dra"
	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
	"github.com/nri-gpu/nri-gpu/pkg/metrics"
	"github.com/nri-gpu/nri-gpu/pkg/plugin"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/record"
)

// damages are what a node does to a state file: a crash mid-write, a disk
// error, a restore from a backup of another release, an operator's
// mistake. Each gets the file as the plugin wrote it and breaks it in
// place.
var damages = []struct {
	name   string
	damage func(t *testing.T, path string, good []byte)
}{
	{"corrupt", func(t *testing.T, path string, good []byte) {
		writeFile(t, path, append([]byte{0, 0xff, '{'}, good[3:]...))
	}},
	{"truncated", func(t *testing.T, path string, good []byte) { writeFile(t, path, good[:len(good)/2]) }},
	{"empty", func(t *testing.T, path string, _ []byte) { writeFile(t, path, nil) }},
	{"other version", func(t *testing.T, path string, good []byte) {
		writeFile(t, path, bytes.Replace(good, []byte(`"version":1`), []byte(`"version":2`), 1))
	}},
	{"oversized", func(t *testing.T, path string, good []byte) {
		// Valid JSON, padded past the cap on what is read.
		writeFile(t, path, append(bytes.Repeat([]byte(" "), 17<<20), good...))
	}},
	{"symlink", func(t *testing.T, path string, good []byte) {
		elsewhere := filepath.Join(t.TempDir(), "allocations.json")
		writeFile(t, elsewhere, good)
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(elsewhere, path); err != nil {
			t.Fatal(err)
		}
	}},
	{"directory", func(t *testing.T, path string, _ []byte) {
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(path, 0o700); err != nil {
			t.Fatal(err)
		}
	}},
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestDamagedRecordFailsClosed: pod a holds GPU 0 for a count request,
// pod n GPU 1 by name; nri-gpu restarts on a state file made unusable in
// each way a node can, with policy.exclusive on and off. In every case
// each running container is judged by the admission as a new one (what
// it asks for, the GPUs it has): pod a holds GPU 0 for its count, which
// no other pod gets, and pod n GPU 1 by name, which another pod gets by
// name only where policy.exclusive is off, as before the restart; the
// pods keep theirs, the damaged file is kept beside a new, valid record
// that keeps the holdings across a further restart, and a GPU comes free
// when its pod is removed.
func TestDamagedRecordFailsClosed(t *testing.T) {
	for _, exclusive := range []string{"false", "true"} {
		for _, d := range damages {
			t.Run(d.name+"/exclusive="+exclusive, func(t *testing.T) {
				cfg := "policy: {exclusive: " + exclusive + "}"
				r := runtime(t, cfg)
				a := gpuPod("a", map[string]string{"gpu-count.nri-gpu.io": "1"})
				n := gpuPod("n", map[string]string{"gpus.nri-gpu.io": "1"})
				for _, pod := range []*api.PodSandbox{a, n} {
					if _, err := r.create(pod, ctrOf(pod, nil)); err != nil {
						t.Fatal(err)
					}
				}
				r.stopPlugin()
				good, err := os.ReadFile(r.stateFile)
				if err != nil {
					t.Fatal(err)
				}
				d.damage(t, r.stateFile, good)
				r.stopPlugin = r.connect(t, cfg)

				named := func(name, gpu string) error {
					pod := gpuPod(name, map[string]string{"gpus.nri-gpu.io": gpu})
					_, err := r.create(pod, ctrOf(pod, nil))
					return err
				}
				testutil.ErrorSays(t, named("b", "0"), "held by pod tenant/a", "count request")
				shared := func(name string) {
					t.Helper()
					err := named(name, "1")
					if exclusive == "true" {
						testutil.ErrorSays(t, err, "held by pod tenant/n")
					} else if err != nil {
						t.Errorf("GPU 1 by name beside pod n, exclusive off: %v", err)
					}
				}
				shared("c")
				again := ctrOf(a, nil)
				again.Id, again.Name = "a-2", "second"
				if adj, err := r.create(a, again); err != nil || !slices.Equal(devicePaths(adj), []string{"/dev/nvidia0"}) {
					t.Errorf("pod a's next container: %v, %v; want GPU 0 again", devicePaths(adj), err)
				}

				aside, _ := filepath.Glob(r.stateFile + ".damaged-*")
				if len(aside) != 1 {
					t.Fatalf("damaged records kept: %v, want one", aside)
				}
				if d.name != "directory" && d.name != "symlink" {
					if kept, err := os.ReadFile(aside[0]); err != nil || bytes.Equal(kept, good) {
						t.Errorf("the damaged record kept is %d bytes (%v), want the damaged file itself", len(kept), err)
					}
				}
				var rec struct {
					Version int `json:"version"`
					Pods    []struct {
						Name    string            `json:"name"`
						Named   []json.RawMessage `json:"named"`
						Counted []json.RawMessage `json:"counted"`
						Sole    []string          `json:"sole"`
					} `json:"pods"`
				}
				if data, err := os.ReadFile(r.stateFile); err != nil || json.Unmarshal(data, &rec) != nil || rec.Version != 1 || len(rec.Pods) < 2 {
					t.Fatalf("the new record: %+v, %v; want version 1 with pods a and n", rec, err)
				}
				for _, p := range rec.Pods {
					want := map[string][2]int{"a": {0, 1}, "n": {1, 0}}[p.Name]
					if p.Name != "a" && p.Name != "n" {
						continue
					}
					if len(p.Named) != want[0] || len(p.Counted) != want[1] || len(p.Sole) != 0 {
						t.Errorf("the new record has pod %s hold %d by name, %d counted, %v alone; want %v, none alone", p.Name, len(p.Named), len(p.Counted), p.Sole, want)
					}
				}

				// The new record keeps it so.
				r.restart(t, cfg)
				shared("d")
				r.removePod(t, a)
				if err := named("e", "0"); err != nil {
					t.Errorf("GPU 0, pod a removed: %v", err)
				}
			})
		}
	}
}

// TestRebuiltRecordMetric: nri_gpu_record_rebuilt is 1 for a plugin that
// started on an unusable record, 0 for one that started on a good one.
func TestRebuiltRecordMetric(t *testing.T) {
	for _, tc := range []struct {
		record []byte
		want   string
	}{
		{[]byte(`{"version":1,"pods":[]}`), "nri_gpu_record_rebuilt 0"},
		{[]byte(`{"version":1,"pods":[`), "nri_gpu_record_rebuilt 1"},
	} {
		state := filepath.Join(t.TempDir(), "allocations.json")
		writeFile(t, state, tc.record)
		m, p := metricsPlugin(t, plugin.WithStateFile(state))
		pod := gpuPod("a", map[string]string{"gpus.nri-gpu.io": "0"})
		if _, _, err := p.CreateContainer(context.Background(), pod, ctrOf(pod, nil)); err != nil {
			t.Fatal(err)
		}
		if got := scrape(t, m); !strings.Contains(got, "\n"+tc.want+"\n") {
			t.Errorf("record %q: metrics lack %q:\n%s", tc.record, tc.want, got)
		}
	}
}

// TestFoundAnnotationNotReadBack: nri-gpu's own annotation on a running
// container (a tenant may forge it) is read back with no record, or on a
// pod the record does not have, never: a container that asks for
// nothing holds nothing, whatever GPU it has, and another pod is given
// that GPU; nothing is rebuilt (nri_gpu_record_rebuilt 0). One that asks
// for the GPU it has is judged as a new one and holds it.
func TestFoundAnnotationNotReadBack(t *testing.T) {
	for _, tc := range []struct {
		record, asks bool
	}{{false, false}, {true, false}, {false, true}} {
		t.Run(fmt.Sprintf("record=%v_asks=%v", tc.record, tc.asks), func(t *testing.T) {
			var opts []plugin.Option
			if tc.record {
				state := filepath.Join(t.TempDir(), "allocations.json")
				writeFile(t, state, []byte(`{"version":1,"pods":[]}`))
				opts = append(opts, plugin.WithStateFile(state))
			}
			m := metrics.New()
			p, _ := loggedAtStart(t, "policy: {exclusive: true}", append(opts, plugin.WithSpecDirs([]string{gpuSpecDir(t, 1)}), plugin.WithMetrics(m))...)
			var asks map[string]string
			if tc.asks {
				asks = map[string]string{"gpus.nri-gpu.io": "0"}
			}
			pod := gpuPod("a", asks)
			c := ctrOf(pod, map[string]string{plugin.DevicesAnnotation: "nvidia.com/gpu=0"})
			c.Linux.Devices = []*api.LinuxDevice{{Path: "/dev/nvidia0", Type: "c", Major: 195, Minor: 0}}
			if _, err := p.Synchronize(context.Background(), []*api.PodSandbox{pod}, []*api.Container{c}); err != nil {
				t.Fatal(err)
			}
			if got := scrape(t, m); !strings.Contains(got, "\nnri_gpu_record_rebuilt 0\n") {
				t.Errorf("metrics lack nri_gpu_record_rebuilt 0:\n%s", got)
			}
			other := gpuPod("b", map[string]string{"gpus.nri-gpu.io": "0"})
			_, _, err := p.CreateContainer(context.Background(), other, ctrOf(other, nil))
			if !tc.asks && err != nil {
				t.Errorf("GPU 0 refused beside a container that asks for nothing: %v", err)
			}
			if tc.asks {
				testutil.ErrorSays(t, err, "held by pod tenant/a")
			}
		})
	}
}

// TestSecondPluginRefused: a second nri-gpu given the state file another
// one holds refuses to start, naming the file and the holder's pid; the
// first keeps recording; once it has stopped, a new one starts.
func TestSecondPluginRefused(t *testing.T) {
	state := filepath.Join(t.TempDir(), "allocations.json")
	// A lock file a dead nri-gpu of a long pid left.
	writeFile(t, state+".lock", []byte("123456789012\n"))
	first, _ := logged(t, "", plugin.WithSpecDirs([]string{gpuSpecDir(t, 1)}), plugin.WithStateFile(state))
	if holder, err := os.ReadFile(state + ".lock"); err != nil || string(holder) != strconv.Itoa(os.Getpid())+"\n" {
		t.Errorf("the lock file holds %q (%v), want this process's pid alone", holder, err)
	}
	_, err := plugin.New(config.Default(), discard(), plugin.WithStateFile(state))
	testutil.ErrorSays(t, err, state, "in use by another nri-gpu", "pid "+strconv.Itoa(os.Getpid()))
	if !errors.Is(err, record.ErrLocked) {
		t.Errorf("%v does not wrap record.ErrLocked", err)
	}
	pod := gpuPod("a", map[string]string{"gpus.nri-gpu.io": "0"})
	if _, _, err := first.CreateContainer(context.Background(), pod, ctrOf(pod, nil)); err != nil {
		t.Fatalf("the first plugin, once a second was refused: %v", err)
	}
	first.Close()
	second, err := plugin.New(config.Default(), discard(), plugin.WithStateFile(state))
	if err != nil {
		t.Fatalf("after the first stopped: %v", err)
	}
	second.Close()
}

// metricsPlugin is a plugin of one GPU with metrics, and the metrics.
func metricsPlugin(t *testing.T, opts ...plugin.Option) (*metrics.Metrics, *plugin.Plugin) {
	t.Helper()
	m := metrics.New()
	p, _ := logged(t, "", append([]plugin.Option{plugin.WithSpecDirs([]string{gpuSpecDir(t, 1)}), plugin.WithMetrics(m)}, opts...)...)
	return m, p
}

// scrape returns what the metrics endpoint serves.
func scrape(t *testing.T, m *metrics.Metrics) string {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	return rec.Body.String()
}

func discard() logrus.FieldLogger {
	log := logrus.New()
	log.SetOutput(io.Discard)
	return log
}

// TestGrantNotRecorded: once the state file cannot be written (its
// directory replaced by a file; a full filesystem in the e2e and
// full-disk tests), a grant is not given: the container's creation fails
// naming the state file and why, nothing is injected and nothing stays
// held, so another pod is refused for the same reason and not as held.
// What needs no new record is still served: the second container of a
// recorded grant, a container asking for nothing. Once the file can be
// written again, the next grant is given.
func TestGrantNotRecorded(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	state := filepath.Join(dir, "allocations.json")
	p, hook := logged(t, "policy: {exclusive: true}", plugin.WithSpecDirs([]string{gpuSpecDir(t, 2)}), plugin.WithStateFile(state))
	create := func(pod *api.PodSandbox, id string) (*api.ContainerAdjustment, error) {
		c := ctrOf(pod, nil)
		c.Id = id
		adj, _, err := p.CreateContainer(context.Background(), pod, c)
		return adj, err
	}
	if _, err := p.Synchronize(context.Background(), nil, nil); err != nil {
		t.Fatal(err)
	}
	recorded := gpuPod("recorded", map[string]string{"gpus.nri-gpu.io": "1"})
	if _, err := create(recorded, "r1"); err != nil {
		t.Fatal(err)
	}
	if n := len(entries(hook, logrus.ErrorLevel, "what pods hold is not kept for a restart")); n != 0 {
		t.Errorf("%d state file errors logged while it could be written", n)
	}

	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	writeFile(t, dir, nil)
	for _, name := range []string{"a", "b"} {
		adj, err := create(gpuPod(name, map[string]string{"gpus.nri-gpu.io": "0"}), name)
		testutil.ErrorSays(t, err, "devices not given", "could not be recorded", "state file "+state, "not a directory")
		if adj != nil {
			t.Errorf("pod %s: adjusted %v with its grant unrecorded", name, adj)
		}
	}
	if n := len(entries(hook, logrus.ErrorLevel, "what pods hold is not kept for a restart")); n == 0 {
		t.Error("the state file's error is not logged")
	}
	if adj, err := create(recorded, "r2"); err != nil || !slices.Equal(devicePaths(adj), []string{"/dev/nvidia1"}) {
		t.Errorf("the recorded pod's second container: %v, %v; want GPU 1", devicePaths(adj), err)
	}
	if _, err := create(gpuPod("plain", nil), "plain"); err != nil {
		t.Errorf("a container asking for nothing: %v", err)
	}

	if err := os.Remove(dir); err != nil {
		t.Fatal(err)
	}
	if adj, err := create(gpuPod("a", map[string]string{"gpus.nri-gpu.io": "0"}), "a"); err != nil || !slices.Equal(devicePaths(adj), []string{"/dev/nvidia0"}) {
		t.Errorf("once the state file can be written: %v, %v; want GPU 0", devicePaths(adj), err)
	}
	data, err := os.ReadFile(state)
	if err != nil || !bytes.Contains(data, []byte(`"id-a"`)) || !bytes.Contains(data, []byte(`"id-recorded"`)) || bytes.Contains(data, []byte(`"id-plain"`)) {
		t.Errorf("the record once writable: %s, %v; want pods a and recorded (not plain, which holds nothing)", data, err)
	}
}

// TestClaimNotRecorded: a DRA claim whose preparation the state file
// cannot keep is not prepared (kubelet tries again): another claim may
// have its GPU meanwhile; with the file writable, the claim is prepared.
func TestClaimNotRecorded(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	p, _ := logged(t, "", plugin.WithSpecDirs([]string{gpuSpecDir(t, 1)}), plugin.WithStateFile(filepath.Join(dir, "allocations.json")))
	if _, err := p.Synchronize(context.Background(), nil, nil); err != nil {
		t.Fatal(err)
	}
	view := p.DRAView(config.Default().Start.DRA)
	gpu := []link.Allocated{{CDI: "nvidia.com/gpu=0"}}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	writeFile(t, dir, nil)
	err := view.Prepare(context.Background(), policy.Claim{UID: "u", Namespace: "tenant", Name: "c"}, gpu)
	testutil.ErrorSays(t, err, "claim tenant/c", "could not be recorded", "not a directory")
	if !errors.Is(err, record.ErrNotRecorded) {
		t.Errorf("%v does not wrap ErrNotRecorded", err)
	}
	if err := os.Remove(dir); err != nil {
		t.Fatal(err)
	}
	if err := view.Prepare(context.Background(), policy.Claim{UID: "v", Namespace: "tenant", Name: "other"}, gpu); err != nil {
		t.Errorf("another claim of the GPU the unrecorded claim did not get: %v", err)
	}
}

// TestUnprepareNotRecorded: kubelet unprepares a claim while the state
// file cannot be written: Unprepare says so (kubelet asks again) and
// the GPU is free at once. nri-gpu is then killed before any later save
// (the record still has the claim) and starts again: the restored claim
// holds the GPU (fail closed) until the DRA driver, starting, finds that
// the API server no longer has the claim and releases it; then a new
// claim of that GPU is prepared, and the record no longer has the old
// one.
func TestUnprepareNotRecorded(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	state := filepath.Join(dir, "allocations.json")
	specDir := gpuSpecDir(t, 1)
	p, _ := logged(t, "", plugin.WithSpecDirs([]string{specDir}), plugin.WithStateFile(state))
	if _, err := p.Synchronize(context.Background(), nil, nil); err != nil {
		t.Fatal(err)
	}
	gpu := []link.Allocated{{CDI: "nvidia.com/gpu=0", Requests: []string{"gpus"}}}
	old := policy.Claim{UID: "uid-old", Namespace: "tenant", Name: "old"}
	if err := p.DRAView(config.Default().Start.DRA).Prepare(context.Background(), old, gpu); err != nil {
		t.Fatal(err)
	}

	// The state directory swapped for a file: every save fails, the
	// record written before stays aside.
	if err := os.Rename(dir, dir+".kept"); err != nil {
		t.Fatal(err)
	}
	writeFile(t, dir, nil)
	err := p.DRAView(config.Default().Start.DRA).Unprepare(context.Background(), old.UID)
	testutil.ErrorSays(t, err, "claim uid-old released", "could not be recorded", "not a directory")
	if !errors.Is(err, record.ErrNotRecorded) {
		t.Errorf("%v does not wrap ErrNotRecorded", err)
	}
	p.Close() // killed: nothing saved since
	if err := os.Remove(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(dir+".kept", dir); err != nil {
		t.Fatal(err)
	}

	p, _ = logged(t, "", plugin.WithSpecDirs([]string{specDir}), plugin.WithStateFile(state))
	if _, err := p.Synchronize(context.Background(), nil, nil); err != nil {
		t.Fatal(err)
	}
	view := p.DRAView(config.Default().Start.DRA)
	next := policy.Claim{UID: "uid-next", Namespace: "tenant", Name: "next"}
	testutil.ErrorSays(t, view.Prepare(context.Background(), next, gpu), "held by claim tenant/old")
	quiet := logrus.New()
	quiet.SetOutput(io.Discard)
	if err := dra.New(config.Default().Start.DRA, "node-1", view, quiet).ReleaseGone(context.Background(), fake.NewClientset()); err != nil {
		t.Fatal(err)
	}
	if err := view.Prepare(context.Background(), next, gpu); err != nil {
		t.Errorf("a new claim of the GPU once the gone claim was released: %v", err)
	}
	if data, err := os.ReadFile(state); err != nil || bytes.Contains(data, []byte("uid-old")) || !bytes.Contains(data, []byte("uid-next")) {
		t.Errorf("the record %s, %v: want claim next, not old", data, err)
	}
}

// TestClaimAskedAgainWhileNotRecorded: kubelet asking again to prepare a
// claim nri-gpu holds with the same devices is answered yes at once,
// with nothing new to record, even while the state file cannot be
// written and another change waits to be recorded (an unprepare kubelet
// will ask again).
func TestClaimAskedAgainWhileNotRecorded(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	p, _ := logged(t, "", plugin.WithSpecDirs([]string{gpuSpecDir(t, 2)}), plugin.WithStateFile(filepath.Join(dir, "allocations.json")))
	if _, err := p.Synchronize(context.Background(), nil, nil); err != nil {
		t.Fatal(err)
	}
	view := p.DRAView(config.Default().Start.DRA)
	u := policy.Claim{UID: "u", Namespace: "tenant", Name: "u"}
	v := policy.Claim{UID: "v", Namespace: "tenant", Name: "v"}
	for i, c := range []policy.Claim{u, v} {
		if err := view.Prepare(context.Background(), c, []link.Allocated{{CDI: "nvidia.com/gpu=" + strconv.Itoa(i)}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	writeFile(t, dir, nil)
	if err := view.Unprepare(context.Background(), u.UID); !errors.Is(err, record.ErrNotRecorded) {
		t.Fatalf("unprepare with the state file unwritable: %v", err)
	}
	if err := view.Prepare(context.Background(), v, []link.Allocated{{CDI: "nvidia.com/gpu=1"}}); err != nil {
		t.Errorf("claim v asked again, with the same GPU: %v", err)
	}
}

// TestRecordOfAnotherBootOrFormat: nri-gpu starts on a record holding
// claim ns/c on GPU 1 (and pod x, gone, on GPU 0). Kept in this boot,
// the claim still holds GPU 1. Kept before the node last booted, it
// holds nothing: GPU 1 goes to a pod, the record is rewritten for this
// boot, and kubelet's prepare of the claim, asked again, holds it anew.
// Written by a newer nri-gpu, the record is set aside naming both
// versions, and the claim it names still holds GPU 1.
func TestRecordOfAnotherBootOrFormat(t *testing.T) {
	raw, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		t.Skip("the kernel does not say which boot this is")
	}
	thisBoot := strings.TrimSpace(string(raw))
	for _, tc := range []struct {
		name, version, boot string
		claimHolds, aside   bool
		logged              string
	}{
		{name: "this boot", version: "1", boot: thisBoot, claimHolds: true},
		{name: "earlier boot", version: "1", boot: "9d1c0a7e-0000-4000-8000-000000000001",
			logged: "kept before the node last booted (boot 9d1c0a7e-0000-4000-8000-000000000001): it holds nothing now"},
		{name: "newer format", version: "2", boot: thisBoot, claimHolds: true, aside: true,
			logged: "written by a newer nri-gpu: format version 2, and this nri-gpu reads version 1 and older"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			state := filepath.Join(t.TempDir(), "allocations.json")
			writeFile(t, state, []byte(`{"version":`+tc.version+`,"bootId":"`+tc.boot+`","pods":[{"id":"id-x","namespace":"ns","name":"x","named":[{"name":"nvidia.com/gpu=0","nodes":["c 195:0"]}]}],`+
				`"claims":[{"uid":"uid-c","namespace":"ns","name":"c","devices":[{"name":"nvidia.com/gpu=1","nodes":["c 195:1"]}]}]}`))
			p, hook := logged(t, "", plugin.WithSpecDirs([]string{gpuSpecDir(t, 2)}), plugin.WithStateFile(state))
			if _, err := p.Synchronize(context.Background(), nil, nil); err != nil {
				t.Fatal(err)
			}
			if tc.logged != "" && len(entries(hook, logrus.InfoLevel, tc.logged))+len(entries(hook, logrus.ErrorLevel, tc.logged)) != 1 {
				t.Errorf("no log saying %q", tc.logged)
			}
			aside, _ := filepath.Glob(state + ".damaged-*")
			if (len(aside) == 1) != tc.aside {
				t.Errorf("records set aside: %v, want one: %v", aside, tc.aside)
			}
			for gpu, held := range map[string]bool{"0": false, "1": tc.claimHolds} {
				pod := gpuPod("p"+gpu, map[string]string{"gpus.nri-gpu.io": gpu})
				_, _, err := p.CreateContainer(context.Background(), pod, ctrOf(pod, nil))
				if held {
					testutil.ErrorSays(t, err, "claim ns/c")
				} else if err != nil {
					t.Errorf("GPU %s: %v, want it free", gpu, err)
				}
			}
			saved, err := os.ReadFile(state)
			if err != nil || !strings.Contains(string(saved), `"bootId":"`+thisBoot+`"`) || strings.Contains(string(saved), "id-x") {
				t.Errorf("the record kept now: %s, %v; want this boot's, without pod x", saved, err)
			}
			if tc.claimHolds {
				return
			}
			// The claim's pod starts again after the reboot: kubelet asks
			// for it to be prepared, and it is, once GPU 1 is free again.
			view := p.DRAView(config.Default().Start.DRA)
			claim, gpu1 := policy.Claim{UID: "uid-c", Namespace: "ns", Name: "c"}, []link.Allocated{{CDI: "nvidia.com/gpu=1", Requests: []string{"gpu"}}}
			testutil.ErrorSays(t, view.Prepare(context.Background(), claim, gpu1), "held by pod tenant/p1")
			if err := p.StopPodSandbox(context.Background(), gpuPod("p1", nil)); err != nil {
				t.Fatal(err)
			}
			if err := view.Prepare(context.Background(), claim, gpu1); err != nil {
				t.Errorf("the claim prepared again after the reboot: %v", err)
			}
		})
	}
}
