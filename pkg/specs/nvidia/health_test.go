package nvidia_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
	"github.com/nri-gpu/nri-gpu/pkg/specs/nvidia"
)

// TestMonitor: a critical Xid makes a GPU (and its MIG devices)
// unhealthy, an application's Xid does not; a lost GPU is unhealthy while
// it does not answer; a GPU that had an Xid is healthy again once it has
// answered for RecoverAfter.
func TestMonitor(t *testing.T) {
	s := server(4)
	events := testutil.NVMLEvents(s)
	// GPUs 2 and 3 can be lost: their checks then fail.
	lost, lost3 := losable(s, 2), losable(s, 3)
	m, err := nvidia.NewMonitor(s)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	m.RecoverAfter = 300 * time.Millisecond
	var changes, recoveries atomic.Int32
	m.OnChange = func(node, why string) {
		changes.Add(1)
		if why == "" {
			recoveries.Add(1)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go m.Run(ctx, 20*time.Millisecond)

	dev := func(i int, more ...string) specs.Device {
		return specs.Device{Nodes: append([]string{gpu(i)}, more...)}
	}
	unhealthy := func(d specs.Device) bool { return errors.Is(m.Unhealthy(d), nvidia.ErrUnhealthy) }

	events <- nvml.EventData{Device: s.Devices[0], EventType: nvml.EventTypeXidCriticalError, EventData: 13} // an application's
	events <- nvml.EventData{Device: s.Devices[1], EventType: nvml.EventTypeXidCriticalError, EventData: 79}
	testutil.Within(t, 2*time.Second, "GPU 1 unhealthy after Xid 79", func() bool { return unhealthy(dev(1)) })
	if err := m.Unhealthy(dev(1, "c 511:3")); err == nil || !strings.Contains(err.Error(), "Xid error 79") {
		t.Errorf("a MIG device of GPU 1: %v, want its parent's Xid 79", err)
	}
	if unhealthy(dev(0)) {
		t.Error("an application's Xid 13 made GPU 0 unhealthy")
	}
	if m.Unhealthy(specs.Device{Nodes: []string{"c 226:128"}}) != nil {
		t.Error("a device that is no NVIDIA GPU is unhealthy")
	}

	lost3.Store(true)
	events <- nvml.EventData{Device: s.Devices[3], EventType: nvml.EventTypeGpuUnavailableError}
	testutil.Within(t, 2*time.Second, "GPU 3 unhealthy after a GPU-unavailable event", func() bool {
		err := m.Unhealthy(dev(3))
		return err != nil && strings.Contains(err.Error(), "unavailable")
	})
	// It answers its checks again: healthy again.
	lost3.Store(false)
	testutil.Within(t, 2*time.Second, "GPU 3 healthy once it answers", func() bool { return !unhealthy(dev(3)) })

	lost.Store(true)
	testutil.Within(t, 2*time.Second, "GPU 2 unhealthy while lost", func() bool {
		err := m.Unhealthy(dev(2))
		return err != nil && strings.Contains(err.Error(), "lost")
	})
	lost.Store(false)
	testutil.Within(t, 2*time.Second, "GPU 2 healthy once it answers", func() bool { return !unhealthy(dev(2)) })
	testutil.Within(t, 2*time.Second, "GPU 1 healthy after RecoverAfter", func() bool { return !unhealthy(dev(1)) })
	if changes.Load() < 6 || recoveries.Load() < 3 {
		t.Errorf("OnChange called %d times, %d for a recovery; want one per change (6), 3 of them recoveries", changes.Load(), recoveries.Load())
	}
	if got := m.Unhealthies(); len(got) != 0 {
		t.Errorf("unhealthy at the end: %v", got)
	}
}

// TestMonitorWithoutNVML: no NVML, no monitor (the plugin then takes every
// GPU as healthy, and says so).
func TestMonitorWithoutNVML(t *testing.T) {
	s := testutil.NVML(1)
	s.InitFunc = func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }
	if _, err := nvidia.NewMonitor(s); !errors.Is(err, nvidia.ErrNVML) {
		t.Errorf("error %v, want ErrNVML", err)
	}
}

// TestLostAfterXid: a GPU that had an Xid error and then falls off the
// bus is reported lost, not by its Xid; closing the monitor frees its
// event set once.
func TestLostAfterXid(t *testing.T) {
	s := server(2)
	events := testutil.NVMLEvents(s)
	var freed atomic.Int32
	create := s.EventSetCreateFunc
	s.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) {
		set, ret := create()
		if mock, ok := set.(interface{ Free() nvml.Return }); ok && ret == nvml.SUCCESS {
			return countingSet{EventSet: set, free: mock.Free, freed: &freed}, ret
		}
		return set, ret
	}
	lost := losable(s, 1)
	m, err := nvidia.NewMonitor(s)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { m.Run(ctx, 10*time.Millisecond); close(done) }()
	gpu1 := specs.Device{Nodes: []string{gpu(1)}}
	events <- nvml.EventData{Device: s.Devices[1], EventType: nvml.EventTypeXidCriticalError, EventData: 79}
	testutil.Within(t, 2*time.Second, "GPU 1 unhealthy after Xid 79", func() bool { return m.Unhealthy(gpu1) != nil })
	lost.Store(true)
	testutil.Within(t, 2*time.Second, "GPU 1 reported lost", func() bool {
		err := m.Unhealthy(gpu1)
		return err != nil && strings.Contains(err.Error(), "lost")
	})
	cancel()
	<-done
	m.Close()
	if freed.Load() != 1 {
		t.Errorf("the event set was freed %d times, want once", freed.Load())
	}
}

// countingSet counts Free calls on an event set.
type countingSet struct {
	nvml.EventSet
	free  func() nvml.Return
	freed *atomic.Int32
}

func (c countingSet) Free() nvml.Return { c.freed.Add(1); return c.free() }

// losable returns a switch that makes GPU i of s lost: NVML answers its
// checks with ERROR_GPU_IS_LOST while it is on.
func losable(s *dgxa100.Server, i int) *atomic.Bool {
	var lost atomic.Bool
	d := s.Devices[i].(*dgxa100.Device)
	uuid := d.GetUUIDFunc
	d.GetUUIDFunc = func() (string, nvml.Return) {
		if lost.Load() {
			return "", nvml.ERROR_GPU_IS_LOST
		}
		return uuid()
	}
	return &lost
}

// TestMonitorDriverReloaded: once the driver's kernel module is reloaded
// (an upgrade), NVML answers LIB_RM_VERSION_MISMATCH for the GPUs it
// had: the monitor opens NVML again and watches the GPUs it then finds
// (one lost since is unhealthy), saying so; while it cannot open NVML
// again it says why, once, and tries again at each check.
func TestMonitorDriverReloaded(t *testing.T) {
	s := server(2)
	var (
		reloaded, initFails atomic.Bool
		inits               atomic.Int32
	)
	s.InitFunc = func() nvml.Return {
		inits.Add(1)
		if initFails.Load() {
			return nvml.ERROR_LIB_RM_VERSION_MISMATCH
		}
		reloaded.Store(false) // the library loaded anew is the driver's
		return nvml.SUCCESS
	}
	s.ShutdownFunc = func() nvml.Return { return nvml.SUCCESS }
	lost := losable(s, 1)
	for _, d := range s.Devices[:2] {
		dev := d.(*dgxa100.Device)
		uuid := dev.GetUUIDFunc
		dev.GetUUIDFunc = func() (string, nvml.Return) {
			if reloaded.Load() {
				return "", nvml.ERROR_LIB_RM_VERSION_MISMATCH
			}
			return uuid()
		}
	}
	m, err := nvidia.NewMonitor(s)
	if err != nil {
		t.Fatal(err)
	}
	reopened := make(chan error, 16)
	m.OnReopen = func(cause, err error) {
		if !errors.Is(cause, nvml.ERROR_LIB_RM_VERSION_MISMATCH) {
			t.Errorf("told the cause %v, want NVML's version mismatch", cause)
		}
		reopened <- err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { m.Run(ctx, 10*time.Millisecond); close(done) }()
	defer func() { cancel(); <-done; m.Close() }()
	gpu1 := specs.Device{Nodes: []string{gpu(1)}}

	// The module reloaded, the library in the process still the old one.
	initFails.Store(true)
	lost.Store(true)
	reloaded.Store(true)
	select {
	case err := <-reopened:
		testutil.ErrorSays(t, err, "opening NVML again")
		if !errors.Is(err, nvml.ERROR_LIB_RM_VERSION_MISMATCH) {
			t.Errorf("told %v, want NVML's version mismatch", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("not told that NVML could not be opened again")
	}
	from := inits.Load()
	testutil.Within(t, 2*time.Second, "NVML tried again at the next checks", func() bool { return inits.Load() >= from+2 })
	if len(reopened) > 0 {
		t.Errorf("told again of the same failure: %v", <-reopened)
	}

	// NVML opens again: GPU 1, lost meanwhile, is found unhealthy.
	initFails.Store(false)
	select {
	case err := <-reopened:
		if err != nil {
			t.Fatalf("told %v, want NVML opened again", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("not told that NVML was opened again")
	}
	testutil.Within(t, 2*time.Second, "GPU 1 unhealthy once NVML answers again", func() bool {
		err := m.Unhealthy(gpu1)
		return err != nil && strings.Contains(err.Error(), "lost")
	})
}
