// Package memlimit bounds the GPU memory a container may allocate through
// the NVIDIA driver itself: NVML's per-cgroup limits
// (nvmlDeviceSetMemoryLimits_v1), set on a GPU for the full path of a
// container's cgroup v2 directory, read back with the memory the cgroup
// uses (nvmlDeviceGetMemoryLimits_v1), and lifted (a soft limit of 0 and
// a hard limit of NVML_DEVICE_MEMORY_LIMIT_MAX, as nvml.h says; removing
// the cgroup lifts them too). The driver enforces them on cgroup v2 only,
// for whole GPUs only (not MIG handles), and where it has the call at all;
// everywhere else the error wraps ErrUnenforceable, saying why.
//
// What a container may ask in its own environment (NVIDIA's
// NVIDIA_GPU_MEMORY_REQUEST and NVIDIA_GPU_MEMORY_LIMIT, in MiB, which
// NVIDIA's apply-cuda-memory-limits hook reads) only lowers what it was
// given (Asked).
package memlimit

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/opencontainers/cgroups/systemd"
	"golang.org/x/sys/unix"
)

var (
	// ErrUnenforceable is wrapped by the error of a limit the driver
	// cannot enforce here: cgroup v1, a driver without the call, a MIG
	// device.
	ErrUnenforceable = errors.New("the driver cannot enforce GPU memory limits")
	// ErrAsked is wrapped by the error of a container's environment that
	// asks for a limit malformed.
	ErrAsked = errors.New("invalid GPU memory limit asked")
)

// Environment variables a container asks its limits by (MiB), as
// NVIDIA's apply-cuda-memory-limits hook reads them.
const (
	RequestEnv = "NVIDIA_GPU_MEMORY_REQUEST"
	LimitEnv   = "NVIDIA_GPU_MEMORY_LIMIT"
)

// Unlimited is NVML_DEVICE_MEMORY_LIMIT_MAX: a hard limit of it (with a
// soft limit of 0) is no limit.
const Unlimited uint64 = math.MaxUint64

// Bounds are a holder's limits on one GPU, in bytes: Soft is what it is
// guaranteed before allocations may fail under pressure, Hard the most
// it can allocate.
type Bounds struct{ Soft, Hard uint64 }

// None says b is no limit.
func (b Bounds) None() bool { return b.Soft == 0 && b.Hard == Unlimited }

// Asked returns the bounds of a holder granted granted bytes of a GPU:
// both limits at granted, lowered where env (the container's environment,
// KEY=VALUE) asks less by RequestEnv (soft) and LimitEnv (hard), in MiB;
// never above granted. A value that is not a whole number of MiB, or a
// request above the limit, is an error wrapping ErrAsked that names it.
func Asked(granted uint64, env []string) (Bounds, error) {
	b := Bounds{Soft: granted, Hard: granted}
	for _, v := range []struct {
		name string
		to   *uint64
	}{{LimitEnv, &b.Hard}, {RequestEnv, &b.Soft}} {
		s, ok := lookup(env, v.name)
		if !ok {
			continue
		}
		mib, err := strconv.ParseUint(s, 10, 64)
		if err != nil || mib > math.MaxUint64>>20 {
			return Bounds{}, fmt.Errorf("%w: %s=%.32q: not a whole number of MiB", ErrAsked, v.name, s)
		}
		*v.to = min(*v.to, mib<<20)
	}
	if _, ok := lookup(env, RequestEnv); ok && b.Soft > b.Hard {
		return Bounds{}, fmt.Errorf("%w: %s is more than %s", ErrAsked, RequestEnv, LimitEnv)
	}
	b.Soft = min(b.Soft, b.Hard)
	return b, nil
}

// AsksAny reports whether env asks for a limit at all (RequestEnv or
// LimitEnv).
func AsksAny(env []string) bool {
	_, req := lookup(env, RequestEnv)
	_, lim := lookup(env, LimitEnv)
	return req || lim
}

// lookup returns the last value of name in env, as a process sees it.
func lookup(env []string, name string) (string, bool) {
	for i := len(env) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(env[i], name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// Cgroups finds containers' cgroup v2 directories: Proc is the proc
// filesystem ("/proc"), Root where the cgroup v2 hierarchy is mounted
// ("/sys/fs/cgroup").
type Cgroups struct{ Proc, Root string }

// Host is the host's proc filesystem and cgroup v2 mount, where nri-gpu
// finds containers' cgroups on a node.
var Host = Cgroups{Proc: "/proc", Root: "/sys/fs/cgroup"}

// cgroup2Magic is CGROUP2_SUPER_MAGIC, statfs' type of a cgroup v2 mount.
const cgroup2Magic = 0x63677270

// V2 returns nil where Root is a cgroup v2 mount, else an error wrapping
// ErrUnenforceable (cgroup v1 or hybrid: the driver limits cgroup v2
// directories only).
func (c Cgroups) V2() error {
	var s unix.Statfs_t
	if err := unix.Statfs(c.Root, &s); err != nil {
		return fmt.Errorf("%w: %w", ErrUnenforceable, err)
	}
	if s.Type != cgroup2Magic {
		return fmt.Errorf("%w: %s is not cgroup v2 (the driver limits cgroup v2 only)", ErrUnenforceable, c.Root)
	}
	return nil
}

// Of returns the cgroup v2 directory of process pid, the process of
// container id: the one line of its /proc/<pid>/cgroup ("0::/path"),
// which must name id (a process of another container, or a reused pid,
// is not taken for it), under Root. A process in cgroup v1 hierarchies is
// an error wrapping ErrUnenforceable.
func (c Cgroups) Of(pid int, id string) (string, error) {
	b, err := os.ReadFile(filepath.Join(c.Proc, strconv.Itoa(pid), "cgroup"))
	if err != nil {
		return "", fmt.Errorf("the cgroup of process %d: %w", pid, err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	path, ok := strings.CutPrefix(lines[0], "0::")
	if len(lines) != 1 || !ok {
		return "", fmt.Errorf("%w: process %d is in cgroup v1 hierarchies (the driver limits cgroup v2 only)", ErrUnenforceable, pid)
	}
	if strings.HasPrefix(path, "/..") {
		return "", fmt.Errorf("process %d's cgroup %s is outside this process's cgroup namespace, whose view of the hierarchy is not the driver's", pid, path)
	}
	if id == "" || !strings.Contains(path, id) {
		return "", fmt.Errorf("process %d is not in container %.12s's cgroup (%s)", pid, id, path)
	}
	return filepath.Join(c.Root, filepath.Clean("/"+path)), nil
}

// OfContainer returns the cgroup v2 directory of container id: the one
// the runtime's cgroupsPath for it names, where the runtime tells it
// (containerd and CRI-O do): "slice:prefix:name" under systemd's cgroup
// driver (the slice expanded as systemd does, the container's unit
// prefix-name.scope), an absolute path under cgroupfs; it must name id
// and exist under Root. It does not depend on the cgroup namespace
// nri-gpu runs in (a container's, under the chart, sees other
// containers' /proc/<pid>/cgroup relative to its own), only on Root
// being the host's hierarchy. Without a cgroupsPath, its process's (Of).
func (c Cgroups) OfContainer(pid int, id, cgroupsPath string) (string, error) {
	if cgroupsPath == "" && pid > 0 {
		return c.Of(pid, id)
	}
	if err := c.V2(); err != nil {
		return "", err
	}
	rel := cgroupsPath
	if slice, unit, ok := strings.Cut(cgroupsPath, ":"); ok {
		prefix, name, _ := strings.Cut(unit, ":")
		dir, err := systemd.ExpandSlice(slice)
		if err != nil {
			return "", fmt.Errorf("container %.12s's cgroupsPath %q: %w", id, cgroupsPath, err)
		}
		if !strings.HasSuffix(name, ".slice") {
			name = prefix + "-" + name + ".scope"
		}
		rel = dir + "/" + name
	}
	if id == "" || !strings.Contains(rel, id) || !strings.HasPrefix(rel, "/") {
		return "", fmt.Errorf("the runtime tells no process of container %.12s, and its cgroupsPath %q does not name it", id, cgroupsPath)
	}
	dir := filepath.Join(c.Root, filepath.Clean(rel))
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return "", fmt.Errorf("container %.12s's cgroup %s: not a directory (%v)", id, dir, err)
	}
	return dir, nil
}

// lists reports whether Root's file (a list of controllers) names
// controller; a file that cannot be read names none.
func (c Cgroups) lists(file, controller string) bool {
	data, err := os.ReadFile(filepath.Join(c.Root, file))
	return err == nil && slices.Contains(strings.Fields(string(data)), controller)
}

// Driver sets, reads and lifts limits through NVML, which must be open
// (Init) while it is used.
type Driver struct{ Lib nvml.Interface }

// Set bounds the cgroup (its directory's full path) to b on the GPU of
// that UUID.
func (d Driver) Set(uuid, cgroup string, b Bounds) error {
	dev, err := d.whole(uuid)
	if err != nil {
		return err
	}
	ret := dev.SetMemoryLimits_v1(cgroup, b.Soft, b.Hard)
	switch ret {
	case nvml.SUCCESS:
		return nil
	case nvml.ERROR_NOT_FOUND:
		// Under the kernel's dmem controller, a cgroup without dmem.*
		// files (NVIDIA's MPS v3 memory partitioning documentation).
		return fmt.Errorf("setting the memory limits of %s on %s: %w (the cgroup is gone, or has no dmem controller: %s)", uuid, cgroup, ret, DmemHint)
	}
	return d.failed("setting the memory limits of "+uuid, ret)
}

// DmemHint says how a container's cgroup gets the kernel's dmem
// controller, where the driver bounds GPU memory through it.
const DmemHint = "each of its parents' cgroup.subtree_control needs +dmem, from the root down"

// Lift removes the cgroup's limits on the GPU of that UUID.
func (d Driver) Lift(uuid, cgroup string) error {
	return d.Set(uuid, cgroup, Bounds{Soft: 0, Hard: Unlimited})
}

// Get returns the cgroup's limits on the GPU of that UUID and the memory
// it uses there (bytes).
func (d Driver) Get(uuid, cgroup string) (Bounds, uint64, error) {
	dev, err := d.whole(uuid)
	if err != nil {
		return Bounds{}, 0, err
	}
	l, ret := dev.GetMemoryLimits_v1(cgroup)
	if ret != nvml.SUCCESS {
		return Bounds{}, 0, d.failed("reading the memory limits of "+uuid, ret)
	}
	return Bounds{Soft: l.SoftLimit, Hard: l.HardLimit}, l.CurrentUsed, nil
}

// setLimits is the driver's call; an older driver's NVML has no such
// symbol (calling it would end the process: NVML is loaded lazily).
const setLimits = "nvmlDeviceSetMemoryLimits_v1"

// Has returns nil where the driver's NVML has per-cgroup memory limits,
// else an error wrapping ErrUnenforceable.
func (d Driver) Has() error {
	if err := d.Lib.Extensions().LookupSymbol(setLimits); err != nil {
		return fmt.Errorf("%w: the driver's NVML has no %s (a driver older than CUDA 13.4's)", ErrUnenforceable, setLimits)
	}
	return nil
}

// whole returns the handle of the GPU of that UUID, an error wrapping
// ErrUnenforceable for a MIG device or a driver without the calls.
func (d Driver) whole(uuid string) (nvml.Device, error) {
	if err := d.Has(); err != nil {
		return nil, err
	}
	dev, ret := d.Lib.DeviceGetHandleByUUID(uuid)
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("GPU %s: %w", uuid, ret)
	}
	if mig, ret := dev.IsMigDeviceHandle(); ret == nvml.SUCCESS && mig {
		return nil, fmt.Errorf("%w: %s is a MIG device (the driver limits whole GPUs only)", ErrUnenforceable, uuid)
	}
	return dev, nil
}

// failed is the error of a call NVML answered ret: one wrapping
// ErrUnenforceable where the driver lacks it.
func (d Driver) failed(what string, ret nvml.Return) error {
	if ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_FUNCTION_NOT_FOUND {
		return fmt.Errorf("%w: %s: %w (the driver has no per-cgroup memory limits)", ErrUnenforceable, what, ret)
	}
	return fmt.Errorf("%s: %w", what, ret)
}

// Support says whether the driver can enforce limits on this node, as
// Probe found: Cgroup and Driver are nil where cgroup v2 and the driver's
// call are there; GPUs has each GPU's UUID and why the driver cannot
// limit it (nil where it can).
type Support struct {
	Cgroup, Driver error
	GPUs           []GPUSupport
	// Dmem says the kernel's dmem controller is there but not enabled
	// below the cgroup root (Cgroups.Dmem): where the driver bounds
	// memory through it, no container's cgroup can be bounded. A
	// warning, not a reason the driver cannot (it may use its own
	// accounting instead).
	Dmem error
}

// GPUSupport is one GPU's answer to Probe.
type GPUSupport struct {
	UUID string
	Err  error
}

// Enforced reports whether every check of s passed (and found a GPU).
func (s Support) Enforced() bool { return len(s.Why()) == 0 }

// Why says why the driver cannot enforce limits here, a reason each:
// cgroup's, the driver's, each GPU's ("UUID: why"), or that NVML lists
// no GPU; none where it can.
func (s Support) Why() []string {
	var why []string
	for _, err := range []error{s.Cgroup, s.Driver} {
		if err != nil {
			why = append(why, err.Error())
		}
	}
	for _, g := range s.GPUs {
		if g.Err != nil {
			why = append(why, g.UUID+": "+g.Err.Error())
		}
	}
	if len(why) == 0 && len(s.GPUs) == 0 {
		why = append(why, "NVML lists no GPU")
	}
	return why
}

// Open runs f with lib's NVML open, and shuts it once f returns; an
// NVML that does not open is the error.
func Open(lib nvml.Interface, f func(Driver) error) error {
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return fmt.Errorf("NVML: %w", ret)
	}
	defer lib.Shutdown()
	return f(Driver{Lib: lib})
}

// Probe asks whether the driver can limit GPU memory here: c's root is
// cgroup v2, lib (opened here) has the call, and each GPU answers a read
// of the limits of c's root (NOT_SUPPORTED where the driver or the GPU
// lacks them). The error is an NVML that does not open.
func Probe(lib nvml.Interface, c Cgroups) (Support, error) {
	var s Support
	err := Open(lib, func(d Driver) error {
		s = probe(d, c)
		return nil
	})
	return s, err
}

// probe is Probe with d's NVML open.
func probe(d Driver, c Cgroups) Support {
	lib := d.Lib
	s := Support{Cgroup: c.V2(), Driver: d.Has()}
	if s.Driver != nil {
		return s
	}
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		s.Driver = fmt.Errorf("counting the GPUs: %w", ret)
		return s
	}
	for i := range n {
		dev, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			s.GPUs = append(s.GPUs, GPUSupport{UUID: fmt.Sprintf("GPU %d", i), Err: fmt.Errorf("GPU %d: %w", i, ret)})
			continue
		}
		uuid, ret := dev.GetUUID()
		if ret != nvml.SUCCESS {
			s.GPUs = append(s.GPUs, GPUSupport{UUID: fmt.Sprintf("GPU %d", i), Err: fmt.Errorf("GPU %d's UUID: %w", i, ret)})
			continue
		}
		// Only a driver that lacks the limits says the GPU cannot: the
		// root itself may have none to read (under the dmem controller
		// it has no dmem files), which is not the GPU's lack.
		_, _, err := d.Get(uuid, c.Root)
		if !errors.Is(err, ErrUnenforceable) {
			err = nil
		}
		s.GPUs = append(s.GPUs, GPUSupport{UUID: uuid, Err: err})
	}
	if s.Cgroup == nil {
		s.Dmem = c.Dmem()
	}
	return s
}

// Dmem returns why the cgroups below Root cannot have the kernel's dmem
// controller, through which the driver bounds GPU memory where the
// kernel has it (Linux 6.14 and later): the root's cgroup.controllers
// lists it, and its cgroup.subtree_control does not enable it. nil where
// the kernel has no dmem controller, or the root enables it.
func (c Cgroups) Dmem() error {
	if !c.lists("cgroup.controllers", "dmem") || c.lists("cgroup.subtree_control", "dmem") {
		return nil
	}
	return fmt.Errorf("the kernel's dmem controller, through which the driver bounds GPU memory, is not enabled below %s (its cgroup.subtree_control): a container's cgroup then has no dmem files, and the driver cannot bound it", c.Root)
}
