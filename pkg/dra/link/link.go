// Package link joins nri-gpu and its DRA driver, nri-gpu-dra, which runs
// as a process of its own so that a node without DRA does not pay for
// Kubernetes' client (its API types and schemes are initialised in every
// process that links them, whether or not DRA is on). It holds what
// crosses between the two (plain types, no Kubernetes API type), both
// ends of the link (net/rpc's JSON-RPC over a pair of connected unix
// sockets the driver inherits) and the driver process, which nri-gpu
// starts when DRA is on.
//
// Over the link the driver asks nri-gpu's one pool (Pool: the devices to
// offer, prepare, unprepare, what is prepared), and nri-gpu asks the
// driver which prepared claims a container uses (Finder) and tells it
// when what is held changed (Notify).
package link

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// ErrNotReserved is wrapped by the error for a claim a container names
// that is not reserved for its pod.
var ErrNotReserved = errors.New("not reserved for the pod")

// Device types, as the "type" attribute says them.
const (
	TypeGPU = "gpu"
	TypeMIG = "mig"
)

// Info is what is known of a device: from the spec (its name and device
// nodes) and, where it can be had, NVML. A zero field is unknown, and the
// device then has no such attribute.
type Info struct {
	// Kind and Name are its CDI kind and name within it ("0", "0:1").
	Kind, Name string
	// Type is TypeGPU, TypeMIG or empty (another kind of device).
	Type string
	// Index is the GPU's index (for a MIG device, its parent's); -1 when
	// unknown.
	Index int
	// Minor is the minor number of /dev/nvidia<Minor>; -1 when unknown.
	Minor int
	// UUID is the device's, ParentUUID a MIG device's GPU's.
	UUID, ParentUUID string
	// Profile is a MIG device's profile ("1g.10gb").
	Profile string
	// ProductName, Brand and Architecture are NVML's.
	ProductName, Brand, Architecture string
	// DriverVersion and CUDAComputeCapability are versions ("550.54.15",
	// "9.0").
	DriverVersion, CUDAComputeCapability string
	// PCIBusID is the GPU's PCI address ("0000:3b:00.0").
	PCIBusID string
	// MemoryBytes is the device's memory.
	MemoryBytes uint64
	// Unhealthy, when set, is why the device is unhealthy: it stays
	// offered, tainted.
	Unhealthy *Health
	// Offer, when set, is what a device policy.sharing shares offers
	// claims (consumable capacity): several claims may be allocated it,
	// up to these amounts.
	Offer *policy.Capacity
}

// Health problems, as a taint's key names them after the driver's name
// (NVIDIA's DRA driver's keys): "<driver>/gpu-lost", "<driver>/xid".
const (
	ProblemLost = "gpu-lost"
	ProblemXid  = "xid"
	// ProblemGone is a device whose device nodes are not on the host.
	ProblemGone = "device-gone"
)

// Health is why a device is unhealthy.
type Health struct {
	// Problem is one of ProblemLost, ProblemXid, ProblemGone; Value the
	// Xid error's number for ProblemXid.
	Problem, Value string
	// Reason says it in words.
	Reason string
}

// label is what a device name may not have outside [a-z0-9-].
var label = regexp.MustCompile(`[^a-z0-9-]+`)

// DeviceName is the device's name in the ResourceSlice: "gpu-<minor>" for
// a GPU, as NVIDIA's DRA driver names it, else the CDI class and name as
// a DNS label ("gpu-0-1" for MIG device "0:1").
func (i Info) DeviceName() string {
	if i.Type == TypeGPU && i.Minor >= 0 {
		return fmt.Sprintf("gpu-%d", i.Minor)
	}
	_, class, _ := strings.Cut(i.Kind, "/")
	name := strings.Trim(label.ReplaceAllString(strings.ToLower(class+"-"+i.Name), "-"), "-")
	if len(name) > 63 {
		name = strings.TrimRight(name[:63], "-")
	}
	return name
}

// Device is a device the driver offers.
type Device struct {
	// CDI is the qualified CDI name ("nvidia.com/gpu=0").
	CDI string
	// Info is what is known of it; Info.DeviceName() is its name in the
	// ResourceSlice.
	Info Info
}

// Allocated is a device allocated to a claim on this node.
type Allocated struct {
	// CDI is the device's qualified CDI name.
	CDI string
	// Requests are the claim's requests it was allocated for.
	Requests []string
	// Use is what kube-scheduler allocated the claim of a device shared
	// by consumable capacity (zero: none was counted).
	Use policy.Use
	// MemoryAsked says one of Requests asked for an amount of memory.
	MemoryAsked bool
	// GpuConfig is what the claim's GpuConfig asked of the device's sharing.
	GpuConfig policy.GpuConfig
}

// Asked returns the devices allocated as the admission judges them,
// each looked up in snap: its footprint and hooks, or why it does not
// resolve, with what the claim asked of it.
func Asked(snap *specs.Snapshot, allocated []Allocated) []policy.Asked {
	out := make([]policy.Asked, 0, len(allocated))
	for _, a := range allocated {
		d := policy.Asked{Device: specs.Device{Name: a.CDI}}
		if e, err := snap.Lookup(a.CDI); err != nil {
			d.Unresolved = err
		} else {
			d.Device, d.Hooks = e.Footprint, e.Hooks
		}
		d.Claim = &policy.ClaimDevice{Device: d.Device, Requests: a.Requests, Use: a.Use, MemoryAsked: a.MemoryAsked, GpuConfig: a.GpuConfig}
		out = append(out, d)
	}
	return out
}

// PodRef is the pod of a container being created, as the runtime knows
// it.
type PodRef struct {
	Namespace, Name string
	// UID is the pod's UID (kubelet's, on the sandbox).
	UID string
}

// ClaimUse is a claim of the driver that a container uses.
type ClaimUse struct {
	// UID, Namespace and Name are the ResourceClaim's.
	UID, Namespace, Name string
	// Requests are the claim's requests the container names; empty for
	// all of them.
	Requests []string
}

// Pool is what the devices are and what preparing a claim holds:
// nri-gpu's trusted specs and its one pool of holdings, shared with the
// NRI side and the device plugin.
type Pool interface {
	// Devices returns the devices to offer now, in order: healthy ones
	// that no pod holds through another door.
	Devices(ctx context.Context) ([]Device, error)
	// Prepare holds a claim's devices, or says why it cannot.
	Prepare(ctx context.Context, claim policy.Claim, devices []Allocated) error
	// Unprepare releases what a claim holds; an error when the release
	// cannot be recorded (kubelet then asks again).
	Unprepare(ctx context.Context, uid string) error
	// Release releases what a claim the API server no longer has here
	// holds, as Unprepare does, unless pods whose containers the pool
	// tracks still use it: the claim then stays held, and the error
	// wraps policy.ErrClaimInUse naming them.
	Release(ctx context.Context, uid string) error
	// Prepared returns the claims held now: prepared since the start, or
	// restored from nri-gpu's record.
	Prepared(ctx context.Context) ([]policy.Claim, error)
}

// Finder tells which prepared claims a container uses.
type Finder interface {
	// Uses returns the claims the container uses, each reserved for its
	// pod, as the API server says; an error when it cannot tell, which
	// wraps ErrNotReserved for a claim the container names that is not
	// reserved for its pod.
	Uses(ctx context.Context, pod PodRef, container string) ([]ClaimUse, error)
}
