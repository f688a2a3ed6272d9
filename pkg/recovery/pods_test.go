package recovery_test

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/pkg/recovery"
)

func ctr(pod, id string) *api.Container { return &api.Container{PodSandboxId: pod, Id: id} }

// TestRemoveTellsTheLastContainer: a tracked pod ends (it is released)
// with the removal of its last container, reported at Reset or added
// after; an untracked or forgotten pod's containers never end it.
func TestRemoveTellsTheLastContainer(t *testing.T) {
	type step struct {
		op       string // add, remove, forget
		pod, ctr string
		last     bool
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"the one reported container", []step{{"remove", "a", "c1", true}, {"remove", "a", "c1", false}}},
		{"the last of two", []step{{"add", "a", "c2", false}, {"remove", "a", "c1", false}, {"remove", "a", "c2", true}}},
		{"a pod reported with none, given one", []step{{"add", "b", "c3", false}, {"remove", "b", "c3", true}}},
		{"an untracked pod", []step{{"remove", "x", "cx", false}, {"add", "y", "cy", false}, {"remove", "y", "cy", false}}},
		{"a forgotten pod", []step{{"forget", "a", "", false}, {"remove", "a", "c1", false}}},
		{"a container of another pod", []step{{"remove", "b", "c1", false}, {"remove", "a", "c1", true}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := recovery.New(nil, nil)
			r.Reset([]string{"a", "b"}, []*api.Container{ctr("a", "c1"), ctr("x", "cx")})
			for i, s := range tc.steps {
				switch s.op {
				case "add":
					r.Add(s.pod, s.ctr)
				case "forget":
					r.Forget(s.pod)
				case "remove":
					released := false
					if got := r.Remove(s.pod, s.ctr, func(ended func() bool) { released = ended() }); got != s.last || released != s.last {
						t.Fatalf("step %d: Remove(%s, %s) = %v, released %v; want %v", i, s.pod, s.ctr, got, released, s.last)
					}
				}
			}
		})
	}
}

// sandbox starts a process standing for a pod's sandbox, ended with the
// test.
func sandbox(t *testing.T) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd
}

func end(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
}

// TestWatchReleasesAPodWhoseSandboxEnded: a tracked pod with no container
// is released once its sandbox process ends; one that has a container, or
// was forgotten, or was reset away, is not, and its watch ends.
func TestWatchReleasesAPodWhoseSandboxEnded(t *testing.T) {
	for _, tc := range []struct {
		name    string
		ctrs    []*api.Container
		before  func(r *recovery.Pods)
		release bool
	}{
		{"no container", nil, nil, true},
		{"a container reported", []*api.Container{ctr("p", "c")}, nil, false},
		{"a container made since", nil, func(r *recovery.Pods) { r.Add("p", "c") }, false},
		{"forgotten", nil, func(r *recovery.Pods) { r.Forget("p") }, false},
		{"reset since", nil, func(r *recovery.Pods) { r.Reset([]string{"p"}, nil) }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := recovery.New(nil, func(int, string) bool { return true })
			r.Reset([]string{"p"}, tc.ctrs)
			cmd := sandbox(t)
			released := make(chan struct{}, 1)
			if err := r.Watch("p", cmd.Process.Pid, func(ended func() bool) {
				if ended() {
					released <- struct{}{}
				}
			}); err != nil {
				t.Fatal(err)
			}
			if tc.before != nil {
				tc.before(r)
			}
			end(t, cmd)
			r.Wait() // every watch ends once its process has
			select {
			case <-released:
				if !tc.release {
					t.Fatal("released a pod that still runs a container or is no longer tracked")
				}
			default:
				if tc.release {
					t.Fatal("the pod was not released when its sandbox ended with no container")
				}
			}
		})
	}
}

// TestWatchEndsWhenDone: once done is closed (another nri-gpu holds the
// record), no watch releases anything, and Wait returns though the
// sandboxes run on.
func TestWatchEndsWhenDone(t *testing.T) {
	done := make(chan struct{})
	r := recovery.New(done, func(int, string) bool { return true })
	r.Reset([]string{"p"}, nil)
	cmd := sandbox(t)
	if err := r.Watch("p", cmd.Process.Pid, func(func() bool) { t.Error("released after done") }); err != nil {
		t.Fatal(err)
	}
	close(done)
	r.Wait()
	end(t, cmd)
}

// TestWatchRefusesWhatItCannotWatch: a process that is not the pod's
// sandbox, or that does not exist, is not watched, and the error says so.
func TestWatchRefusesWhatItCannotWatch(t *testing.T) {
	cmd := sandbox(t)
	r := recovery.New(nil, func(int, string) bool { return false })
	r.Reset([]string{"p"}, nil)
	err := r.Watch("p", cmd.Process.Pid, func(func() bool) {})
	if !errors.Is(err, recovery.ErrNotSandbox) {
		t.Errorf("a process not the pod's sandbox: got %v, want ErrNotSandbox", err)
	}
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	if err := r.Watch("p", gone.Process.Pid, func(func() bool) {}); err == nil || !strings.Contains(err.Error(), "sandbox process") {
		t.Errorf("an ended process: got %v, want an error naming the sandbox process", err)
	}
	r.Wait()
}

// TestSandboxProcess: a process is a pod's sandbox when its cgroup names
// the pod's ID, which an empty ID never does.
func TestSandboxProcess(t *testing.T) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Skip(err)
	}
	var own string // the last element of a cgroup path of this process's
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if el := line[strings.LastIndex(line, "/")+1:]; el != "" {
			own = el
		}
	}
	if own == "" {
		t.Skip("this process's cgroup is the root")
	}
	for _, tc := range []struct {
		pod  string
		want bool
	}{{own, true}, {"", false}, {"no-such-pod-" + time.Now().Format("150405.000"), false}} {
		if got := recovery.SandboxProcess(os.Getpid(), tc.pod); got != tc.want {
			t.Errorf("SandboxProcess(self, %q) = %v, want %v", tc.pod, got, tc.want)
		}
	}
}
