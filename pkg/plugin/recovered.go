package plugin

import (
	"sync"

	"github.com/containerd/nri/pkg/api"
)

// recovered tracks, by their containers, the pods the runtime reported at
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
// later are. Pods created on the current connection are not tracked;
// their StopPodSandbox releases them.
type recovered struct {
	mu sync.Mutex
	// pods holds, by pod ID, the IDs of the pod's containers.
	pods map[string]map[string]bool
}

// reset tracks the pods, with those of the containers that are theirs,
// and no other pod.
func (r *recovered) reset(pods []string, containers []*api.Container) {
	r.mu.Lock()
	defer r.mu.Unlock()
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

// add records a container created in a tracked pod.
func (r *recovered) add(podID, ctrID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ctrs, ok := r.pods[podID]; ok {
		ctrs[ctrID] = true
	}
}

// remove forgets a removed container, and reports whether it was the last
// of a tracked pod.
func (r *recovered) remove(podID, ctrID string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	ctrs := r.pods[podID]
	if !ctrs[ctrID] {
		return false
	}
	delete(ctrs, ctrID)
	return len(ctrs) == 0
}

// forget stops tracking a pod the runtime said is stopped or removed.
func (r *recovered) forget(podID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.pods, podID)
}
