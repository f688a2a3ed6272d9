package nvidia

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// TestRunChecksOnTime: Run checks the GPUs once the interval has passed,
// the moment it has: with a clock that stands still and no interval, at
// every turn.
func TestRunChecksOnTime(t *testing.T) {
	s := testutil.NVML(1)
	var (
		lost   atomic.Bool
		checks atomic.Int32
	)
	d := s.Devices[0].(*dgxa100.Device)
	uuid := d.GetUUIDFunc
	d.GetUUIDFunc = func() (string, nvml.Return) {
		checks.Add(1)
		if lost.Load() {
			return "", nvml.ERROR_GPU_IS_LOST
		}
		return uuid()
	}
	m, err := NewMonitor(s)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	still := time.Now()
	m.now = func() time.Time { return still }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { m.Run(ctx, 0); close(done) }()
	testutil.Within(t, 2*time.Second, "a few turns with the GPU there", func() bool { return checks.Load() >= 3 })
	lost.Store(true)
	testutil.Within(t, 2*time.Second, "the lost GPU found", func() bool {
		return m.Unhealthy(specs.Device{Nodes: []string{GPUNode(0)}}) != nil
	})
	cancel()
	<-done
}
