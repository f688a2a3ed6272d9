package plugin

import (
	"context"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/nri-gpu/nri-gpu/pkg/access"
	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
	"github.com/nri-gpu/nri-gpu/pkg/memlimit"
	"github.com/nri-gpu/nri-gpu/pkg/metrics"
	"github.com/nri-gpu/nri-gpu/pkg/mps"
	"github.com/nri-gpu/nri-gpu/pkg/record"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// Option tunes a Plugin.
type Option func(*Plugin)

// WithSpecDirs has the plugin read CDI specs from dirs, whatever
// cdiSpecDirs its configuration, or a later one from the runtime, says
// (the --cdi-spec-dirs flag).
func WithSpecDirs(dirs []string) Option {
	return func(p *Plugin) { p.flags.config.SpecDirs = slices.Clone(dirs) }
}

// WithGenerate has the plugin generate the spec of the node's NVIDIA
// GPUs whatever generate.enabled its configuration, or a later one from
// a reload or the runtime, says (the --generate-specs flag).
func WithGenerate() Option { return func(p *Plugin) { p.flags.config.Generate = true } }

// WithMetrics has the plugin record its metrics in m.
func WithMetrics(m *metrics.Metrics) Option { return func(p *Plugin) { p.metrics = m } }

// WithNVML has the plugin use lib for spec generation instead of the
// driver's NVML (tests use go-nvml's mock servers).
func WithNVML(lib nvml.Interface) Option { return func(p *Plugin) { p.flags.nvml = lib } }

// WithCgroups has the plugin find the containers' cgroups, whose GPU
// memory the driver bounds, under c (its proc filesystem and cgroup v2
// mount) instead of /proc and /sys/fs/cgroup (tests).
func WithCgroups(c memlimit.Cgroups) Option { return func(p *Plugin) { p.flags.cgroups = &c } }

// WithPartMajors has the plugin take the device nodes of these character
// majors for the parts of a GPU (a MIG device's capability nodes) instead
// of those of the major the host's /proc/devices lists for nvidia-caps
// (tests make their own).
func WithPartMajors(parts specs.PartMajors) Option { return func(p *Plugin) { p.flags.parts = parts } }

// WithHookPath has the specs the plugin generates name path as their CDI
// hook, instead of the plugin's own executable.
func WithHookPath(path string) Option { return func(p *Plugin) { p.flags.config.HookPath = path } }

// WithStateFile has the plugin keep what pods hold in the file at path
// (the --state-file flag), from which a restarted plugin learns it again.
// Without it, a restarted plugin learns it from the device nodes of the
// containers it gave devices only.
func WithStateFile(path string) Option {
	return func(p *Plugin) { p.flags.record = record.Open(path) }
}

// WithTakeOver has the plugin, when another nri-gpu holds its state file,
// wait for it to stop, until ctx is done, instead of refusing to start
// (the --take-over flag): a rolling update with surge, where the nri-gpu
// replaced serves until it stops and lets the record go only once it no
// longer serves, so that one nri-gpu at a time serves and keeps it.
func WithTakeOver(ctx context.Context) Option { return func(p *Plugin) { p.flags.takeOver = ctx } }

// WithAccessDir has the plugin keep in dir, and mount into each
// container it gives devices, its access file: what the container was
// given (the --access-dir flag; see package access). Without it,
// containers get none.
func WithAccessDir(dir string) Option {
	return func(p *Plugin) { p.node.access = access.Open(dir) }
}

// WithRecord has the plugin start from what the state file at path says
// pods and DRA claims hold (HoldRecorded), and never write it: for
// nri-gpu explain, beside the running plugin.
func WithRecord(path string) Option {
	return func(p *Plugin) { p.flags.record = record.OpenReadOnly(path) }
}

// WithMPSStart has managed MPS control daemons started by start, which
// runs the command it is given with shm as its /dev/shm (by default
// nri-gpu's mps-shm command, in a mount namespace of its own).
func WithMPSStart(start mps.Start) Option {
	return func(p *Plugin) {
		if start != nil { // a nil function is no launcher
			p.flags.mpsStart = start
		}
	}
}

// A Listener is told whenever what pods hold changes: a door beside the
// runtime's requests (a device plugin, which then tells kubelet which
// devices it may hand out; the DRA driver).
type Listener interface{ Notify() }

// A DRADriver is the DRA driver as the plugin uses it: a door that also
// says which prepared claims a container uses.
type DRADriver interface {
	Listener
	link.Finder
}

// WithDevicePlugin has the plugin tell door, a device plugin serving
// the plugin's view of a resource (Resource, given it once the plugin is
// built, through a deviceplugin.Later), whenever what pods hold changes.
func WithDevicePlugin(door Listener) Option {
	return func(p *Plugin) { p.doors.told = append(p.doors.told, door) }
}

// WithDRA has the plugin inject the devices of the prepared claims
// driver says a container uses, and tell it whenever what pods hold
// changes; driver serves the plugin's view of the devices and pool
// (DRAView, given it once the plugin is built, through a link.Later).
// Without it, no container gets a claim's devices.
func WithDRA(driver DRADriver) Option {
	return func(p *Plugin) {
		p.doors.claims = driver
		p.doors.told = append(p.doors.told, driver)
	}
}

// EventSink is told what nri-gpu does to a pod's containers that the
// pod's users should learn of (a container created while nri-gpu was
// away, stopped), for the pod's events; Post must not wait.
type EventSink interface{ Post(link.Event) }

// WithEvents has the plugin tell sink what the pods' users should learn
// of.
func WithEvents(sink EventSink) Option { return func(p *Plugin) { p.doors.events = sink } }
