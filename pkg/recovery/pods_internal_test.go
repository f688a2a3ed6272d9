package recovery

import (
	"os/exec"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
)

// releasing is a pool's release (policy.Allocations.ReleaseIf asks ended
// under the pool's lock: TestReleaseIfOneStep): it tells whether the
// container removed was still tracked until ended was asked, and
// forgotten by it, and what ended said.
func releasing(r *Pods, pod, ctr string, told chan<- [2]bool) Release {
	return func(ended func() bool) {
		before := r.tracked(pod, ctr)
		said := ended()
		told <- [2]bool{before && !r.tracked(pod, ctr), said}
	}
}

// TestReleaseInOneStep: a pod's release, at its last container's
// removal, is one step with the check the pool asks under its lock: the
// container is forgotten only inside it, so a container the pod creates
// meanwhile is added before (and the pod is not released) or is admitted
// after the release (under the pool's lock too), never between.
func TestReleaseInOneStep(t *testing.T) {
	r := New(nil, nil)
	r.Reset([]string{"a"}, []*api.Container{{PodSandboxId: "a", Id: "old"}, {PodSandboxId: "a", Id: "other"}})
	told := make(chan [2]bool, 1)
	if r.Remove("a", "other", releasing(r, "a", "other", told)) {
		t.Error("a container with another left released the pod")
	}
	if got := <-told; !got[0] || got[1] {
		t.Errorf("forgotten inside the check: %v, the pod ended: %v; want true, false", got[0], got[1])
	}
	if !r.Remove("a", "old", releasing(r, "a", "old", told)) {
		t.Fatal("the last container's removal did not release the pod")
	}
	if got := <-told; !got[0] || !got[1] {
		t.Errorf("forgotten inside the check: %v, the pod ended: %v; want both", got[0], got[1])
	}
	// The pod stays tracked: a container it makes after is counted.
	r.Add("a", "new")
	if !r.Remove("a", "new", func(ended func() bool) { ended() }) {
		t.Error("the container added after the release is not the pod's last")
	}
}

// TestWatchReleasesInOneStep: a pod released when its sandbox ends with
// no container is forgotten inside the pool's check too.
func TestWatchReleasesInOneStep(t *testing.T) {
	done := make(chan struct{})
	defer close(done)
	r := New(done, func(int, string) bool { return true })
	r.Reset([]string{"a"}, nil)
	sandbox := exec.Command("sleep", "600")
	if err := sandbox.Start(); err != nil {
		t.Fatal(err)
	}
	told := make(chan [2]bool, 1)
	if err := r.Watch("a", sandbox.Process.Pid, releasing(r, "a", "", told)); err != nil {
		t.Fatal(err)
	}
	_ = sandbox.Process.Kill()
	_ = sandbox.Wait()
	select {
	case got := <-told:
		if !got[0] || !got[1] {
			t.Errorf("forgotten inside the check: %v, the pod ended: %v; want both", got[0], got[1])
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the pod was not released once its sandbox ended")
	}
}
