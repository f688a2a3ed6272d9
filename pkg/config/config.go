// Package config loads, defaults and validates nri-gpu's configuration.
//
// One function, Parse, serves both the configuration file given with
// --config and the string that NRI's Configure hands a pre-registered
// plugin, so no caller ever holds an unvalidated configuration.
//
// A file of version v1 (the key version: v1) keeps what is read only at
// start in its start block (driverRoot, health, devicePlugin, dra, mps):
// a reload that changes one of them is refused naming the key. All the
// rest reloads. A file without version is read in the layout nri-gpu had
// before versions (those start-only keys and generateSpecs,
// generateInterval, healthInterval, healthRecoverAfter at the top level)
// and converted, so that existing files keep working.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"go.yaml.in/yaml/v3"
)

// UnsupportedEdits says what to do with CDI edits that NRI cannot express.
type UnsupportedEdits string

const (
	// UnsupportedError fails the container naming the device and the edit.
	UnsupportedError UnsupportedEdits = "error"
	// UnsupportedWarn skips the edit, and the plugin logs that it did.
	UnsupportedWarn UnsupportedEdits = "warn"
)

// Pod annotation keys nri-gpu can read (annotationKeys), each in its
// plain, /pod and /container.<name> forms.
const (
	// KeyNRIGPU is nri-gpu's own: qualified or short device names.
	KeyNRIGPU = "gpus.nri-gpu.io"
	// KeyNVIDIA is NVIDIA's NRI plugin's: qualified CDI names only.
	KeyNVIDIA = "nvidia.cdi.k8s.io"
)

// Version is the configuration's version this nri-gpu reads.
const Version = "v1"

// Config is nri-gpu's configuration. Every field is documented in the
// README and in config/nri-gpu.yaml.
type Config struct {
	// Version is the file's layout: "v1".
	Version string `yaml:"version"`
	// CDISpecDirs are the directories CDI specs are read from; a spec in a
	// later directory wins over one of the same name in an earlier one.
	CDISpecDirs []string `yaml:"cdiSpecDirs"`
	// DefaultKind is the CDI kind (vendor/class) that short device names in
	// annotations are resolved against.
	DefaultKind string `yaml:"defaultKind"`
	// HonorCDIAnnotations says whether cdi.k8s.io/* container annotations
	// request devices too.
	HonorCDIAnnotations *bool `yaml:"honorCDIAnnotations"`
	// AnnotationKeys are the pod annotation keys that request devices by
	// name: KeyNRIGPU, KeyNVIDIA or both. A container asking through
	// several gets their union, once.
	AnnotationKeys []string `yaml:"annotationKeys"`
	// UnsupportedEdits is "error" or "warn": what to do with CDI edits
	// (additionalGids, intelRdt, netDevices) that NRI cannot express.
	UnsupportedEdits UnsupportedEdits `yaml:"unsupportedEdits"`
	// HookFree has nri-gpu give devices with no OCI hook: the work of
	// each of NVIDIA's hooks is done by mounts and device nodes the
	// runtime applies, and a device with another hook is refused.
	HookFree bool `yaml:"hookFree"`
	// Generate has nri-gpu write the CDI spec of the node's NVIDIA GPUs.
	Generate Generate `yaml:"generate"`
	// Policy says who may have which devices.
	Policy Policy `yaml:"policy"`
	// Start is what is read only when nri-gpu starts.
	Start Start `yaml:"start"`
}

// Generate is the generate block: the CDI spec of the node's NVIDIA GPUs
// generated with NVML (of start.driverRoot), at start and whenever the
// GPUs change, into the last spec directory.
type Generate struct {
	// Enabled turns generation on; it is off by default.
	Enabled bool `yaml:"enabled"`
	// Interval is how often the GPUs are checked for changes.
	Interval time.Duration `yaml:"interval"`
}

// Start is the start block: what nri-gpu reads when it starts, and a
// reload may not change (restart nri-gpu to change it).
type Start struct {
	// DriverRoot is where the NVIDIA driver's files are: the NVML that
	// generation, health, topology and DRA's attributes ask is the one
	// under it, and generated specs name the driver's files under it.
	DriverRoot string `yaml:"driverRoot"`
	// Health says how the NVIDIA GPUs' health is watched (NVML).
	Health Health `yaml:"health"`
	// DevicePlugin has nri-gpu serve kubelet's device-plugin API too.
	DevicePlugin DevicePlugin `yaml:"devicePlugin"`
	// DRA has nri-gpu serve as a Dynamic Resource Allocation driver too.
	DRA DRA `yaml:"dra"`
	// MPS says where the MPS control daemons of GPUs shared with the mps
	// strategy are, and whether nri-gpu runs them.
	MPS MPS `yaml:"mps"`
	// Events has nri-gpu tell, in a pod's events on the API server, what
	// it did to the pod's containers (one created while nri-gpu was away
	// and stopped).
	Events Events `yaml:"events"`
}

// Events is the start.events block.
type Events struct {
	// Enabled turns the events on; they are off by default (a node
	// without the API server). Each is posted by a short-lived
	// nri-gpu-dra process, Kubernetes' client being paid for only then.
	Enabled bool `yaml:"enabled"`
	// Kubeconfig is the kubeconfig file to reach the API server with;
	// empty uses the pod's service account.
	Kubeconfig string `yaml:"kubeconfig"`
}

// Health is the start.health block.
type Health struct {
	// Interval is how often the NVIDIA GPUs are checked (NVML).
	Interval time.Duration `yaml:"interval"`
	// RecoverAfter is how long after a critical Xid error a GPU that
	// answers its checks is healthy again; 0 keeps it unhealthy until
	// nri-gpu restarts.
	RecoverAfter time.Duration `yaml:"recoverAfter"`
}

// Strategy is how a shared GPU is shared (policy.sharing[].strategy).
type Strategy string

const (
	// StrategyTimeSlicing lets the pods' processes take turns on the GPU, as
	// the driver schedules them, with no bound on what each uses.
	StrategyTimeSlicing Strategy = "timeSlicing"
	// StrategyMPS has the pods' processes run as clients of one MPS server per
	// GPU, each bounded in compute and device memory.
	StrategyMPS Strategy = "mps"
)

// Sharing is one entry of policy.sharing: the devices it covers may be
// used by up to Replicas pods at once.
type Sharing struct {
	// Devices are globs over qualified device names ("nvidia.com/gpu=*").
	// A device is covered by the first entry that matches one of its
	// names.
	Devices []string `yaml:"devices"`
	// Replicas is how many pods may use one such device at once: 2 or
	// more.
	Replicas int `yaml:"replicas"`
	// Strategy is "timeSlicing" (the default) or "mps".
	Strategy Strategy `yaml:"strategy"`
	// ActiveThreadPercentage is, for mps, the share of the GPU's
	// multiprocessors each client may use: 1 to 100, by default
	// 100/Replicas.
	ActiveThreadPercentage int `yaml:"activeThreadPercentage"`
	// PinnedMemoryLimit is, for mps, the device memory each client may
	// pin, as a quantity ("10Gi"); by default the GPU's memory (as NVML
	// tells it) divided by Replicas.
	PinnedMemoryLimit string `yaml:"pinnedMemoryLimit"`
	// Memory is the GPU memory shared, as a quantity ("80Gi"): by default
	// the GPU's as NVML tells it. Each user consumes some of it (a pod
	// MemoryRequest.Default, a DRA claim what kube-scheduler allocated
	// it), and a device takes no user past it.
	Memory string `yaml:"memory"`
	// MemoryRequest is how much memory a user may consume, as published
	// to kube-scheduler (consumable capacity).
	MemoryRequest MemoryRequest `yaml:"memoryRequest"`
	// MemoryQuota says, for timeSlicing (which cannot bound memory), that
	// memory is a scheduling quota only: a DRA claim that asks for an
	// amount of memory is then prepared, else refused.
	MemoryQuota bool `yaml:"memoryQuota"`
}

// MemoryRequest is the request policy of a shared GPU's memory: what one
// user consumes when it asks for no amount, and what amounts it may ask
// for (quantities such as "10Gi").
type MemoryRequest struct {
	// Default is what a user that asks for no amount consumes (every
	// pod, and each claim that asks none): by default PinnedMemoryLimit,
	// else Memory divided by Replicas, rounded down to Step.
	Default string `yaml:"default"`
	// Minimum and Maximum bound what a claim may ask for: by default Step
	// and Memory.
	Minimum string `yaml:"minimum"`
	Maximum string `yaml:"maximum"`
	// Step is the granularity of amounts: by default 1Mi.
	Step string `yaml:"step"`
}

// MPSDaemon says who runs the MPS control daemons.
type MPSDaemon string

const (
	// MPSExternal: the operator runs one control daemon per MPS-shared
	// GPU, with its pipe directory where nri-gpu looks for it.
	MPSExternal MPSDaemon = "external"
	// MPSManaged: nri-gpu starts one control daemon per MPS-shared GPU
	// and stops it when the GPU is no longer shared with mps.
	MPSManaged MPSDaemon = "managed"
)

// MPS is the start.mps block of the configuration.
type MPS struct {
	// Daemon is "external" (the default) or "managed".
	Daemon MPSDaemon `yaml:"daemon"`
	// ControlCommand is the driver's nvidia-cuda-mps-control, which
	// nri-gpu runs to start, ask and stop a daemon.
	ControlCommand string `yaml:"controlCommand"`
	// Root holds each MPS-shared GPU's directories: Root/<GPU>/pipe, log
	// and shm, <GPU> its UUID where the spec names it so, else its name
	// within its kind.
	Root string `yaml:"root"`
	// HostRoot, when set, is where nri-gpu sees the host's root
	// directory (the chart mounts it at /host): ControlCommand then runs
	// chrooted there, with the host's libraries, and Root must be the
	// same directory on the host and in nri-gpu's view.
	HostRoot string `yaml:"hostRoot"`
	// CheckInterval is how often nri-gpu looks at the daemons it
	// manages (daemon: managed): starts those gone, sets new limits.
	CheckInterval time.Duration `yaml:"checkInterval"`
}

// DRA is the start.dra block of the configuration: nri-gpu as a Dynamic
// Resource Allocation driver (kubelet's DRA plugin API, ResourceSlices
// published through the API server).
type DRA struct {
	// Enabled turns the driver on; it is off by default.
	Enabled bool `yaml:"enabled"`
	// DriverName is the driver's name, which DeviceClasses select and
	// ResourceSlices carry: a DNS subdomain.
	DriverName string `yaml:"driverName"`
	// Kinds are the CDI kinds whose devices the driver offers; the
	// default kind by default.
	Kinds []string `yaml:"kinds"`
	// Devices are globs over the device names within the kinds, as a
	// device-plugin resource's are.
	Devices []string `yaml:"devices"`
	// NodeName is the Kubernetes node nri-gpu runs on; empty takes the
	// NODE_NAME environment variable.
	NodeName string `yaml:"nodeName"`
	// Kubeconfig is the kubeconfig file to reach the API server with;
	// empty uses the pod's service account (in-cluster).
	Kubeconfig string `yaml:"kubeconfig"`
	// PluginDir is kubelet's plugins directory: the driver's socket and
	// files go in PluginDir/DriverName.
	PluginDir string `yaml:"pluginDir"`
	// RegistryDir is kubelet's plugin registration directory.
	RegistryDir string `yaml:"registryDir"`
	// UnhealthyTaint is the effect of the taint an unhealthy device
	// carries in the ResourceSlice: "NoSchedule" (the default: no new
	// claim gets it) or "NoExecute" (kube-controller-manager also evicts
	// the pods of the claims that have it).
	UnhealthyTaint string `yaml:"unhealthyTaint"`
	// CDIDevices says who injects a prepared claim's devices: "cri" (the
	// default: the driver returns their CDI device IDs, which kubelet
	// puts in the CRI request; the runtime's own CDI injects them where
	// it is on, nri-gpu where it is off) or "nri-gpu" (it returns none:
	// nri-gpu injects them on every runtime).
	CDIDevices CDIDevices `yaml:"cdiDevices"`
	// SweepInterval is how often the driver asks the API server about
	// each claim it has prepared, releasing those it no longer has or no
	// longer allocates on this node (kubelet never unprepares them): one
	// GET a prepared claim each time.
	SweepInterval time.Duration `yaml:"sweepInterval"`
	// MetricsAddress, when set, is the HOST:PORT on which the driver
	// serves its own Prometheus metrics (prepare and unprepare by result
	// and duration, requests in flight, claims prepared, API-server
	// errors, how long its ResourceSlice takes to follow a change); off
	// by default.
	MetricsAddress string `yaml:"metricsAddress"`
}

// The effects of an unhealthy device's taint (dra.unhealthyTaint).
const (
	TaintNoSchedule = "NoSchedule"
	TaintNoExecute  = "NoExecute"
)

// CDIDevices says how a door (the device plugin, the DRA driver) hands
// kubelet's allocation to the runtime, and so who injects it.
type CDIDevices string

const (
	// CDIAnnotations has kubelet write cdi.k8s.io/nri-gpu_<resource>
	// container annotations, which nri-gpu injects under its policy and
	// trust rules (any runtime; the only way on containerd 1.7).
	CDIAnnotations CDIDevices = "annotations"
	// CDICRI has kubelet put the devices in the CRI request's CDI devices,
	// which the runtime injects with its own CDI support (containerd 2.x
	// with enable_cdi on); nri-gpu accounts for them.
	CDICRI CDIDevices = "cri"
	// CDINRIGPU hands the runtime nothing its own CDI would inject: the
	// device plugin has kubelet write a devices.nri-gpu.io/<resource>
	// container annotation, the DRA driver returns no CDI device IDs, and
	// nri-gpu alone injects the devices, on every runtime. What a
	// user-namespaced pod needs on a runtime with its CDI on where a
	// spec's device node has a hostPath other than its path (runc cannot
	// create such a node from the runtime's CDI in a user namespace).
	CDINRIGPU CDIDevices = "nri-gpu"
)

// DevicePlugin is the start.devicePlugin block of the configuration.
type DevicePlugin struct {
	// Resources are the extended resources to offer kubelet; none turns
	// device-plugin mode off.
	Resources []Resource `yaml:"resources"`
	// KubeletDir is kubelet's device-plugin directory, where its
	// registration socket is and nri-gpu's sockets go.
	KubeletDir string `yaml:"kubeletDir"`
	// PodResources is kubelet's pod-resources socket, which says the
	// devices kubelet allocated pods whose containers are not created
	// yet (a count request passes over them); by default
	// pod-resources/kubelet.sock beside KubeletDir.
	PodResources string `yaml:"podResources"`
	// CDIDevices is "annotations", "cri" or "nri-gpu".
	CDIDevices CDIDevices `yaml:"cdiDevices"`
	// Relay, when set, is a directory where nri-gpu serves each
	// resource's device plugin to nri-gpu relay, the process that
	// registers with kubelet and keeps kubelet's endpoint while nri-gpu
	// is away; nri-gpu then registers with kubelet itself no more.
	Relay string `yaml:"relay"`
}

// Resource is one extended resource: the devices of a CDI kind whose
// names match Devices.
type Resource struct {
	// Name is the resource name, as pods ask for it ("nvidia.com/gpu").
	Name string `yaml:"name"`
	// Kind is the CDI kind its devices come from; the name by default.
	Kind string `yaml:"kind"`
	// Devices are globs over the device names within the kind ("*", or
	// "*:*" for NVIDIA's MIG devices named by index). A device that
	// shares hardware with one listed before it (a GPU by UUID after the
	// same GPU by index) is left out, and "all" always is.
	Devices []string `yaml:"devices"`
}

// Policy is the policy block of the configuration.
type Policy struct {
	// Namespaces are globs of pod namespaces that may request devices
	// through annotations (cdi.k8s.io ones too, unless
	// ExemptCDIAnnotations).
	Namespaces []string `yaml:"namespaces"`
	// Devices are globs over qualified device names that may be requested.
	Devices []string `yaml:"devices"`
	// AllowAll says whether a pod may ask for a kind's "all" device.
	AllowAll bool `yaml:"allowAll"`
	// MaxDevicesPerPod caps the devices one pod may hold; 0 is no limit.
	MaxDevicesPerPod int `yaml:"maxDevicesPerPod"`
	// Exclusive says whether a device serves one pod at a time.
	Exclusive bool `yaml:"exclusive"`
	// HookPaths are the hook executables that specs may inject.
	HookPaths []string `yaml:"hookPaths"`
	// ExemptCDIAnnotations exempts cdi.k8s.io annotation requests from
	// Namespaces and AllowAll, for nodes where only node components can
	// write those annotations.
	ExemptCDIAnnotations bool `yaml:"exemptCDIAnnotations"`
	// AllowUnhealthy lets a pod ask by name for a device whose GPU nri-gpu
	// found unhealthy (count requests never get one).
	AllowUnhealthy bool `yaml:"allowUnhealthy"`
	// Sharing lists devices that several pods may use at once, and how;
	// a device no entry covers serves one pod at a time or any number,
	// as Exclusive says.
	Sharing []Sharing `yaml:"sharing"`
	// MemoryLimits says what becomes of a holder of a GPU that a
	// timeSlicing entry shares with its memory counted, where the driver
	// cannot bound the holder's memory to what the pool gave it (cgroup
	// v1, a driver without per-cgroup limits, a MIG device):
	// "enforced" (the default) refuses it, saying why; "agreement" runs
	// it bounded only by agreement, said in its events and the log.
	MemoryLimits MemoryLimits `yaml:"memoryLimits"`
}

// MemoryLimits is policy.memoryLimits.
type MemoryLimits string

// The values of policy.memoryLimits.
const (
	// MemoryLimitsEnforced refuses a holder whose memory the driver
	// cannot bound.
	MemoryLimitsEnforced MemoryLimits = "enforced"
	// MemoryLimitsAgreement runs it bounded only by agreement.
	MemoryLimitsAgreement MemoryLimits = "agreement"
)

// Defaults of the configuration, applied to every key not set.
var (
	DefaultCDISpecDirs      = []string{"/etc/cdi", "/var/run/cdi"}
	DefaultKind             = "nvidia.com/gpu"
	DefaultNamespaces       = []string{"*"}
	DefaultDevices          = []string{"nvidia.com/gpu=*"}
	DefaultHookPaths        = []string{"/usr/bin/nvidia-cdi-hook", "/usr/bin/nvidia-ctk"}
	DefaultGenerateInterval = 60 * time.Second
	DefaultDriverRoot       = "/"
	DefaultKubeletDir       = "/var/lib/kubelet/device-plugins"
	DefaultHealthInterval   = 10 * time.Second
	DefaultResourceDevices  = []string{"*"}
	DefaultDRADriverName    = "gpu.nri-gpu.io"
	DefaultDRAPluginDir     = "/var/lib/kubelet/plugins"
	DefaultDRARegistryDir   = "/var/lib/kubelet/plugins_registry"
	DefaultMPSControl       = "/usr/bin/nvidia-cuda-mps-control"
	DefaultMPSRoot          = "/run/nri-gpu/mps"
	DefaultMPSCheckInterval = 10 * time.Second
	DefaultDRASweepInterval = 10 * time.Minute
)

// Default returns the configuration used when none is given.
func Default() *Config {
	c, err := Parse(nil)
	if err != nil {
		panic(fmt.Sprintf("default configuration is invalid: %v", err))
	}
	return c
}

// Load reads and parses the configuration file at path.
func Load(file string) (*Config, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	c, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", file, err)
	}
	return c, nil
}

// Parse unmarshals data strictly (an unknown key is an error) in the
// layout its version key names (none: the layout before versions), fills
// in defaults and validates the result. Empty data gives the defaults.
func Parse(data []byte) (*Config, error) {
	c, unversioned, err := decode(data)
	if err != nil {
		return nil, fmt.Errorf("invalid config: %w", err)
	}
	c.setDefaults()
	if errs := c.problems(); len(errs) > 0 {
		return nil, invalid(spelt(errs, unversioned))
	}
	return c, nil
}

// decode unmarshals data strictly into a Config, as its version says,
// and reports whether it had none.
func decode(data []byte) (*Config, bool, error) {
	var (
		root yaml.Node
		head struct {
			Version string `yaml:"version"`
		}
	)
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, false, err
	}
	if len(root.Content) == 0 || len(root.Content[0].Content) == 0 {
		head.Version = Version // nothing set: the defaults, in v1
	} else if err := root.Content[0].Decode(&head); err != nil {
		return nil, false, err
	}
	var (
		c   = &Config{}
		old = &unversioned{}
		dst any
	)
	switch head.Version {
	case Version:
		dst = c
	case "":
		dst = old
	default:
		return nil, false, fmt.Errorf("version: %q is not one this nri-gpu reads (%s)", head.Version, Version)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(dst); err != nil && !errors.Is(err, io.EOF) {
		return nil, false, err
	}
	var extra any
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, false, errors.New("more than one YAML document")
	}
	if dst == old {
		return old.convert(), true, nil
	}
	return c, false, nil
}

// HonorsCDIAnnotations reports whether cdi.k8s.io/* container annotations
// request devices.
func (c *Config) HonorsCDIAnnotations() bool {
	return c.HonorCDIAnnotations == nil || *c.HonorCDIAnnotations
}

func (c *Config) setDefaults() {
	if c.CDISpecDirs == nil {
		c.CDISpecDirs = append([]string(nil), DefaultCDISpecDirs...)
	}
	if c.DefaultKind == "" {
		c.DefaultKind = DefaultKind
	}
	if c.AnnotationKeys == nil {
		c.AnnotationKeys = []string{KeyNRIGPU}
	}
	if c.HonorCDIAnnotations == nil {
		honor := true
		c.HonorCDIAnnotations = &honor
	}
	if c.UnsupportedEdits == "" {
		c.UnsupportedEdits = UnsupportedError
	}
	if c.Version == "" {
		c.Version = Version
	}
	if c.Generate.Interval == 0 {
		c.Generate.Interval = DefaultGenerateInterval
	}
	if c.Start.DriverRoot == "" {
		c.Start.DriverRoot = DefaultDriverRoot
	}
	if c.Start.Health.Interval == 0 {
		c.Start.Health.Interval = DefaultHealthInterval
	}
	d := &c.Start.DevicePlugin
	if d.KubeletDir == "" {
		d.KubeletDir = DefaultKubeletDir
	}
	if d.PodResources == "" {
		d.PodResources = filepath.Join(filepath.Dir(d.KubeletDir), "pod-resources", "kubelet.sock")
	}
	// With hookFree, the doors hand the runtime's own CDI nothing: it
	// would run the devices' hooks.
	if d.CDIDevices == "" && c.HookFree {
		d.CDIDevices = CDINRIGPU
	}
	if d.CDIDevices == "" {
		d.CDIDevices = CDIAnnotations
	}
	if len(d.Resources) == 0 {
		d.Resources = nil // "resources: []" is the default, none
	}
	for i := range d.Resources {
		r := &d.Resources[i]
		if r.Kind == "" {
			r.Kind = r.Name
		}
		if r.Devices == nil {
			r.Devices = append([]string(nil), DefaultResourceDevices...)
		}
	}
	r := &c.Start.DRA
	if r.DriverName == "" {
		r.DriverName = DefaultDRADriverName
	}
	if r.Kinds == nil {
		r.Kinds = []string{c.DefaultKind}
	}
	if r.Devices == nil {
		r.Devices = append([]string(nil), DefaultResourceDevices...)
	}
	if r.PluginDir == "" {
		r.PluginDir = DefaultDRAPluginDir
	}
	if r.RegistryDir == "" {
		r.RegistryDir = DefaultDRARegistryDir
	}
	if r.UnhealthyTaint == "" {
		r.UnhealthyTaint = TaintNoSchedule
	}
	if r.CDIDevices == "" && c.HookFree {
		r.CDIDevices = CDINRIGPU
	}
	if r.CDIDevices == "" {
		r.CDIDevices = CDICRI
	}
	if r.SweepInterval == 0 {
		r.SweepInterval = DefaultDRASweepInterval
	}
	m := &c.Start.MPS
	if m.CheckInterval == 0 {
		m.CheckInterval = DefaultMPSCheckInterval
	}
	if m.Daemon == "" {
		m.Daemon = MPSExternal
	}
	if m.ControlCommand == "" {
		m.ControlCommand = DefaultMPSControl
	}
	if m.Root == "" {
		m.Root = DefaultMPSRoot
	}
	p := &c.Policy
	if p.MemoryLimits == "" {
		p.MemoryLimits = MemoryLimitsEnforced
	}
	if len(p.Sharing) == 0 {
		p.Sharing = nil // "sharing: []" is the default, none
	}
	for i := range p.Sharing {
		if p.Sharing[i].Strategy == "" {
			p.Sharing[i].Strategy = StrategyTimeSlicing
		}
	}
	if p.Namespaces == nil {
		p.Namespaces = append([]string(nil), DefaultNamespaces...)
	}
	if p.Devices == nil {
		p.Devices = append([]string(nil), DefaultDevices...)
	}
	if p.HookPaths == nil {
		p.HookPaths = append([]string(nil), DefaultHookPaths...)
	}
}
