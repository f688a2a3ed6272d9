package mps

import (
	"context"
	"fmt"
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
// start time), at once when it is a zombie another parent has yet to
// reap (it no longer answers), and at once when the caller gives up,
// though it runs.
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
	// A child of "sleep 60", which never reaps it.
	parent := exec.Command("sh", "-c", "sleep 0.2 & echo $!; exec sleep 60")
	out, err := parent.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := parent.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = parent.Process.Kill(); _ = parent.Wait() })
	var zpid int
	if _, err := fmt.Fscan(out, &zpid); err != nil {
		t.Fatal(err)
	}
	var zombie proc
	testutil.Within(t, 5*time.Second, "another parent's child a zombie", func() bool {
		state, start, err := stat(zpid)
		zombie = proc{pid: zpid, start: start}
		return err == nil && state == 'Z'
	})
	start = time.Now()
	zombie.awaitAndReap(context.Background())
	if took := time.Since(start); took >= reapWait/2 {
		t.Errorf("for a zombie of another parent, the wait took %s", took)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start = time.Now()
	running.awaitAndReap(ctx)
	if took := time.Since(start); took >= reapWait/2 {
		t.Errorf("given up by its caller, the wait took %s", took)
	}
}

// TestParent: a process's parent is told by its stat; one that is gone
// has none (0).
func TestParent(t *testing.T) {
	if got := parent(os.Getpid()); got != os.Getppid() {
		t.Errorf("parent of this process: %d, want %d", got, os.Getppid())
	}
	gone := child(t, "true")
	testutil.Within(t, 5*time.Second, "the child a zombie", func() bool {
		state, _, err := stat(gone.pid)
		return err == nil && state == 'Z'
	})
	if got := parent(gone.pid); got != os.Getpid() {
		t.Errorf("parent of this process's zombie: %d, want %d", got, os.Getpid())
	}
	gone.reap()
	if got := parent(gone.pid); got != 0 {
		t.Errorf("parent of a reaped process: %d, want 0", got)
	}
}
