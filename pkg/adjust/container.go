package adjust

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// Annotations nri-gpu adds to each container it gives devices, for
// operators to read. nri-gpu writes them whole and removes them from a
// container it gives nothing: a tenant cannot set them.
const (
	// DevicesAnnotation lists the devices the container got, qualified
	// CDI names separated by commas: "nvidia.com/gpu=0,nvidia.com/gpu=1".
	DevicesAnnotation = "nri-gpu.io/devices"
	// CountedAnnotation lists those of them chosen for a count request,
	// written the same way.
	CountedAnnotation = "nri-gpu.io/counted"
)

// PodOf is a pod as the pool knows it.
func PodOf(pod *api.PodSandbox) policy.Pod {
	return policy.Pod{ID: pod.GetId(), Namespace: pod.GetNamespace(), Name: pod.GetName()}
}

// ContainerOf is what the policy's parser reads of a container: where
// it runs, its pod's and its own annotations, and the CDI devices the
// runtime was asked for.
func ContainerOf(pod *api.PodSandbox, ctr *api.Container) policy.Container {
	return policy.Container{
		Namespace:      pod.GetNamespace(),
		Pod:            pod.GetName(),
		Name:           ctr.GetName(),
		PodAnnotations: pod.GetAnnotations(),
		Annotations:    ctr.GetAnnotations(),
		CDIDevices:     CDIDeviceNames(ctr),
	}
}

// ErrInjectedTwice is wrapped by the error that refuses a container in
// which a device nri-gpu injects would be injected a second time, by the
// runtime's own CDI at another NRI plugin's request.
var ErrInjectedTwice = errors.New("a device would be injected twice")

// MaxContainerDevices caps the device nodes of one container looked at.
const MaxContainerDevices = 1024

// Annotate writes nri-gpu's annotations into adj: the devices given, and
// those of them counted (or, with none, removes the container's counted
// annotation).
func Annotate(adj *api.ContainerAdjustment, ctr *api.Container, given, counted []string) {
	adj.AddAnnotation(DevicesAnnotation, strings.Join(given, ","))
	if len(counted) > 0 {
		adj.AddAnnotation(CountedAnnotation, strings.Join(counted, ","))
	} else if _, ok := ctr.GetAnnotations()[CountedAnnotation]; ok {
		adj.RemoveAnnotation(CountedAnnotation)
	}
}

// Scrub returns the adjustment that removes nri-gpu's annotations from a
// container it gives nothing, or nil if it has none.
func Scrub(ctr *api.Container) *api.ContainerAdjustment {
	var adj *api.ContainerAdjustment
	for _, key := range []string{DevicesAnnotation, CountedAnnotation} {
		if _, ok := ctr.GetAnnotations()[key]; ok {
			if adj == nil {
				adj = &api.ContainerAdjustment{}
			}
			adj.RemoveAnnotation(key)
		}
	}
	return adj
}

// UserNS reports whether the container has a user namespace of its own
// (a pod with hostUsers: false, CRI's userns_options).
func UserNS(ctr *api.Container) bool {
	return slices.ContainsFunc(ctr.GetLinux().GetNamespaces(), func(ns *api.LinuxNamespace) bool { return ns.GetType() == "user" })
}

// CDIDeviceNames returns the CDI devices the runtime reports it injects
// into the container.
func CDIDeviceNames(ctr *api.Container) []string {
	var out []string
	for _, d := range ctr.GetCDIDevices() {
		out = append(out, d.GetName())
	}
	return out
}

// InjectedByRuntime reports whether the runtime already injected a device
// into the container (containerd's own CDI support, enable_cdi, acting on
// a cdi.k8s.io annotation before NRI is called): the runtime reports it
// among the CDI devices it injects (containerd 2.x), or every device node
// and env entry of the device's own edits is there already. A device the
// runtime does not report and whose edits have neither cannot be told
// apart and counts as not injected.
func InjectedByRuntime(e *specs.Entry, ctr *api.Container) bool {
	if slices.Contains(CDIDeviceNames(ctr), e.Footprint.Name) {
		return true
	}
	edits := e.Device.ContainerEdits
	if len(edits.DeviceNodes) == 0 && len(edits.Env) == 0 {
		return false
	}
	for _, n := range edits.DeviceNodes {
		if n != nil && !slices.ContainsFunc(ctr.GetLinux().GetDevices(), func(d *api.LinuxDevice) bool { return d.GetPath() == n.Path }) {
			return false
		}
	}
	for _, kv := range edits.Env {
		if !slices.Contains(ctr.GetEnv(), kv) {
			return false
		}
	}
	return true
}

// WithNodesOf returns the candidates whose device nodes are all in the
// container (its first MaxContainerDevices looked at).
func WithNodesOf(ctr *api.Container, candidates []specs.Device) []specs.Device {
	nodes := map[string]bool{}
	for i, d := range ctr.GetLinux().GetDevices() {
		if i == MaxContainerDevices {
			break
		}
		nodes[specs.NodeID(d.GetType(), d.GetMajor(), d.GetMinor())] = true
	}
	var found []specs.Device
	for _, cand := range candidates {
		if len(cand.Nodes) > 0 && !slices.ContainsFunc(cand.Nodes, func(n string) bool { return !nodes[n] }) {
			found = append(found, cand)
		}
	}
	return found
}

// InjectedTwice returns an error naming each CDI device another plugin
// asks the runtime to inject that shares hardware with a device nri-gpu
// injects itself (those listed in its devices annotation, less those the
// runtime reports it injects anyway), or nil.
func InjectedTwice(snap *specs.Snapshot, req *api.ValidateContainerAdjustmentRequest) error {
	adj, ctr := req.GetAdjust(), req.GetContainer()
	given := adj.GetAnnotations()[DevicesAnnotation]
	if given == "" || len(adj.GetCDIDevices()) == 0 {
		return nil
	}
	byRuntime := CDIDeviceNames(ctr)
	var own []string
	for _, name := range strings.Split(given, ",") {
		if !slices.Contains(byRuntime, name) {
			own = append(own, name)
		}
	}
	mine := snap.Footprints(own)
	var twice []string
	for _, d := range adj.GetCDIDevices() {
		i := slices.IndexFunc(mine, snap.Footprints([]string{d.GetName()})[0].Overlaps)
		if i < 0 {
			continue
		}
		owner := "another plugin"
		if o := req.GetOwners(); o != nil {
			if name, ok := o.CdiDeviceOwner(ctr.GetId(), d.GetName()); ok {
				owner = fmt.Sprintf("plugin %q", name)
			}
		}
		twice = append(twice, fmt.Sprintf("%s, which nri-gpu injects as %s and %s asks the runtime to inject", d.GetName(), mine[i].Name, owner))
	}
	if len(twice) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s; have one of them serve these devices (nri-gpu's annotationKeys, or the other plugin)",
		ErrInjectedTwice, strings.Join(twice, "; "))
}
