// Package config loads, defaults and validates nri-gpu's configuration.
//
// One function, Parse, serves both the configuration file given with
// --config and the string that NRI's Configure hands a pre-registered
// plugin, so no caller ever holds an unvalidated configuration.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
	"tags.cncf.io/container-device-interface/pkg/parser"
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

// Config is nri-gpu's configuration. Every field is documented in the
// README and in config/nri-gpu.yaml.
type Config struct {
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
	// GenerateSpecs has the plugin generate the CDI spec of the node's
	// NVIDIA GPUs with NVML, at start and whenever the GPUs change, into
	// the last spec directory.
	GenerateSpecs bool `yaml:"generateSpecs"`
	// GenerateInterval is how often the GPUs are checked for changes.
	GenerateInterval time.Duration `yaml:"generateInterval"`
	// DriverRoot is where the NVIDIA driver's files are, for generation.
	DriverRoot string `yaml:"driverRoot"`
	// HealthInterval is how often the NVIDIA GPUs are checked (NVML).
	HealthInterval time.Duration `yaml:"healthInterval"`
	// HealthRecoverAfter is how long after a critical Xid error a GPU that
	// answers its checks is healthy again; 0 keeps it unhealthy until
	// nri-gpu restarts.
	HealthRecoverAfter time.Duration `yaml:"healthRecoverAfter"`
	// Policy says who may have which devices.
	Policy Policy `yaml:"policy"`
	// DevicePlugin has nri-gpu serve kubelet's device-plugin API too.
	DevicePlugin DevicePlugin `yaml:"devicePlugin"`
	// DRA has nri-gpu serve as a Dynamic Resource Allocation driver too.
	DRA DRA `yaml:"dra"`
	// MPS says where the MPS control daemons of GPUs shared with the mps
	// strategy are, and whether nri-gpu runs them.
	MPS MPS `yaml:"mps"`
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

// MPS is the mps block of the configuration. It is read at start: a
// change takes a restart.
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
}

// DRA is the dra block of the configuration: nri-gpu as a Dynamic
// Resource Allocation driver (kubelet's DRA plugin API, ResourceSlices
// published through the API server). It is read at start: a change takes
// a restart.
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
}

// CDIDevices says how a device plugin hands kubelet's allocation to the
// runtime.
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
)

// DevicePlugin is the devicePlugin block of the configuration. It is read
// at start: a change takes a restart.
type DevicePlugin struct {
	// Resources are the extended resources to offer kubelet; none turns
	// device-plugin mode off.
	Resources []Resource `yaml:"resources"`
	// KubeletDir is kubelet's device-plugin directory, where its
	// registration socket is and nri-gpu's sockets go.
	KubeletDir string `yaml:"kubeletDir"`
	// CDIDevices is "annotations" or "cri".
	CDIDevices CDIDevices `yaml:"cdiDevices"`
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
}

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

// Parse unmarshals data strictly (an unknown key is an error), fills in
// defaults and validates the result. Empty data gives the defaults.
func Parse(data []byte) (*Config, error) {
	c := &Config{}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(c); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("invalid config: %w", err)
	}
	var extra any
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, errors.New("invalid config: more than one YAML document")
	}
	c.setDefaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
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
	if c.GenerateInterval == 0 {
		c.GenerateInterval = DefaultGenerateInterval
	}
	if c.DriverRoot == "" {
		c.DriverRoot = DefaultDriverRoot
	}
	if c.HealthInterval == 0 {
		c.HealthInterval = DefaultHealthInterval
	}
	d := &c.DevicePlugin
	if d.KubeletDir == "" {
		d.KubeletDir = DefaultKubeletDir
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
	r := &c.DRA
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
	m := &c.MPS
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

// Validate checks every key and joins all problems found into one error.
func (c *Config) Validate() error {
	if errs := c.problems(); len(errs) > 0 {
		return fmt.Errorf("invalid config: %w", errors.Join(errs...))
	}
	return nil
}

// problems checks every key; each error starts with the key's path.
func (c *Config) problems() []error {
	var errs []error
	if len(c.CDISpecDirs) == 0 {
		errs = append(errs, errors.New("cdiSpecDirs: at least one directory is needed"))
	}
	for _, dir := range c.CDISpecDirs {
		if !filepath.IsAbs(dir) {
			errs = append(errs, fmt.Errorf("cdiSpecDirs: %q is not an absolute path", dir))
		}
	}
	if _, _, err := ParseKind(c.DefaultKind); err != nil {
		errs = append(errs, fmt.Errorf("defaultKind: %w", err))
	}
	for _, k := range c.AnnotationKeys {
		if k != KeyNRIGPU && k != KeyNVIDIA {
			errs = append(errs, fmt.Errorf("annotationKeys: %q is neither %q nor %q", k, KeyNRIGPU, KeyNVIDIA))
		}
	}
	switch c.UnsupportedEdits {
	case UnsupportedError, UnsupportedWarn:
	default:
		errs = append(errs, fmt.Errorf("unsupportedEdits: %q is neither %q nor %q",
			c.UnsupportedEdits, UnsupportedError, UnsupportedWarn))
	}
	// Parse makes 0 the default; a Config built otherwise must not poll
	// without pause.
	if c.GenerateInterval <= 0 {
		errs = append(errs, fmt.Errorf("generateInterval: %s is not positive", c.GenerateInterval))
	}
	if c.HealthInterval <= 0 {
		errs = append(errs, fmt.Errorf("healthInterval: %s is not positive", c.HealthInterval))
	}
	if c.HealthRecoverAfter < 0 {
		errs = append(errs, fmt.Errorf("healthRecoverAfter: %s is negative (0 means never)", c.HealthRecoverAfter))
	}
	if !filepath.IsAbs(c.DriverRoot) {
		errs = append(errs, fmt.Errorf("driverRoot: %q is not an absolute path", c.DriverRoot))
	}
	errs = append(errs, c.Policy.validate()...)
	errs = append(errs, c.DRA.validate()...)
	errs = append(errs, c.MPS.validate()...)
	return append(errs, c.DevicePlugin.validate()...)
}

func (m *MPS) validate() []error {
	var errs []error
	switch m.Daemon {
	case MPSExternal, MPSManaged:
	default:
		errs = append(errs, fmt.Errorf("mps.daemon: %q is neither %q nor %q", m.Daemon, MPSExternal, MPSManaged))
	}
	for key, p := range map[string]string{"mps.controlCommand": m.ControlCommand, "mps.root": m.Root} {
		if !filepath.IsAbs(p) {
			errs = append(errs, fmt.Errorf("%s: %q is not an absolute path", key, p))
		}
	}
	if m.HostRoot != "" && !filepath.IsAbs(m.HostRoot) {
		errs = append(errs, fmt.Errorf("mps.hostRoot: %q is not an absolute path", m.HostRoot))
	}
	return errs
}

func (s *Sharing) validate(at string) []error {
	var errs []error
	if len(s.Devices) == 0 {
		errs = append(errs, fmt.Errorf("%s.devices: at least one glob is needed", at))
	}
	for _, g := range s.Devices {
		if _, err := path.Match(g, ""); err != nil {
			errs = append(errs, fmt.Errorf("%s.devices: glob %q: %w", at, g, err))
		}
	}
	if s.Replicas < 2 {
		errs = append(errs, fmt.Errorf("%s.replicas: %d: a shared device needs 2 replicas or more", at, s.Replicas))
	}
	switch s.Strategy {
	case StrategyTimeSlicing:
		if s.ActiveThreadPercentage != 0 || s.PinnedMemoryLimit != "" {
			errs = append(errs, fmt.Errorf("%s: activeThreadPercentage and pinnedMemoryLimit bound MPS clients only; time-slicing has no bounds (set strategy: mps)", at))
		}
	case StrategyMPS:
		if s.ActiveThreadPercentage < 0 || s.ActiveThreadPercentage > 100 {
			errs = append(errs, fmt.Errorf("%s.activeThreadPercentage: %d is not between 1 and 100 (0 means 100/replicas)", at, s.ActiveThreadPercentage))
		}
		if s.PinnedMemoryLimit != "" {
			if _, err := s.PinnedMemory(); err != nil {
				errs = append(errs, fmt.Errorf("%s.pinnedMemoryLimit: %w", at, err))
			}
		}
	default:
		errs = append(errs, fmt.Errorf("%s.strategy: %q is neither %q nor %q", at, s.Strategy, StrategyTimeSlicing, StrategyMPS))
	}
	return errs
}

// PinnedMemory returns PinnedMemoryLimit in bytes, 0 when it is not set.
func (s *Sharing) PinnedMemory() (int64, error) {
	if s.PinnedMemoryLimit == "" {
		return 0, nil
	}
	q, err := resource.ParseQuantity(s.PinnedMemoryLimit)
	if err != nil {
		return 0, fmt.Errorf("%q is not a quantity such as 10Gi: %w", s.PinnedMemoryLimit, err)
	}
	// MPS takes limits in MiB.
	if q.Value() < 1<<20 {
		return 0, fmt.Errorf("%q is less than 1Mi", s.PinnedMemoryLimit)
	}
	return q.Value(), nil
}

func (d *DRA) validate() []error {
	var errs []error
	if msgs := validation.IsDNS1123Subdomain(d.DriverName); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("dra.driverName: %q is not a DNS subdomain: %s", d.DriverName, strings.Join(msgs, "; ")))
	}
	if len(d.Kinds) == 0 {
		errs = append(errs, errors.New("dra.kinds: at least one CDI kind is needed"))
	}
	for _, k := range d.Kinds {
		if _, _, err := ParseKind(k); err != nil {
			errs = append(errs, fmt.Errorf("dra.kinds: %w", err))
		}
	}
	for _, g := range d.Devices {
		if _, err := path.Match(g, ""); err != nil {
			errs = append(errs, fmt.Errorf("dra.devices: glob %q: %w", g, err))
		}
	}
	if d.NodeName != "" {
		if msgs := validation.IsDNS1123Subdomain(d.NodeName); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("dra.nodeName: %q is not a node name: %s", d.NodeName, strings.Join(msgs, "; ")))
		}
	}
	if d.Kubeconfig != "" && !filepath.IsAbs(d.Kubeconfig) {
		errs = append(errs, fmt.Errorf("dra.kubeconfig: %q is not an absolute path", d.Kubeconfig))
	}
	for key, dir := range map[string]string{"dra.pluginDir": d.PluginDir, "dra.registryDir": d.RegistryDir} {
		if !filepath.IsAbs(dir) {
			errs = append(errs, fmt.Errorf("%s: %q is not an absolute path", key, dir))
		}
	}
	return errs
}

func (d *DevicePlugin) validate() []error {
	var errs []error
	if !filepath.IsAbs(d.KubeletDir) {
		errs = append(errs, fmt.Errorf("devicePlugin.kubeletDir: %q is not an absolute path", d.KubeletDir))
	}
	switch d.CDIDevices {
	case CDIAnnotations, CDICRI:
	default:
		errs = append(errs, fmt.Errorf("devicePlugin.cdiDevices: %q is neither %q nor %q", d.CDIDevices, CDIAnnotations, CDICRI))
	}
	seen := map[string]bool{}
	for i, r := range d.Resources {
		at := fmt.Sprintf("devicePlugin.resources[%d]", i)
		// A resource name is an extended resource: a domain, a slash
		// and a name, as a CDI kind is written.
		if _, _, err := ParseKind(r.Name); err != nil {
			errs = append(errs, fmt.Errorf("%s.name: %w", at, err))
		}
		if seen[r.Name] {
			errs = append(errs, fmt.Errorf("%s.name: %q is listed twice", at, r.Name))
		}
		seen[r.Name] = true
		if _, _, err := ParseKind(r.Kind); err != nil {
			errs = append(errs, fmt.Errorf("%s.kind: %w", at, err))
		}
		for _, g := range r.Devices {
			if _, err := path.Match(g, ""); err != nil {
				errs = append(errs, fmt.Errorf("%s.devices: glob %q: %w", at, g, err))
			}
		}
	}
	return errs
}

func (p *Policy) validate() []error {
	var errs []error
	for _, g := range p.Namespaces {
		if _, err := path.Match(g, ""); err != nil {
			errs = append(errs, fmt.Errorf("policy.namespaces: glob %q: %w", g, err))
		}
	}
	for _, g := range p.Devices {
		if _, err := path.Match(g, ""); err != nil {
			errs = append(errs, fmt.Errorf("policy.devices: glob %q: %w", g, err))
		}
	}
	if p.MaxDevicesPerPod < 0 {
		errs = append(errs, fmt.Errorf("policy.maxDevicesPerPod: %d is negative (0 means no limit)", p.MaxDevicesPerPod))
	}
	for _, h := range p.HookPaths {
		if !filepath.IsAbs(h) {
			errs = append(errs, fmt.Errorf("policy.hookPaths: %q is not an absolute path", h))
		}
	}
	for i := range p.Sharing {
		errs = append(errs, p.Sharing[i].validate(fmt.Sprintf("policy.sharing[%d]", i))...)
	}
	return errs
}

// ParseKind splits a CDI kind ("vendor/class") and validates both parts.
func ParseKind(kind string) (vendor, class string, err error) {
	vendor, class = parser.ParseQualifier(kind)
	if vendor == "" || class == "" {
		return "", "", fmt.Errorf("kind %q is not of the form vendor/class", kind)
	}
	if err := parser.ValidateVendorName(vendor); err != nil {
		return "", "", fmt.Errorf("kind %q: %w", kind, err)
	}
	if err := parser.ValidateClassName(class); err != nil {
		return "", "", fmt.Errorf("kind %q: %w", kind, err)
	}
	return vendor, class, nil
}
