// Package recovery is what nri-gpu does with what it finds on the node
// when it connects: it sorts and judges what a runtime reported at NRI's
// Synchronize (Sort, Judge: what the live pods hold, which containers
// the runtime created while nri-gpu was away are to be stopped; and
// ClaimCheck, for those that may use DRA claims), tracks the reported
// pods until their end, which the runtime tells only through their
// containers' removal or their sandbox process's exit (Pods), and stops a
// container it must not let run (Killer). It logs nothing: it returns
// what it found, for nri-gpu to log and act on.
package recovery

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"

	"github.com/containerd/nri/pkg/api"
	"golang.org/x/sys/unix"
)

// Pods tracks, by their containers, the pods the runtime reported at
// Synchronize. containerd (1.7 and 2.x alike) keeps the NRI state of its
// pods in memory and, on a plugin's Synchronize, rebuilds only its
// containers': for a pod that ran before containerd restarted it sends no
// StopPodSandbox and no RemovePodSandbox, ever, but it does send
// RemoveContainer for each of the pod's containers it reported, and for
// each it creates later. Such a pod's devices are released when its last
// container is removed: a pod with no container left runs nothing that
// could use them, and a container it makes later is admitted anew, and
// tracked: the pod stays tracked, its containers counted again from none.
// A pod reported with no container (its containers exited: containerd
// reports none of those) is tracked too, so that the containers it makes
// later are, and is released when its sandbox process ends with still no
// container (Watch). Pods created on the current connection are not
// tracked; their StopPodSandbox releases them. The zero Pods is not
// ready: use New.
type Pods struct {
	mu sync.Mutex
	// pods holds, by pod ID, the IDs of the pod's containers.
	pods map[string]map[string]bool
	// resets counts Reset: a watch begun before the last one ends.
	resets int
	// done, when closed, ends the watches: the plugin let its record go.
	done <-chan struct{}
	// isSandbox tells whether process pid is pod podID's sandbox.
	isSandbox SandboxCheck
	// watches are the watches running, which end once done is closed.
	watches sync.WaitGroup
}

// SandboxCheck tells whether process pid is pod podID's sandbox.
type SandboxCheck func(pid int, podID string) bool

// New returns Pods whose watches end once done is closed, which take a
// process for a pod's sandbox as isSandbox says (nil: by its cgroup,
// SandboxProcess).
func New(done <-chan struct{}, isSandbox SandboxCheck) *Pods {
	if isSandbox == nil {
		isSandbox = SandboxProcess
	}
	return &Pods{done: done, isSandbox: isSandbox}
}

// Wait returns once every watch has ended (done is closed: none
// releases anything after).
func (r *Pods) Wait() { r.watches.Wait() }

// Reset tracks the pods, with those of the containers that are theirs,
// and no other pod.
func (r *Pods) Reset(pods []string, containers []*api.Container) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.resets++
	r.pods = make(map[string]map[string]bool, len(pods))
	for _, id := range pods {
		r.pods[id] = map[string]bool{}
	}
	for _, c := range containers {
		if ctrs, ok := r.pods[c.GetPodSandboxId()]; ok {
			ctrs[c.GetId()] = true
		}
	}
}

// Add records a container created in a tracked pod.
func (r *Pods) Add(podID, ctrID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ctrs, ok := r.pods[podID]; ok {
		ctrs[ctrID] = true
	}
}

// Release releases a pod's holdings in one step with ended, the check
// that the pod has ended (which forgets what it says has ended), asked
// under the pool's lock (policy.Allocations.ReleaseIf): a container the
// pod creates meanwhile is added before (and the pod has a container
// left) or after (and its admission, under the pool's lock too, comes
// after the release), never between.
type Release func(ended func() bool)

// Remove forgets a removed container and, where it was the last of a
// tracked pod, has the pod released, and reports so. The container is
// forgotten in ended, in the release's step; one not tracked (any
// container of a pod created on the current connection) is not released
// for, and the pool's lock is not taken.
func (r *Pods) Remove(podID, ctrID string, release Release) bool {
	if !r.tracked(podID, ctrID) {
		return false
	}
	last := false
	release(func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		ctrs := r.pods[podID]
		if !ctrs[ctrID] {
			return false
		}
		delete(ctrs, ctrID)
		last = len(ctrs) == 0
		return last
	})
	return last
}

// tracked reports whether pod's container ctr ("": the pod) is tracked.
func (r *Pods) tracked(pod, ctr string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	ctrs, ok := r.pods[pod]
	return ok && (ctr == "" || ctrs[ctr])
}

// Forget stops tracking a pod the runtime said is stopped or removed.
func (r *Pods) Forget(podID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.pods, podID)
}

// watchPoll is how often a watch looks whether it is still needed (and
// so how long Close may wait for it to end).
const watchPoll = 100 // ms

// ErrNotSandbox says a process is not the sandbox a pod was reported with.
var ErrNotSandbox = errors.New("not the pod's sandbox process")

// Watch has a pod released (release) once process pid, pod podID's
// sandbox as the runtime reported it, has ended, if the pod is then
// still tracked, with no container, since the last Reset (which ended
// checks, in the release's step); it returns at once. A process that
// cannot be watched (it ended already, it is not in nri-gpu's pid
// namespace, or it is not the pod's sandbox) is not, and the error says
// why: the pod then keeps what it holds until a container it makes is
// removed, as a pod whose sandbox runs on. A watch ends with its pod's
// tracking (the pod stopped, removed, or given a container whose removal
// tells its end) or at the next Reset.
func (r *Pods) Watch(podID string, pid int, release Release) error {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return fmt.Errorf("sandbox process %d: %w", pid, err)
	}
	if !r.isSandbox(pid, podID) {
		_ = unix.Close(fd)
		return fmt.Errorf("process %d: %w", pid, ErrNotSandbox)
	}
	r.mu.Lock()
	resets := r.resets
	r.mu.Unlock()
	// alone reports whether the pod is still tracked with no container
	// since the watch began, and forgets it when forget says so.
	alone := func(forget bool) bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		ctrs, tracked := r.pods[podID]
		if !tracked || r.resets != resets || len(ctrs) > 0 {
			return false
		}
		if forget {
			delete(r.pods, podID)
		}
		return true
	}
	r.watches.Add(1)
	go r.watch(fd, alone, release)
	return nil
}

// watch polls the pidfd of a pod's sandbox until the process ends, and
// then has the pod released if it is still alone; it ends as soon as the
// pod is not alone, or done is closed.
func (r *Pods) watch(fd int, alone func(forget bool) bool, release Release) {
	defer r.watches.Done()
	defer func() { _ = unix.Close(fd) }()
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, watchPoll)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil { // the process cannot be watched: it keeps what it holds
			return
		}
		select {
		case <-r.done: // another nri-gpu holds the record now
			return
		default:
		}
		switch {
		case !alone(false):
			return
		case n > 0: // it ended
			release(func() bool { return alone(true) })
			return
		}
	}
}

// SandboxProcess reports whether process pid is in pod podID's sandbox's
// cgroup: containerd names it after the sandbox's ID, under the cgroupfs
// driver (".../<id>") and systemd's ("cri-containerd-<id>.scope") alike.
// A pid read in another pid namespace than the runtime's names another
// process, in another cgroup.
func SandboxProcess(pid int, podID string) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	return err == nil && podID != "" && strings.Contains(string(b), podID)
}
