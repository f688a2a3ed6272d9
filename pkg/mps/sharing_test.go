package mps_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nri-gpu/nri-gpu/internal/mpsstandin"
	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/inventory"
	"github.com/nri-gpu/nri-gpu/pkg/mps"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// gpuSpec is a spec of GPUs 0, 1 and 2 and GPU 2's MIG device 2:0.
const gpuSpec = `cdiVersion: "0.6.0"
kind: nvidia.com/gpu
devices:
  - name: "0"
    containerEdits: {deviceNodes: [{path: /dev/nvidia0, type: c, major: 195, minor: 0}]}
  - name: "1"
    containerEdits: {deviceNodes: [{path: /dev/nvidia1, type: c, major: 195, minor: 1}]}
  - name: "2"
    containerEdits: {deviceNodes: [{path: /dev/nvidia2, type: c, major: 195, minor: 2}]}
  - name: "2:0"
    containerEdits: {deviceNodes: [{path: /dev/nvidia2, type: c, major: 195, minor: 2}, {path: /dev/nvidia-caps/nvidia-cap21, type: c, major: 511, minor: 21}]}
`

// sharing is MPS on a node of gpuSpec's GPUs (NVML telling their UUIDs
// and memory) under sharing, with claims prepared, its daemons under
// root run by control.
func sharing(t *testing.T, entries []config.Sharing, claims []policy.ClaimHolding, root, control string, managed bool) (mps.Sharing, func(string) specs.Device, []string) {
	t.Helper()
	snap := testutil.Snapshot(t, gpuSpec)
	lib := testutil.NVML(3)
	var uuids []string
	for _, d := range lib.Devices[:3] {
		u, _ := d.GetUUID()
		uuids = append(uuids, u)
	}
	hw := inventory.New("/", lib, func(string, ...any) {})
	pol := hw.PolicyIn(policy.New(config.Policy{Devices: config.DefaultDevices, Sharing: entries}), snap)
	dev := func(name string) specs.Device {
		e, err := snap.Lookup("nvidia.com/gpu=" + name)
		if err != nil {
			t.Fatal(err)
		}
		return e.Footprint
	}
	return mps.Sharing{Layout: mps.Layout{Control: control, Root: root}, Managed: managed, Policy: pol, Snapshot: snap, Hardware: hw, Claims: claims}, dev, uuids
}

// TestSharingOf: which device's daemon serves a container, and its
// clients' defaults: a GPU an mps entry shares, by its UUID; a GPU a
// claim asked MPS of, where nri-gpu runs the daemons; none for a GPU no
// one shares with MPS; refused (ErrNotServed), saying why, for a MIG
// device, a claim's GPU where nri-gpu runs no daemon, and one whose
// clients' memory cannot be bounded.
func TestSharingOf(t *testing.T) {
	root := t.TempDir()
	entry := []config.Sharing{{Devices: []string{"nvidia.com/gpu=0", "nvidia.com/gpu=2:0"}, Replicas: 2, Strategy: config.StrategyMPS}}
	claims := func(d specs.Device) []policy.ClaimHolding {
		return []policy.ClaimHolding{{Claim: policy.Claim{UID: "u", Namespace: "ns", Name: "c"},
			Devices: []policy.ClaimDevice{{Device: d, GpuConfig: policy.GpuConfig{Strategy: config.StrategyMPS, ActiveThreadPercentage: 40}}}}}
	}
	s, dev, uuids := sharing(t, entry, nil, root, "/ctl", true)
	s.Claims = claims(dev("1"))
	w, m, err := s.Of(dev("0"))
	if err != nil || w == nil || m == nil || m.Entry == nil {
		t.Fatalf("GPU 0: %+v, %+v, %v; want its entry's daemon", w, m, err)
	}
	gpu0 := s.Hardware.Memory(s.Snapshot, dev("0"))
	want0 := mps.Want{Device: "nvidia.com/gpu=0", By: "policy.sharing[0] (replicas 2, mps)",
		Daemon: mps.Daemon{Control: "/ctl", Dir: filepath.Join(root, uuids[0]), GPU: uuids[0]},
		Limits: mps.Limits{ActiveThreadPercentage: 50, PinnedMemoryMiB: gpu0 / 2 >> 20}}
	if *w != want0 {
		t.Errorf("GPU 0: %+v, want %+v", *w, want0)
	}
	w, m, err = s.Of(dev("1"))
	if err != nil || w == nil || m.Claim == nil || w.Limits.ActiveThreadPercentage != 40 || w.Daemon.Dir != filepath.Join(root, uuids[1]) {
		t.Errorf("GPU 1, its claim's: %+v, %+v, %v; want the claim's own daemon, 40%%", w, m, err)
	}
	if w, m, err := s.Of(dev("2")); w != nil || m != nil || err != nil {
		t.Errorf("GPU 2, not shared: %+v, %+v, %v", w, m, err)
	}
	for _, tc := range []struct {
		name  string
		s     func(mps.Sharing) mps.Sharing
		dev   string
		wants []string
	}{
		{"a MIG device", func(s mps.Sharing) mps.Sharing { return s }, "2:0", []string{`device "nvidia.com/gpu=2:0": policy.sharing[0] (replicas 2, mps) shares it with MPS, which nri-gpu does not do for MIG devices`}},
		{"a claim's GPU, daemons external", func(s mps.Sharing) mps.Sharing { s.Managed = false; return s }, "1", []string{"asks for MPS, and nri-gpu runs an MPS daemon for a claim's GPU only with start.mps.daemon: managed"}},
		{"memory unknown", func(s mps.Sharing) mps.Sharing {
			s.Policy = s.Policy.WithMemory(func(specs.Device) int64 { return 0 })
			return s
		}, "0", []string{policy.ErrMPSUnbounded.Error(), "set its pinnedMemoryLimit or memory"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, m, err := tc.s(s).Of(dev(tc.dev))
			testutil.ErrorSays(t, err, tc.wants...)
			if !errors.Is(err, mps.ErrNotServed) || w != nil || m != nil {
				t.Errorf("%+v, %+v, %v; want ErrNotServed and nothing", w, m, err)
			}
		})
	}
	// Every GPU MPS shares has its daemon wanted, in the order of their
	// directories; what cannot be bounded is said.
	wanted, errs := s.Wanted(config.DefaultKind)
	var dirs []string
	for _, w := range wanted {
		dirs = append(dirs, w.Daemon.Dir)
	}
	want := []string{filepath.Join(root, uuids[0]), filepath.Join(root, uuids[1])}
	slices.Sort(want)
	if !slices.Equal(dirs, want) || len(errs) > 0 {
		t.Errorf("wanted %v, %v; want GPUs 0 and 1's daemons", dirs, errs)
	}
	s.Policy = s.Policy.WithMemory(func(specs.Device) int64 { return 0 })
	if wanted, errs := s.Wanted(config.DefaultKind); len(wanted) != 1 || len(errs) != 1 || !errors.Is(errs[0], policy.ErrMPSUnbounded) {
		t.Errorf("GPU 0's memory unknown: %v, %v; want GPU 1's daemon and GPU 0's problem", wanted, errs)
	}
}

// TestSharingEdits: a container of one MPS-shared GPU gets its daemon's
// client edits, bound as its claim allows, once the daemon is ready; two
// such GPUs, or one whose daemon does not run, are refused saying how to
// run it (external) or where to look (managed); a container of no such
// GPU gets nothing. Started says which daemons a claim asked for do not
// run.
func TestSharingEdits(t *testing.T) {
	ctl, err := mpsstandin.Build(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	root := testutil.ShortDir(t)
	entry := []config.Sharing{{Devices: []string{"nvidia.com/gpu=0", "nvidia.com/gpu=1"}, Replicas: 2, Strategy: config.StrategyMPS, PinnedMemoryLimit: "1Gi"}}
	s, dev, uuids := sharing(t, entry, nil, root, ctl, false)
	external := mps.NewManager(nil, nil, nil)
	ctx := context.Background()

	edits, device, err := s.Edits(ctx, external, []specs.Device{dev("2")}, nil)
	if edits != nil || device != "" || err != nil {
		t.Errorf("GPU 2, not shared: %v, %q, %v; want nothing", edits, device, err)
	}
	_, _, err = s.Edits(ctx, external, []specs.Device{dev("0"), dev("1")}, nil)
	testutil.ErrorSays(t, err, "the container would have 2 MPS-shared GPUs", `"nvidia.com/gpu=0", "nvidia.com/gpu=1"`)
	_, _, err = s.Edits(ctx, external, []specs.Device{dev("0")}, nil)
	testutil.ErrorSays(t, err, `device "nvidia.com/gpu=0": policy.sharing[0] (replicas 2, mps) shares it with MPS, but`, "run one with CUDA_MPS_PIPE_DIRECTORY="+filepath.Join(root, uuids[0], "pipe"))
	if !errors.Is(err, mps.ErrNotServed) {
		t.Errorf("%v, want ErrNotServed", err)
	}
	_, _, err = s.Edits(ctx, mps.NewManager(inShm, newModes(), nil), []specs.Device{dev("0")}, nil)
	testutil.ErrorSays(t, err, "nri-gpu starts it (mps.daemon: managed): its log says why it could not")

	d := mps.Daemon{Control: ctl, Dir: filepath.Join(root, uuids[0]), GPU: uuids[0]}
	t.Cleanup(func() { _ = mpsstandin.Kill(d.PipeDir()) })
	if err := d.Start(ctx, mps.Limits{ActiveThreadPercentage: 50, PinnedMemoryMiB: 1024}, inShm); err != nil {
		t.Fatal(err)
	}
	use := map[string]policy.ClaimDevice{"nvidia.com/gpu=0": {GpuConfig: policy.GpuConfig{ActiveThreadPercentage: 20}}}
	edits, device, err = s.Edits(ctx, external, []specs.Device{dev("0"), dev("2")}, use)
	if err != nil || device != "nvidia.com/gpu=0" {
		t.Fatalf("%q, %v; want GPU 0's client", device, err)
	}
	if want := []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=20", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1024M"}; !slices.Equal(edits.Env[2:], want) {
		t.Errorf("client env %v, want the claim's 20%% and the entry's 1Gi", edits.Env)
	}
	if len(edits.Mounts) != 3 || !strings.HasPrefix(edits.Mounts[0].HostPath, d.Dir) {
		t.Errorf("client mounts %v, want the daemon's three directories", edits.Mounts)
	}

	gpus := []mps.Want{{Device: "nvidia.com/gpu=0", Daemon: d}, {Device: "nvidia.com/gpu=1", Daemon: mps.Daemon{Dir: filepath.Join(root, uuids[1])}}}
	if err := external.Started(ctx, gpus[:1], nil); err != nil {
		t.Errorf("GPU 0's daemon answers: %v", err)
	}
	synced := errors.New("its start could not be recorded")
	err = external.Started(ctx, gpus, []error{synced})
	testutil.ErrorSays(t, err, `device "nvidia.com/gpu=1": the MPS daemon its claim asked for does not run`)
	if !errors.Is(err, synced) || strings.Contains(err.Error(), `"nvidia.com/gpu=0"`) {
		t.Errorf("%v; want GPU 1 alone, and why the sync could not start it", err)
	}
}

// TestShared: what explain and devices show of the shared GPUs: each
// GPU a sharing entry or a claim's MPS shares, by which, its users, and
// for MPS its clients' bounds, or why it cannot have them; a GPU no one
// shares is not shown.
func TestShared(t *testing.T) {
	root := t.TempDir()
	entries := []config.Sharing{
		{Devices: []string{"nvidia.com/gpu=0"}, Replicas: 2, Strategy: config.StrategyMPS},
		{Devices: []string{"nvidia.com/gpu=2"}, Replicas: 3, Strategy: config.StrategyTimeSlicing},
	}
	s, dev, uuids := sharing(t, entries, nil, root, "/ctl", false)
	s.Claims = []policy.ClaimHolding{{Claim: policy.Claim{UID: "u", Namespace: "ns", Name: "c"},
		Devices: []policy.ClaimDevice{{Device: dev("1"), GpuConfig: policy.GpuConfig{Strategy: config.StrategyMPS, ActiveThreadPercentage: 40}}}}}
	users := func(d specs.Device) []string { return []string{"users of " + d.Name} }
	got := s.Shared("nvidia.com/gpu", users)
	mem := s.Hardware.Memory(s.Snapshot, dev("0")) / 2 >> 20
	want := []mps.Shared{
		{Device: "nvidia.com/gpu=0", Sharing: "policy.sharing[0] (replicas 2, mps)", Users: []string{"users of nvidia.com/gpu=0"},
			Limits: fmt.Sprintf("each client 50%% of compute, %d MiB of pinned memory; daemon in %s", mem, filepath.Join(root, uuids[0]))},
		{Device: "nvidia.com/gpu=1", Sharing: "mps, for the claim that holds it (its GpuConfig)", Users: []string{"users of nvidia.com/gpu=1"}},
		{Device: "nvidia.com/gpu=2", Sharing: "policy.sharing[1] (replicas 3, timeSlicing)", Users: []string{"users of nvidia.com/gpu=2"}},
	}
	if len(got) != len(want) {
		t.Fatalf("shared %+v, want %+v", got, want)
	}
	for i := range want {
		if i == 1 {
			// A claim's GPU where nri-gpu runs no daemon: why it has no
			// bounds.
			if !strings.Contains(got[i].Limits, "start.mps.daemon: managed") {
				t.Errorf("GPU 1's limits %q: want why it has none", got[i].Limits)
			}
			got[i].Limits = ""
		}
		if got[i].Device != want[i].Device || got[i].Sharing != want[i].Sharing || !slices.Equal(got[i].Users, want[i].Users) || got[i].Limits != want[i].Limits {
			t.Errorf("shared %+v, want %+v", got[i], want[i])
		}
	}
}

// TestOwn: a claim has daemons of its own only for the GPUs it asks MPS
// of that the policy leaves unshared; where nri-gpu runs no daemon it is
// told why, naming the claim.
func TestOwn(t *testing.T) {
	root := t.TempDir()
	entries := []config.Sharing{{Devices: []string{"nvidia.com/gpu=0"}, Replicas: 2, Strategy: config.StrategyMPS}}
	claim := policy.Claim{UID: "u", Namespace: "ns", Name: "c"}
	mpsOf := policy.GpuConfig{Strategy: config.StrategyMPS}
	for _, managed := range []bool{true, false} {
		s, dev, uuids := sharing(t, entries, nil, root, "/ctl", managed)
		s.Claims = []policy.ClaimHolding{{Claim: claim, Devices: []policy.ClaimDevice{{Device: dev("1"), GpuConfig: mpsOf}}}}
		asked := []policy.Asked{
			{Device: dev("0"), Claim: &policy.ClaimDevice{Device: dev("0"), GpuConfig: mpsOf}}, // the policy's daemon
			{Device: dev("1"), Claim: &policy.ClaimDevice{Device: dev("1"), GpuConfig: mpsOf}}, // its own
			{Device: dev("2"), Claim: &policy.ClaimDevice{Device: dev("2")}},                   // no MPS asked
		}
		own, err := s.Own(claim, asked)
		if managed {
			if err != nil || len(own) != 1 || own[0].Device != "nvidia.com/gpu=1" || own[0].Daemon.Dir != filepath.Join(root, uuids[1]) {
				t.Errorf("managed: own %+v, %v; want GPU 1's daemon", own, err)
			}
			continue
		}
		if len(own) != 0 || !errors.Is(err, mps.ErrNotServed) || !strings.Contains(err.Error(), claim.String()) {
			t.Errorf("external daemons: own %+v, %v; want none, why, naming the claim", own, err)
		}
	}
}

// TestUserLimits: a pod's client of an MPS daemon has its defaults; a
// claim's is bound by what it asked of the device.
func TestUserLimits(t *testing.T) {
	entry := []config.Sharing{{Devices: []string{"nvidia.com/gpu=0"}, Replicas: 4, Strategy: config.StrategyMPS}}
	s, dev, _ := sharing(t, entry, nil, t.TempDir(), "/ctl", true)
	claim := policy.Claim{UID: "u", Namespace: "ns", Name: "c"}
	s.Claims = []policy.ClaimHolding{{Claim: claim, Devices: []policy.ClaimDevice{{Device: dev("0"), GpuConfig: policy.GpuConfig{ActiveThreadPercentage: 10}}}}}
	_, m, err := s.Of(dev("0"))
	if err != nil || m == nil {
		t.Fatalf("GPU 0: %v", err)
	}
	pod := s.UserLimits(m, dev("0"), policy.User{Pod: policy.Pod{ID: "p"}})
	if want := s.ClientLimits(m, dev("0"), policy.ClaimDevice{}); pod != want {
		t.Errorf("a pod's client: %+v, want the defaults %+v", pod, want)
	}
	claimed := s.UserLimits(m, dev("0"), policy.User{Claim: &claim})
	if want := s.ClientLimits(m, dev("0"), s.Claims[0].Devices[0]); claimed != want || claimed == pod {
		t.Errorf("the claim's client: %+v, want %+v, not the defaults %+v", claimed, want, pod)
	}
}
