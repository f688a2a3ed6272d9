package recovery

import (
	"os/exec"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
)

// TestReleaseInOneStep: a pod's release, at its last container's
// removal, runs under the lock a new container's Add takes, so that no
// container of the pod is added between the two (its grant would be
// released with the pod's): Add waits until the release is done.
func TestReleaseInOneStep(t *testing.T) {
	r := New(nil, nil)
	r.Reset([]string{"a"}, []*api.Container{{PodSandboxId: "a", Id: "old"}})
	held := false
	if !r.Remove("a", "old", func() { held = r.locked() }) {
		t.Fatal("the last container's removal did not release the pod")
	}
	if !held {
		t.Error("the pod was released outside the lock Add takes: a new container could be added between")
	}
	// The pod stays tracked: a container it makes after is counted.
	r.Add("a", "new")
	if !r.Remove("a", "new", func() {}) {
		t.Error("the container added after the release is not the pod's last")
	}
}

// TestWatchReleasesInOneStep: a pod released when its sandbox ends with
// no container is released under the lock Add takes too.
func TestWatchReleasesInOneStep(t *testing.T) {
	done := make(chan struct{})
	defer close(done)
	r := New(done, func(int, string) bool { return true })
	r.Reset([]string{"a"}, nil)
	sandbox := exec.Command("sleep", "600")
	if err := sandbox.Start(); err != nil {
		t.Fatal(err)
	}
	held := make(chan bool, 1)
	if err := r.Watch("a", sandbox.Process.Pid, func() { held <- r.locked() }); err != nil {
		t.Fatal(err)
	}
	_ = sandbox.Process.Kill()
	_ = sandbox.Wait()
	select {
	case h := <-held:
		if !h {
			t.Error("the pod was released outside the lock Add takes")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the pod was not released once its sandbox ended")
	}
}

// locked reports whether r's lock is held (by someone else).
func (r *Pods) locked() bool {
	if r.mu.TryLock() {
		r.mu.Unlock()
		return false
	}
	return true
}
