package mps_test

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/nri-gpu/nri-gpu/internal/mpsstandin"
	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/mps"
)

// listenEnv, set, has the test binary listen on that unix socket and
// accept until killed: a process that takes a daemon's control socket.
const listenEnv = "MPS_TEST_LISTEN"

func TestMain(m *testing.M) {
	if os.Getenv(childStep) != "" {
		runChild() // TestKilledBetweenSteps
	}
	if path := os.Getenv(listenEnv); path != "" {
		l, err := net.Listen("unix", path)
		if err != nil {
			os.Exit(3)
		}
		for {
			c, err := l.Accept()
			if err != nil {
				os.Exit(0)
			}
			c.Close()
		}
	}
	os.Exit(m.Run())
}

// squat has a process (in a pid namespace of its own when newPidNS, as
// a container's) listen on the daemon's control socket, until the test
// ends.
func squat(t *testing.T, d mps.Daemon, newPidNS bool) {
	t.Helper()
	if err := os.MkdirAll(d.PipeDir(), 0o755); err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(d.PipeDir(), mps.ControlSocket)
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), listenEnv+"="+socket)
	if newPidNS {
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	}
	if err := cmd.Start(); err != nil {
		t.Skipf("cannot start a listener (in a pid namespace of its own: %v): %v", newPidNS, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	testutil.Within(t, 5*time.Second, "the listener on "+socket, func() bool {
		c, err := net.Dial("unix", socket)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
}

// TestServing: a control socket is a daemon's only when a process of
// nri-gpu's own pid namespace serves it: one of a container's pid
// namespace (what a client container that took the socket's place runs)
// answers, but is refused as the daemon; one of nri-gpu's is taken.
func TestServing(t *testing.T) {
	ctx := context.Background()
	container := mps.Daemon{Dir: filepath.Join(testutil.ShortDir(t), "gpu")}
	squat(t, container, true)
	err := container.Ready(ctx)
	if !errors.Is(err, mps.ErrNotTheDaemon) {
		t.Errorf("a listener in a pid namespace of its own: %v, want ErrNotTheDaemon", err)
	}
	testutil.ErrorSays(t, err, container.PipeDir(), "outside nri-gpu's pid namespace")

	node := mps.Daemon{Dir: filepath.Join(testutil.ShortDir(t), "gpu")}
	squat(t, node, false)
	if err := node.Ready(ctx); err != nil {
		t.Errorf("a listener of this pid namespace: %v", err)
	}
	none := mps.Daemon{Dir: filepath.Join(testutil.ShortDir(t), "gpu")}
	if err := none.Ready(ctx); !errors.Is(err, mps.ErrNotRunning) {
		t.Errorf("no listener: %v, want ErrNotRunning", err)
	}
}

// TestManagedDaemonReplaced: a managed daemon whose control socket
// another process took (the daemon died, a client container's process
// listens there) is not served to clients, and the manager sends that
// process no limits: it says so, naming both pids.
func TestManagedDaemonReplaced(t *testing.T) {
	ctx := context.Background()
	d, want, m := managed(t)
	if _, errs := m.Sync(ctx, []mps.Want{want}); len(errs) > 0 {
		t.Fatal(errs)
	}
	if err := m.Ready(ctx, d); err != nil {
		t.Fatalf("the daemon it started: %v", err)
	}
	if err := m.Ready(ctx, mps.Daemon{Dir: filepath.Join(testutil.ShortDir(t), "other")}); !errors.Is(err, mps.ErrNotRunning) {
		t.Errorf("a daemon it does not keep: %v, want ErrNotRunning", err)
	}
	pid, err := mpsstandin.Pid(d.PipeDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testutil.Within(t, 5*time.Second, "the daemon gone", func() bool { return d.Ready(ctx) != nil })
	if err := os.Remove(filepath.Join(d.PipeDir(), mps.ControlSocket)); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	squat(t, d, false)

	err = m.Ready(ctx, d)
	if !errors.Is(err, mps.ErrNotTheDaemon) {
		t.Errorf("another process on its socket: %v, want ErrNotTheDaemon", err)
	}
	testutil.ErrorSays(t, err, "not by the daemon nri-gpu started")
	want.Limits.ActiveThreadPercentage = 25 // would be sent to a daemon it kept
	events, errs := m.Sync(ctx, []mps.Want{want})
	if len(events) > 0 || len(errs) != 1 || !errors.Is(errs[0], mps.ErrNotTheDaemon) {
		t.Errorf("a sync: %v, %v; want no event and ErrNotTheDaemon", whats(events), errs)
	}
}
