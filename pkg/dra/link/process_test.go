package link_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
)

// driverEnv has the test binary run as a DRA driver of the given mode.
const driverEnv = "LINK_TEST_DRIVER"

func TestMain(m *testing.M) {
	if mode := os.Getenv(driverEnv); mode != "" {
		os.Exit(driver(mode))
	}
	os.Exit(m.Run())
}

// driver is a stand-in for nri-gpu-dra over the real link: it says a
// container uses every claim the pool has prepared (asking the pool
// back), and on Notify unprepares claim "notified" and says it is
// registered from then on. Mode "config" quits
// as a driver whose configuration cannot work, "crash" as one that
// failed; "garbage" answers what nri-gpu cannot read, and hangs.
func driver(mode string) int {
	if mode == link.EventCommand {
		return eventCommand()
	}
	switch mode {
	case "config":
		return link.ExitConfig
	case "crash":
		return 1
	case "done":
		return 0
	}
	poolConn, driverConn, err := link.Inherited()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return link.ExitConfig
	}
	if mode == "garbage" {
		// Answers nri-gpu cannot read, and hangs on.
		_, _ = driverConn.Write([]byte("}{ not JSON-RPC\n"))
		select {}
	}
	pool := link.NewPoolClient(poolConn)
	uses := func(ctx context.Context, pod link.PodRef, ctr string) ([]link.ClaimUse, error) {
		claims, err := pool.Prepared(ctx)
		var out []link.ClaimUse
		for _, c := range claims {
			out = append(out, link.ClaimUse{UID: c.UID, Namespace: c.Namespace, Name: c.Name, Requests: []string{ctr}})
		}
		return out, err
	}
	var told atomic.Bool
	notify := func() { _ = pool.Unprepare(context.Background(), "notified"); told.Store(true) }
	registered := func() error {
		if !told.Load() {
			return errors.New("kubelet has not asked it yet")
		}
		return nil
	}
	link.ServeDriver(driverConn, finder(uses), notify, registered)
	return 0
}

type finder func(context.Context, link.PodRef, string) ([]link.ClaimUse, error)

func (f finder) Uses(ctx context.Context, pod link.PodRef, ctr string) ([]link.ClaimUse, error) {
	return f(ctx, pod, ctr)
}

// pool is a Pool with prepared claims, recording what was unprepared.
type pool struct {
	mu         sync.Mutex
	prepared   []policy.Claim
	unprepared []string
}

func (p *pool) Devices(context.Context) ([]link.Device, error) { return nil, nil }
func (p *pool) Prepare(context.Context, policy.Claim, []link.Allocated) error {
	return nil
}

func (p *pool) Unprepare(_ context.Context, uid string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.unprepared = append(p.unprepared, uid)
	return nil
}

func (p *pool) Release(ctx context.Context, uid string) error { return p.Unprepare(ctx, uid) }

func (p *pool) Prepared(context.Context) ([]policy.Claim, error) {
	return p.prepared, nil
}

func (p *pool) unpreparedNow() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.unprepared...)
}

// within polls ok for up to 10 s.
func within(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !ok(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
	}
}

// TestProcess: nri-gpu starts its DRA driver as a process of its own,
// linked both ways: nri-gpu asks it which claims a container uses (and
// the driver asks nri-gpu's pool back), tells it when holdings change,
// and stops it with its context. A driver not running is said so at
// once, before it starts and after it stops.
func TestProcess(t *testing.T) {
	t.Setenv(driverEnv, "serve")
	pl := &pool{prepared: []policy.Claim{{UID: "uid-1", Namespace: "tenant", Name: "c"}}}
	var out strings.Builder
	p := link.NewProcess(os.Args[0], []string{"-test.run=^$"}, &out, pl)
	ctx := context.Background()
	if _, err := p.Uses(ctx, link.PodRef{}, "gpu"); !errors.Is(err, link.ErrNotRunning) {
		t.Errorf("before the driver starts: %v, want ErrNotRunning", err)
	}
	p.Notify() // no driver: nothing to tell, nothing blocks
	if err := p.Registered(ctx); !errors.Is(err, link.ErrNotRunning) {
		t.Errorf("registered before the driver starts: %v, want ErrNotRunning", err)
	}

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(runCtx) }()
	var uses []link.ClaimUse
	within(t, "the driver's answer", func() bool {
		var err error
		uses, err = p.Uses(ctx, link.PodRef{Namespace: "tenant", Name: "a"}, "gpu")
		return err == nil
	})
	if len(uses) != 1 || uses[0].UID != "uid-1" || uses[0].Requests[0] != "gpu" {
		t.Errorf("uses %+v, want claim uid-1 for container gpu (from the pool, through the driver)", uses)
	}
	if err := p.Registered(ctx); !errors.Is(err, link.ErrNotRegistered) || !strings.Contains(err.Error(), "kubelet has not asked it yet") {
		t.Errorf("registered before kubelet asked: %v, want ErrNotRegistered in the driver's words", err)
	}
	p.Notify()
	within(t, "the driver's unprepare on Notify", func() bool { return len(pl.unpreparedNow()) == 1 })
	if err := p.Registered(ctx); err != nil {
		t.Errorf("registered: %v", err)
	}

	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run after its context ended: %v, want nil", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the driver still runs 15s after its context ended")
	}
	if _, err := p.Uses(ctx, link.PodRef{}, "gpu"); !errors.Is(err, link.ErrNotRunning) {
		t.Errorf("after the driver stopped: %v, want ErrNotRunning", err)
	}
	if err := p.Registered(ctx); !errors.Is(err, link.ErrNotRunning) {
		t.Errorf("registered after the driver stopped: %v, want ErrNotRunning", err)
	}
}

// TestProcessQuits: a driver that quits is Run's error, which says
// whether starting it again can help (not for a configuration that
// cannot work); a program that is not there is an error at once.
func TestProcessQuits(t *testing.T) {
	tests := []struct {
		name, mode, path string
		config           bool
		says             string
	}{
		{name: "its configuration cannot work", mode: "config", config: true, says: "exited with status 2"},
		{name: "it failed", mode: "crash", says: "exit status 1"},
		{name: "it quit, unasked", mode: "done", says: ": exited"},
		{name: "no such program", mode: "serve", path: "/nonexistent/nri-gpu-dra", says: "no such file"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(driverEnv, tc.mode)
			path := tc.path
			if path == "" {
				path = os.Args[0]
			}
			err := link.NewProcess(path, []string{"-test.run=^$"}, &strings.Builder{}, &pool{}).Run(context.Background())
			if err == nil || errors.Is(err, link.ErrDriverConfig) != tc.config || !strings.Contains(err.Error(), tc.says) {
				t.Errorf("Run: %v; want an error saying %q, ErrDriverConfig %v", err, tc.says, tc.config)
			}
		})
	}
}

// TestProcessLinkBroken: a driver whose answers nri-gpu cannot read (the
// link is broken for good) is killed, and Run returns, so that nri-gpu
// starts it again with a new link rather than ask a dead one forever.
func TestProcessLinkBroken(t *testing.T) {
	t.Setenv(driverEnv, "garbage")
	p := link.NewProcess(os.Args[0], []string{"-test.run=^$"}, &strings.Builder{}, &pool{})
	done := make(chan error, 1)
	go func() { done <- p.Run(context.Background()) }()
	within(t, "the broken link noticed", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := p.Uses(ctx, link.PodRef{}, "gpu")
		return errors.Is(err, link.ErrLink) && !errors.Is(err, context.DeadlineExceeded)
	})
	select {
	case err := <-done:
		if err == nil || errors.Is(err, link.ErrDriverConfig) {
			t.Errorf("Run: %v, want the driver's end (to be started again)", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the driver still runs 10s after its link broke")
	}
}

// TestNotStartedByNRIGPU: a driver run by hand, without the link, says
// so and quits as one whose configuration cannot work.
func TestNotStartedByNRIGPU(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), driverEnv+"=serve")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != link.ExitConfig || !strings.Contains(string(out), "nri-gpu-dra is started by nri-gpu") {
		t.Errorf("run without the link: %v, %q; want exit %d saying who starts it", err, out, link.ExitConfig)
	}
}
