package plugin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/containerd/nri/pkg/api"
	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
	"github.com/nri-gpu/nri-gpu/pkg/memlimit"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/recovery"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// The driver's memory limits (pkg/memlimit) of the containers that hold
// a GPU shared with its memory counted (time-slicing; MPS, as a second
// bound beside its own, where the driver can): on each such GPU, a
// container is bounded to what the pool gave its holder (its pod, or the
// claim it uses), lowered where its own environment asks less. The
// bounds are decided with the grant (CreateContainer), set on the
// container's cgroup when it starts (StartContainer: its process exists,
// in its cgroup, and has not yet run the container's program), set again
// for the running containers a restart finds (Synchronize), and lifted
// when it stops. Where the driver cannot bound them, the admission
// refused the container (policy.memoryLimits: enforced), or it runs
// bounded by agreement only, said in the log and its pod's events.

// MemoryByAgreementReason is the reason of the event that says a
// container runs with its GPU memory bounded by agreement only.
const MemoryByAgreementReason = "GPUMemoryByAgreement"

// bounds are the driver's bounds of the containers, by container ID.
type bounds struct {
	mu    sync.Mutex
	byCtr map[string]*ctrBounds
}

// ctrBounds is one container's bounds.
type ctrBounds struct {
	namespace, pod, container string
	gpus                      []gpuBound
	// cgroup is where they were set; "" until then.
	cgroup string
}

// gpuBound is a container's bound on one GPU.
type gpuBound struct {
	Device, UUID string
	memlimit.Bounds
}

// keep records what ctr is to be bounded to (nothing: forgets it).
func (b *bounds) keep(pod *api.PodSandbox, ctr *api.Container, gpus []gpuBound) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(gpus) == 0 {
		delete(b.byCtr, ctr.GetId())
		return
	}
	if b.byCtr == nil {
		b.byCtr = map[string]*ctrBounds{}
	}
	b.byCtr[ctr.GetId()] = &ctrBounds{namespace: pod.GetNamespace(), pod: pod.GetName(), container: ctr.GetName(), gpus: gpus}
}

// take returns what ctr is to be bounded to, and forgets it.
func (b *bounds) take(id string) *ctrBounds {
	b.mu.Lock()
	defer b.mu.Unlock()
	c := b.byCtr[id]
	delete(b.byCtr, id)
	return c
}

// get returns what ctr is to be bounded to (nil: nothing).
func (b *bounds) get(id string) *ctrBounds {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.byCtr[id]
}

// set records that id's bounds were set on cgroup.
func (b *bounds) set(id, cgroup string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if c := b.byCtr[id]; c != nil {
		c.cgroup = cgroup
	}
}

// ofHolder returns the hard limits set for the containers of a holder
// (a pod by namespace and name) on device, the largest.
func (b *bounds) ofHolder(namespace, pod, device string) uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	var most uint64
	for _, c := range b.byCtr {
		if c.cgroup == "" || c.namespace != namespace || c.pod != pod {
			continue
		}
		for _, g := range c.gpus {
			if g.Device == device {
				most = max(most, g.Hard)
			}
		}
	}
	return most
}

// holding is what a container holds, for its bounds: its pod, itself,
// the devices it is given, the UIDs of the prepared claims it uses, and
// the devices (or kinds) whose spec's apply-cuda-memory-limits hook
// hook-free injection left out (the limits it asks of them are nri-gpu's
// to set).
type holding struct {
	pod      *api.PodSandbox
	ctr      *api.Container
	devs     []specs.Device
	claims   []string
	hookless []string
}

// selfLimited reports whether the limits the container asks of d are
// nri-gpu's to set (hook-free, its spec's hook left out).
func (h holding) selfLimited(d specs.Device) bool {
	kind, _, _ := strings.Cut(d.Name, "=")
	return slices.Contains(h.hookless, d.Name) || slices.Contains(h.hookless, kind)
}

// boundsOf returns what a container is to be bounded to under pol on
// each GPU whose holders' memory is counted (what the pool gave its
// holder), and on each whose hook hook-free injection left out where it
// asks a limit of its own (as the hook would set it); a GPU the driver
// cannot bound here is said in the log (and, counted, the pod's events)
// instead. What its environment asks was checked (askedBounds).
func (p *Plugin) boundsOf(pol *policy.Policy, snap *specs.Snapshot, h holding, log logrus.FieldLogger) []gpuBound {
	var out []gpuBound
	env := h.ctr.GetEnv()
	for _, d := range h.devs {
		granted := memlimit.Unlimited
		switch counted, why := pol.MemoryBound(d); {
		case counted && why != nil:
			p.byAgreement(h.pod, h.ctr, d, why, log)
			continue
		case counted:
			granted = uint64(holderMemory(p.node.alloc.Usage(pol, d), h.pod.GetId(), h.claims))
		case !h.selfLimited(d) || !memlimit.AsksAny(env):
			continue
		case pol.DriverBounds(d) != nil:
			log.WithField("device", d.Name).Warnf("the GPU memory limits the container asks are not set: %v", pol.DriverBounds(d))
			continue
		}
		b, _ := memlimit.Asked(granted, env) // checked by askedBounds
		out = append(out, gpuBound{Device: d.Name, UUID: p.node.hw.UUID(snap, d), Bounds: b})
	}
	return out
}

// askedBounds checks what a container's environment asks of its GPU
// memory limits (memlimit.Asked): malformed, it is refused.
func askedBounds(ctr *api.Container) error {
	_, err := memlimit.Asked(memlimit.Unlimited, ctr.GetEnv())
	return err
}

// holderMemory returns the memory the pool gave the holder of a device
// whose usage is u: the claim of claims that holds it, else the pod.
func holderMemory(u policy.Usage, podID string, claims []string) int64 {
	for _, user := range u.Users {
		if user.Claim != nil && slices.Contains(claims, user.Claim.UID) || user.Claim == nil && user.Pod.ID == podID {
			return user.Use.Memory
		}
	}
	return 0
}

// byAgreement says, in the log and the pod's events, that a container
// holds device d with its memory bounded by agreement only, and why.
func (p *Plugin) byAgreement(pod *api.PodSandbox, ctr *api.Container, d specs.Device, why error, log logrus.FieldLogger) {
	log.WithField("device", d.Name).Warnf("GPU memory bounded by agreement only: %v", why)
	if p.doors.events != nil {
		p.doors.events.Post(link.Event{Namespace: pod.GetNamespace(), Pod: pod.GetName(), UID: pod.GetUid(), Container: ctr.GetName(),
			Reason: MemoryByAgreementReason, Action: "Create",
			Note: fmt.Sprintf("container %s shares %s; the driver cannot bound its GPU memory here (%v): it is bounded by agreement only", ctr.GetName(), d.Name, why)})
	}
}

// StartContainer sets the driver's bounds of a container that holds a
// GPU whose holders' memory is counted, on its cgroup, before its
// program runs (not before the record is restored). Where they cannot be set, the container is stopped and
// its start fails (containerd fails it on the error; CRI-O only logs the
// error, so the container is stopped too).
func (p *Plugin) StartContainer(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) error {
	// What a container created before a restart is to be bounded to is
	// known once the record is restored.
	if err := p.life.restore.await(ctx, p.waitBound(ctx)); err != nil {
		return err
	}
	err := p.setBounds(ctr)
	if err == nil {
		return nil
	}
	log := p.log.WithFields(logrus.Fields{"namespace": pod.GetNamespace(), "pod": pod.GetName(), "container": ctr.GetName()})
	log.Errorf("GPU memory not bounded: %v", err)
	if serr := p.stopper.Stop(ctr); serr != nil {
		log.Errorf("the container whose GPU memory is not bounded is not stopped: %v", serr)
	}
	return bounded(fmt.Errorf("nri-gpu: container %q of pod %s/%s: its GPU memory cannot be bounded: %w", ctr.GetName(), pod.GetNamespace(), pod.GetName(), err))
}

// setBounds sets ctr's bounds, if it has any, on its cgroup.
func (p *Plugin) setBounds(ctr *api.Container) error {
	c := p.limits.get(ctr.GetId())
	if c == nil {
		return nil
	}
	cgroup, err := p.node.hw.Cgroups().OfContainer(int(ctr.GetPid()), ctr.GetId(), ctr.GetLinux().GetCgroupsPath())
	if err != nil {
		return err
	}
	err = p.withDriver(func(d memlimit.Driver) error {
		var errs []error
		for _, g := range c.gpus {
			errs = append(errs, d.Set(g.UUID, cgroup, g.Bounds))
		}
		return errors.Join(errs...)
	})
	if err == nil {
		p.limits.set(ctr.GetId(), cgroup)
	}
	return err
}

// StopContainer lifts the bounds a stopped container had.
func (p *Plugin) StopContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) ([]*api.ContainerUpdate, error) {
	p.liftBounds(pod, ctr)
	return nil, nil
}

// liftBounds lifts ctr's bounds, if it had any set, and forgets them.
// Its cgroup, once removed, holds none anyway: a lift that finds it gone
// is not an error.
func (p *Plugin) liftBounds(pod *api.PodSandbox, ctr *api.Container) {
	c := p.limits.take(ctr.GetId())
	if c == nil || c.cgroup == "" {
		return
	}
	err := p.withDriver(func(d memlimit.Driver) error {
		var errs []error
		for _, g := range c.gpus {
			if err := d.Lift(g.UUID, c.cgroup); err != nil && !errors.Is(err, nvml.ERROR_NOT_FOUND) {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	})
	if err != nil {
		p.log.WithFields(logrus.Fields{"namespace": pod.GetNamespace(), "pod": pod.GetName(), "container": ctr.GetName()}).
			Warnf("lifting the GPU memory bounds of a stopped container: %v (its cgroup's removal lifts them)", err)
	}
}

// withDriver runs f with the driver's NVML open.
func (p *Plugin) withDriver(f func(memlimit.Driver) error) error {
	return memlimit.Open(p.node.hw.Lib(), f)
}

// boundRunning bounds a container a restart finds (or one created while
// nri-gpu was away and admitted now) on the GPUs of devs it holds whose
// holders' memory is counted: at once where it runs (no StartContainer
// will come for it), at its StartContainer where it is created only.
func (p *Plugin) boundRunning(pol *policy.Policy, snap *specs.Snapshot, pod *api.PodSandbox, ctr *api.Container, devs []specs.Device) error {
	if err := askedBounds(ctr); err != nil {
		return err
	}
	var claims []string
	for _, h := range p.node.alloc.Claims() {
		if slices.Contains(h.Claim.Pods, policy.PodName{Namespace: pod.GetNamespace(), Name: pod.GetName()}) {
			claims = append(claims, h.Claim.UID)
		}
	}
	h := holding{pod: pod, ctr: ctr, devs: devs, claims: claims}
	p.limits.keep(pod, ctr, p.boundsOf(pol, snap, h, logTo(p.log, recovery.Stopping{Pod: pod, Ctr: ctr})))
	if ctr.GetState() == api.ContainerState_CONTAINER_CREATED {
		return nil
	}
	return p.setBounds(ctr)
}

// boundRestored bounds again each running container of reported that
// nri-gpu gave devices (its annotation says which): the driver keeps the
// bounds of a cgroup while it lives, and a restarted nri-gpu learns them
// again, for their lift and the metrics; and learns those of each one
// created and not yet started (by the nri-gpu before it), to set at its
// start. One whose bounds cannot be set is to be stopped: it is
// returned, with why.
func (p *Plugin) boundRestored(pol *policy.Policy, snap *specs.Snapshot, reported recovery.Reported, containers []*api.Container) []recovery.Stopping {
	var stop []recovery.Stopping
	for _, c := range containers {
		names := c.GetAnnotations()[DevicesAnnotation]
		pod := reported.Sandboxes[c.GetPodSandboxId()]
		state := c.GetState()
		if names == "" || pod == nil || state != api.ContainerState_CONTAINER_RUNNING && state != api.ContainerState_CONTAINER_CREATED {
			continue
		}
		if err := p.boundRunning(pol, snap, pod, c, snap.Footprints(strings.Split(names, ","))); err != nil {
			stop = append(stop, recovery.Stopping{Pod: pod, Ctr: c, Why: fmt.Sprintf("its GPU memory cannot be bounded: %v", err)})
		}
	}
	return stop
}
