package plugin

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/containerd/nri/pkg/api"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// unserved says why a running container that nri-gpu did not create (it
// bears none of nri-gpu's annotations: the runtime created it while
// nri-gpu was away) is to be stopped, so that it is created again
// through nri-gpu: what it asks for cannot be read, the policy refuses
// it, or the container lacks a device it asks for. It returns "" for a
// container nri-gpu created, one that asks for nothing, and one that has
// everything it asks for (the runtime's own CDI injected it), which is
// then held as found in it (Synchronize); asks says whether the
// container asks for devices.
func unserved(st *state, snap *specs.Snapshot, pod *api.PodSandbox, ctr *api.Container, candidates []specs.Device) (why string, asks bool) {
	if _, ok := ctr.GetAnnotations()[DevicesAnnotation]; ok {
		return "", false
	}
	ask, err := st.parser.Parse(containerOf(pod, ctr))
	if err != nil {
		return fmt.Sprintf("what it asks for is refused: %v", err), true
	}
	if ask.Empty() {
		return "", false
	}
	if err := st.policy.Check(podOf(pod), ask); err != nil {
		return fmt.Sprintf("the policy refuses what it asks for: %v", err), true
	}
	var missing []string
	for _, q := range ask.Requests {
		if e, err := snap.Lookup(q.Device); err != nil || !injectedByRuntime(e, ctr) {
			missing = append(missing, q.Device)
		}
	}
	if found := len(withNodesOf(ctr, candidates)); found < ask.Count {
		missing = append(missing, fmt.Sprintf("%d of the %d devices it counts", ask.Count-found, ask.Count))
	}
	if len(missing) == 0 {
		return "", true
	}
	return "it was created while nri-gpu was not serving, without " + strings.Join(missing, ", "), true
}

// containerOf is what the policy's parser reads of a container.
func containerOf(pod *api.PodSandbox, ctr *api.Container) policy.Container {
	return policy.Container{
		Namespace:      pod.GetNamespace(),
		Pod:            pod.GetName(),
		Name:           ctr.GetName(),
		PodAnnotations: pod.GetAnnotations(),
		Annotations:    ctr.GetAnnotations(),
		CDIDevices:     cdiDeviceNames(ctr),
	}
}

// ErrNotStopped is wrapped by the error of a container that could not be
// stopped.
var ErrNotStopped = errors.New("container not stopped")

// killContainer stops a running container as the runtime's own eviction
// does (containerd stops it with no grace period): its process, which
// the runtime reports, is killed. The process is first opened (a pidfd,
// so that the signal cannot reach a process that took its pid
// meanwhile) and checked to be the container's: its cgroup names the
// container's ID. proc is the proc filesystem ("/proc").
func killContainer(proc string, ctr *api.Container) error {
	pid := int(ctr.GetPid())
	if pid <= 0 {
		return fmt.Errorf("%w: the runtime reports no process of it", ErrNotStopped)
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return fmt.Errorf("%w: process %d: %w", ErrNotStopped, pid, err)
	}
	defer unix.Close(fd)
	cgroup, err := os.ReadFile(filepath.Join(proc, strconv.Itoa(pid), "cgroup"))
	if err != nil {
		return fmt.Errorf("%w: process %d: %w", ErrNotStopped, pid, err)
	}
	if ctr.GetId() == "" || !strings.Contains(string(cgroup), ctr.GetId()) {
		return fmt.Errorf("%w: process %d is not in the container's cgroup (another PID namespace, or the container is gone)", ErrNotStopped, pid)
	}
	if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil {
		return fmt.Errorf("%w: process %d: %w", ErrNotStopped, pid, err)
	}
	return nil
}

// stopping is a container to stop, and why.
type stopping struct {
	pod *api.PodSandbox
	ctr *api.Container
	why string
}

// stopUnserved stops a container that is not to run as the runtime
// created it, and logs why: kubelet then creates it again, through
// nri-gpu, as its pod's restart policy says (without kubelet, it stays
// stopped).
func (p *Plugin) stopUnserved(s stopping) {
	log := p.log.WithFields(logrus.Fields{"namespace": s.pod.GetNamespace(), "pod": s.pod.GetName(), "container": s.ctr.GetName()})
	if err := p.stop(s.ctr); err != nil {
		log.Errorf("a container that is not to run as it is (%s) still runs: %v", s.why, err)
		return
	}
	log.Warnf("stopped the container, to be created again through nri-gpu: %s", s.why)
}
