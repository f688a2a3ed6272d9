package recovery

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/pkg/adjust"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// Reported is what the runtime reported at Synchronize, sorted.
type Reported struct {
	// Live are the pods that may run containers, Sandboxes every pod
	// reported, by ID; WithContainers says which pods were reported with
	// containers.
	Live           map[string]policy.Pod
	Sandboxes      map[string]*api.PodSandbox
	WithContainers map[string]bool
}

// Sort sorts the pods the runtime reported: a stopped pod, not yet
// removed (all its containers stopped, or none left and no sandbox
// process: containerd reports a stopped sandbox with pid 0, and none of
// its exited containers), is not live: nothing of it can run, as no
// container can be created in a stopped sandbox.
func Sort(pods []*api.PodSandbox, containers []*api.Container) Reported {
	s := Reported{Live: make(map[string]policy.Pod, len(pods)), Sandboxes: make(map[string]*api.PodSandbox, len(pods)), WithContainers: map[string]bool{}}
	for _, pod := range pods {
		s.Live[pod.GetId()] = adjust.PodOf(pod)
		s.Sandboxes[pod.GetId()] = pod
	}
	running := map[string]bool{} // by pod ID
	for _, c := range containers {
		s.WithContainers[c.GetPodSandboxId()] = true
		if c.GetState() != api.ContainerState_CONTAINER_STOPPED {
			running[c.GetPodSandboxId()] = true
		}
	}
	for id, pod := range s.Sandboxes {
		if !running[id] && (s.WithContainers[id] || pod.GetPid() == 0) {
			delete(s.Live, id)
		}
	}
	return s
}

// Alone returns the live pods reported with no container, by ID: their
// end is told only by their sandbox's.
func (r Reported) Alone() []*api.PodSandbox {
	var out []*api.PodSandbox
	for _, id := range slices.Sorted(maps.Keys(r.Live)) {
		if !r.WithContainers[id] {
			out = append(out, r.Sandboxes[id])
		}
	}
	return out
}

// Stopping is a running container to stop, and why.
type Stopping struct {
	Pod *api.PodSandbox
	Ctr *api.Container
	Why string
}

// Found is what a Judge found of the live pods: what they hold (the
// record's, for the pods still live), the containers to stop, the
// running containers nri-gpu did not create or cannot tell it created
// (Others), and of these those that ask for devices and have them
// (Admit), oldest first: each is judged by the admission as a new
// container is, against what the pods hold.
type Found struct {
	Holdings            []policy.Holding
	Stop, Others, Admit []Stopping
}

// Judge judges the containers a runtime reports running under one
// configuration and one snapshot of the specs.
type Judge struct {
	Parser *policy.Parser
	Snap   *specs.Snapshot
	// Kind is the configuration's default kind: that of the devices a
	// container may be found with.
	Kind string
	// Record says the record was read back whole: nri-gpu's annotation
	// is then read back only on a container of a pod the record holds
	// (nri-gpu recorded every grant before its container was created),
	// and what such a pod holds is what the record says. Without it, no
	// annotation is read back: every running container is judged by
	// what it asks for, as one nri-gpu did not create.
	Record bool
}

// Find returns what the live pods hold, given what the record says they
// held (recorded) and the devices prepared claims hold (claimed: one
// found in a container is the claim's), and which of their running
// containers are to be stopped, checked or judged.
func (j Judge) Find(reported Reported, containers []*api.Container, recorded []policy.Holding, claimed []specs.Device) Found {
	var out Found
	// byPod has a key for each live pod the record holds, whatever it
	// holds (claims alone too).
	byPod := map[string]bool{}
	for _, h := range recorded {
		if pod, ok := reported.Live[h.Pod.ID]; ok {
			h.Pod = pod
			out.Holdings = append(out.Holdings, h)
			byPod[pod.ID] = true
		}
	}
	candidates := slices.DeleteFunc(j.Snap.Candidates(j.Kind), func(d specs.Device) bool { return specs.OverlapsAny(d, claimed) })
	for _, c := range running(reported, containers) {
		sandbox := reported.Sandboxes[c.GetPodSandboxId()]
		_, annotated := c.GetAnnotations()[adjust.DevicesAnnotation]
		if annotated && j.Record && byPod[c.GetPodSandboxId()] {
			continue // the record says what its pod holds
		}
		why, asks := j.unserved(sandbox, c, candidates)
		switch {
		case why != "":
			out.Stop = append(out.Stop, Stopping{sandbox, c, why})
		case asks:
			out.Admit = append(out.Admit, Stopping{Pod: sandbox, Ctr: c})
			fallthrough
		default:
			out.Others = append(out.Others, Stopping{Pod: sandbox, Ctr: c})
		}
	}
	return out
}

// running returns the running containers of the live pods, oldest
// first (the first created is judged first).
func running(reported Reported, containers []*api.Container) []*api.Container {
	out := slices.DeleteFunc(slices.Clone(containers), func(c *api.Container) bool {
		_, live := reported.Live[c.GetPodSandboxId()]
		return !live || c.GetState() == api.ContainerState_CONTAINER_STOPPED
	})
	slices.SortStableFunc(out, func(a, b *api.Container) int {
		if a.GetCreatedAt() != b.GetCreatedAt() {
			return cmp.Compare(a.GetCreatedAt(), b.GetCreatedAt())
		}
		return strings.Compare(a.GetId(), b.GetId())
	})
	return out
}

// unserved says why a running container that nri-gpu did not create
// (the runtime created it while nri-gpu was away, or its annotation is
// not nri-gpu's) is to be stopped, so that it is created again through
// nri-gpu: what it asks for cannot be read, or the container lacks a
// device it asks for. It returns "" for one that asks for nothing, and
// one that has everything it asks for (the runtime's own CDI injected
// it), which the admission then judges; asks says whether the container
// asks for devices.
func (j Judge) unserved(pod *api.PodSandbox, ctr *api.Container, candidates []specs.Device) (why string, asks bool) {
	ask, err := j.Parser.Parse(adjust.ContainerOf(pod, ctr))
	if err != nil {
		return fmt.Sprintf("what it asks for is refused: %v", err), true
	}
	if ask.Empty() {
		return "", false
	}
	var missing []string
	for _, q := range ask.Requests {
		if e, err := j.Snap.Lookup(q.Device); err != nil || !adjust.InjectedByRuntime(e, ctr) {
			missing = append(missing, q.Device)
		}
	}
	if found := len(adjust.WithNodesOf(ctr, candidates)); found < ask.Count {
		missing = append(missing, fmt.Sprintf("%d of the %d devices it counts", ask.Count-found, ask.Count))
	}
	if len(missing) == 0 {
		return "", true
	}
	return "it was created while nri-gpu was not serving, without " + strings.Join(missing, ", "), true
}
