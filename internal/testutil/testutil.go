// Package testutil holds the checks nri-gpu's tests share.
package testutil

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	oci "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// ShortDir returns a new directory under /tmp, removed when the test
// ends, for unix sockets: their paths may not exceed 107 bytes, and
// t.TempDir() lies under TMPDIR, which may be long (a CI runner's, a
// mutation tool's copy of the module).
func ShortDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "nri-gpu-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// Cgroup2 returns a new mount of the cgroup v2 hierarchy (the unified
// one, on a machine whose controllers are all cgroup v1's), under /tmp,
// unmounted when the test ends: where the driver's memory limits are
// set, whatever the machine's cgroup version.
func Cgroup2(t testing.TB) string {
	t.Helper()
	dir := ShortDir(t)
	if err := unix.Mount("nri-gpu-test", dir, "cgroup2", 0, ""); err != nil {
		t.Fatalf("mounting cgroup v2 at %s: %v", dir, err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

// ErrorSays fails the test at once when err is nil, and otherwise reports
// each wanted string its message lacks.
func ErrorSays(t testing.TB, err error, want ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want one saying %q", want)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not say %q", err, w)
		}
	}
}

// Within fails the test unless cond becomes true within d, polling.
func Within(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// DeviceAccess evaluates a container spec's device cgroup rules for one of
// its devices, as the kernel does (later rules win, letter by letter), and
// returns the access it has, such as "rw".
func DeviceAccess(s *oci.Spec, d oci.LinuxDevice) string {
	allowed := map[rune]bool{}
	for _, r := range s.Linux.Resources.Devices {
		if (r.Type != "" && r.Type != "a" && r.Type != d.Type) ||
			(r.Major != nil && *r.Major != d.Major) || (r.Minor != nil && *r.Minor != d.Minor) {
			continue
		}
		for _, c := range r.Access {
			allowed[c] = r.Allow
		}
	}
	var out string
	for _, c := range "rwm" {
		if allowed[c] {
			out += string(c)
		}
	}
	return out
}

// NVML returns go-nvml's mock of a DGX A100 cut to n GPUs, with the calls
// NVIDIA's CDI library makes that the mock leaves out (the MIG device
// count) filled in: no MIG devices.
func NVML(n int) *dgxa100.Server {
	s := dgxa100.New()
	s.DeviceGetCountFunc = func() (int, nvml.Return) { return n, nvml.SUCCESS }
	for _, d := range s.Devices {
		dev := d.(*dgxa100.Device)
		dev.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return 0, nvml.SUCCESS }
		// No topology unless a test gives one.
		dev.GetNvLinkStateFunc = func(int) (nvml.EnableState, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
		dev.GetTopologyCommonAncestorFunc = func(nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
		dev.RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return { return nvml.ERROR_NOT_SUPPORTED }
		dev.IsMigDeviceHandleFunc = func() (bool, nvml.Return) { return false, nvml.SUCCESS }
		// A compute mode, as the driver keeps it: Default until set.
		var (
			mu   sync.Mutex
			mode = nvml.COMPUTEMODE_DEFAULT
		)
		dev.GetComputeModeFunc = func() (nvml.ComputeMode, nvml.Return) {
			mu.Lock()
			defer mu.Unlock()
			return mode, nvml.SUCCESS
		}
		dev.SetComputeModeFunc = func(m nvml.ComputeMode) nvml.Return {
			mu.Lock()
			defer mu.Unlock()
			mode = m
			return nvml.SUCCESS
		}
	}
	// No events unless a test gives them.
	s.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) { return nil, nvml.ERROR_NOT_SUPPORTED }
	// A driver without per-cgroup memory limits unless a test gives them
	// (MemoryLimits).
	s.ExtensionsFunc = func() nvml.ExtendedInterface {
		return &mock.ExtendedInterface{LookupSymbolFunc: func(name string) error { return fmt.Errorf("undefined symbol: %s", name) }}
	}
	return s
}

// PCI returns PCI information whose bus ID is addr, as NVML fills it in:
// the characters, then NULs.
func PCI(addr string) nvml.PciInfo {
	var p nvml.PciInfo
	for k, c := range addr {
		p.BusId[k] = int8(c)
	}
	return p
}

// NVMLEvents gives s an event set whose Wait returns the events sent on
// the channel it returns (and times out as NVML does without one), and
// has every GPU register for events.
func NVMLEvents(s *dgxa100.Server) chan<- nvml.EventData {
	events := make(chan nvml.EventData, 8)
	s.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) {
		return &mock.EventSet{
			WaitFunc: func(ms uint32) (nvml.EventData, nvml.Return) {
				select {
				case e := <-events:
					return e, nvml.SUCCESS
				case <-time.After(time.Duration(ms) * time.Millisecond):
					return nvml.EventData{}, nvml.ERROR_TIMEOUT
				}
			},
			FreeFunc: func() nvml.Return { return nvml.SUCCESS },
		}, nvml.SUCCESS
	}
	for _, d := range s.Devices {
		d.(*dgxa100.Device).RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return { return nvml.SUCCESS }
	}
	return events
}

// MIG is a MIG device of a mock GPU: its UUID and GPU instance.
type MIG struct {
	UUID string
	GI   int
}

// WithMIGs turns MIG mode on for GPU i of s, with migs as its MIG
// devices, and returns the GPU's UUID.
func WithMIGs(s *dgxa100.Server, i int, migs ...MIG) string {
	gpu := s.Devices[i].(*dgxa100.Device)
	gpu.MigMode = nvml.DEVICE_MIG_ENABLE
	gpu.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return 7, nvml.SUCCESS }
	gpu.GetMigDeviceHandleByIndexFunc = func(k int) (nvml.Device, nvml.Return) {
		if k >= len(migs) {
			return nil, nvml.ERROR_NOT_FOUND
		}
		return &mock.Device{
			GetUUIDFunc:              func() (string, nvml.Return) { return migs[k].UUID, nvml.SUCCESS },
			GetGpuInstanceIdFunc:     func() (int, nvml.Return) { return migs[k].GI, nvml.SUCCESS },
			GetComputeInstanceIdFunc: func() (int, nvml.Return) { return 0, nvml.SUCCESS },
		}, nvml.SUCCESS
	}
	uuid, _ := gpu.GetUUID()
	return uuid
}

// Snapshot writes each of yamls as a spec file of a directory of its
// own and returns the snapshot of the specs loaded from it, failing t
// where one is not used.
func Snapshot(t testing.TB, yamls ...string) *specs.Snapshot {
	t.Helper()
	dir := t.TempDir()
	for i, y := range yamls {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("spec-%d.yaml", i)), []byte(y), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	reg, err := specs.Open([]string{dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reg.Close)
	snap := reg.Snapshot()
	if len(snap.Problems) > 0 {
		t.Fatalf("spec problems: %v", snap.Problems)
	}
	return snap
}

// GPUSpec returns a CDI spec of kind nvidia.com/gpu of GPUs 0 to n-1,
// each of device node /dev/nvidia<i> (195:<i>), as nvidia-ctk names them.
func GPUSpec(n int) string {
	var b strings.Builder
	b.WriteString("cdiVersion: \"0.7.0\"\nkind: nvidia.com/gpu\ndevices:\n")
	for i := range n {
		fmt.Fprintf(&b, "  - name: \"%d\"\n    containerEdits: {deviceNodes: [{path: /dev/nvidia%d, type: c, major: 195, minor: %d}]}\n", i, i, i)
	}
	return b.String()
}

// SyncBuffer is a bytes.Buffer that goroutines may write while a test
// reads it.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p.
func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns what was written so far.
func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Limit is one nvmlDeviceSetMemoryLimits_v1 call a mock driver saw.
type Limit struct {
	UUID, Cgroup string
	Soft, Hard   uint64
}

// Limits are the per-cgroup memory limits of a mock driver
// (MemoryLimits): the calls it saw, and what they answer.
type Limits struct {
	mu     sync.Mutex
	calls  []Limit
	answer nvml.Return
}

// Calls returns the set calls seen so far, in order.
func (l *Limits) Calls() []Limit {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.calls)
}

// Answer makes ret what the calls answer from now on (SUCCESS at first).
func (l *Limits) Answer(ret nvml.Return) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.answer = ret
}

// MemoryLimits gives the driver of s (testutil.NVML's) per-cgroup
// memory limits: the symbol is there, each GPU records each set call,
// and a read answers what was last set for that cgroup (no limit before).
func MemoryLimits(s *dgxa100.Server) *Limits {
	l := &Limits{answer: nvml.SUCCESS}
	s.ExtensionsFunc = func() nvml.ExtendedInterface {
		return &mock.ExtendedInterface{LookupSymbolFunc: func(string) error { return nil }}
	}
	for _, d := range s.Devices {
		dev := d.(*dgxa100.Device)
		uuid, _ := dev.GetUUID()
		dev.SetMemoryLimits_v1Func = func(cgroup string, soft, hard uint64) nvml.Return {
			l.mu.Lock()
			defer l.mu.Unlock()
			if l.answer == nvml.SUCCESS {
				l.calls = append(l.calls, Limit{UUID: uuid, Cgroup: cgroup, Soft: soft, Hard: hard})
			}
			return l.answer
		}
		dev.GetMemoryLimits_v1Func = func(cgroup string) (nvml.MemoryLimits_v1, nvml.Return) {
			l.mu.Lock()
			defer l.mu.Unlock()
			got := nvml.MemoryLimits_v1{NameSpace: cgroup, HardLimit: math.MaxUint64}
			for _, c := range l.calls {
				if c.UUID == uuid && c.Cgroup == cgroup {
					got.SoftLimit, got.HardLimit = c.Soft, c.Hard
				}
			}
			return got, l.answer
		}
	}
	return l
}
