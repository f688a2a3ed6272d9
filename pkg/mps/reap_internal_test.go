package mps

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
)

// child starts a child process running args, and returns it as a proc.
func child(t *testing.T, args ...string) proc {
	t.Helper()
	cmd := exec.Command(args[0], args[1:]...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_, _ = cmd.Process.Wait()
	})
	_, start, err := stat(pid)
	if err != nil {
		t.Fatal(err)
	}
	return proc{pid: pid, start: start}
}

// TestReap: a daemon is reaped only when it is the process known (its
// start time too: a pid used again by another process is left alone)
// and has quit; a running one is not.
func TestReap(t *testing.T) {
	running := child(t, "sleep", "60")
	if running.reap() {
		t.Error("a running process reaped")
	}
	quit := child(t, "true")
	testutil.Within(t, 5*time.Second, "the child a zombie", func() bool {
		state, _, err := stat(quit.pid)
		return err == nil && state == 'Z'
	})
	other := proc{pid: quit.pid, start: quit.start + 1}
	if other.reap() {
		t.Error("a zombie of another start time (its pid used again) reaped")
	}
	if state, _, err := stat(quit.pid); err != nil || state != 'Z' {
		t.Fatalf("the zombie: %c, %v; want it left alone", state, err)
	}
	if !quit.reap() {
		t.Error("the zombie known by its pid and start time not reaped")
	}
	if _, err := os.Stat("/proc/" + strconv.Itoa(quit.pid)); !os.IsNotExist(err) {
		t.Errorf("the reaped zombie is still there: %v", err)
	}
}

// TestAwaitAndReap: waiting for a stopped daemon ends when it quits (and
// it is reaped), at once when its pid is another process's (another
// start time), and at once when the caller gives up, though it runs.
func TestAwaitAndReap(t *testing.T) {
	quit := child(t, "sh", "-c", "sleep 0.2")
	start := time.Now()
	quit.awaitAndReap(context.Background())
	if _, err := os.Stat("/proc/" + strconv.Itoa(quit.pid)); !os.IsNotExist(err) || time.Since(start) >= reapWait {
		t.Errorf("after %s: %v; want it reaped once it quit", time.Since(start), err)
	}
	running := child(t, "sleep", "60")
	start = time.Now()
	proc{pid: running.pid, start: running.start + 1}.awaitAndReap(context.Background())
	if took := time.Since(start); took >= reapWait/2 {
		t.Errorf("for a pid used again by another process, the wait took %s", took)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start = time.Now()
	running.awaitAndReap(ctx)
	if took := time.Since(start); took >= reapWait/2 {
		t.Errorf("given up by its caller, the wait took %s", took)
	}
}
