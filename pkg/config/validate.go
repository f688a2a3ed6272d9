package config

import (
	"errors"
	"fmt"
	"net"
	"path"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"tags.cncf.io/container-device-interface/pkg/parser"
)

// Validate checks every key and joins all problems found into one error,
// each starting with its key's path ("policy.sharing[1].replicas").
func (c *Config) Validate() error {
	if errs := c.problems(); len(errs) > 0 {
		return invalid(errs)
	}
	return nil
}

// invalid is the error of the problems found.
func invalid(errs field.ErrorList) error {
	msgs := make([]error, 0, len(errs))
	for _, e := range errs {
		msgs = append(msgs, errors.New(describe(e)))
	}
	return fmt.Errorf("invalid config: %w", errors.Join(msgs...))
}

// describe is a problem as nri-gpu says it: the key's path, and what is
// wrong with it.
func describe(e *field.Error) string { return e.Field + ": " + e.Detail }

// key returns the path of a v1 key.
func key(v1 string) *field.Path {
	parts := strings.Split(v1, ".")
	return field.NewPath(parts[0], parts[1:]...)
}

// spelt returns the problems with their keys as the file spells them: in
// a file without version (unversioned), the keys of the layout before
// versions.
func spelt(errs field.ErrorList, unversioned bool) field.ErrorList {
	if !unversioned {
		return errs
	}
	out := make(field.ErrorList, 0, len(errs))
	for _, e := range errs {
		o := *e
		o.Field = strings.TrimPrefix(o.Field, "start.")
		for v1, old := range unversionedKeys {
			if rest, ok := strings.CutPrefix(e.Field, v1); ok {
				o.Field = old + rest
			}
		}
		out = append(out, &o)
	}
	return out
}

// problems checks every key.
func (c *Config) problems() field.ErrorList {
	var errs field.ErrorList
	dirs := key("cdiSpecDirs")
	if len(c.CDISpecDirs) == 0 {
		errs = append(errs, field.Required(dirs, "at least one directory is needed"))
	}
	for i, dir := range c.CDISpecDirs {
		errs = append(errs, absolute(dirs.Index(i), dir)...)
	}
	errs = append(errs, kind(key("defaultKind"), c.DefaultKind)...)
	for i, k := range c.AnnotationKeys {
		errs = append(errs, oneOf(key("annotationKeys").Index(i), k, KeyNRIGPU, KeyNVIDIA)...)
	}
	errs = append(errs, oneOf(key("unsupportedEdits"), c.UnsupportedEdits, UnsupportedError, UnsupportedWarn)...)
	// Parse makes 0 the default; a Config built otherwise must not poll
	// without pause.
	errs = append(errs, positive(key("generate.interval"), c.Generate.Interval)...)
	errs = append(errs, positive(key("start.health.interval"), c.Start.Health.Interval)...)
	if after := c.Start.Health.RecoverAfter; after < 0 {
		errs = append(errs, field.Invalid(key("start.health.recoverAfter"), after, fmt.Sprintf("%s is negative (0 means never)", after)))
	}
	errs = append(errs, absolute(key("start.driverRoot"), c.Start.DriverRoot)...)
	errs = append(errs, c.Policy.validate(key("policy"))...)
	errs = append(errs, c.Start.DRA.validate(key("start.dra"))...)
	if k := c.Start.Events.Kubeconfig; k != "" {
		errs = append(errs, absolute(key("start.events.kubeconfig"), k)...)
	}
	errs = append(errs, c.Start.MPS.validate(key("start.mps"))...)
	errs = append(errs, c.hookFreeDoors()...)
	return append(errs, c.Start.DevicePlugin.validate(key("start.devicePlugin"))...)
}

// hookFreeDoors refuses, with hookFree, a door that hands its devices to
// the runtime's own CDI, which runs their hooks.
func (c *Config) hookFreeDoors() field.ErrorList {
	if !c.HookFree {
		return nil
	}
	var errs field.ErrorList
	const why = "hookFree: cri hands the devices to the runtime's own CDI, which runs their hooks; use nri-gpu"
	if len(c.Start.DevicePlugin.Resources) > 0 && c.Start.DevicePlugin.CDIDevices == CDICRI {
		errs = append(errs, field.Invalid(key("start.devicePlugin.cdiDevices"), CDICRI, why))
	}
	if c.Start.DRA.Enabled && c.Start.DRA.CDIDevices == CDICRI {
		errs = append(errs, field.Invalid(key("start.dra.cdiDevices"), CDICRI, why))
	}
	return errs
}

// The rules every key of their sort follows, each in one place.

// absolute requires an absolute path.
func absolute(at *field.Path, p string) field.ErrorList {
	if filepath.IsAbs(p) {
		return nil
	}
	return field.ErrorList{field.Invalid(at, p, fmt.Sprintf("%q is not an absolute path", p))}
}

// globs requires each glob to be one path.Match takes.
func globs(at *field.Path, gs []string) field.ErrorList {
	var errs field.ErrorList
	for i, g := range gs {
		if _, err := path.Match(g, ""); err != nil {
			errs = append(errs, field.Invalid(at.Index(i), g, fmt.Sprintf("glob %q: %v", g, err)))
		}
	}
	return errs
}

// kind requires a CDI kind, vendor/class.
func kind(at *field.Path, k string) field.ErrorList {
	if _, _, err := ParseKind(k); err != nil {
		return field.ErrorList{field.Invalid(at, k, err.Error())}
	}
	return nil
}

// oneOf requires one of the values allowed.
func oneOf[T ~string](at *field.Path, v T, allowed ...T) field.ErrorList {
	if slices.Contains(allowed, v) {
		return nil
	}
	if len(allowed) == 2 {
		return field.ErrorList{field.Invalid(at, v, fmt.Sprintf("%q is neither %q nor %q", v, allowed[0], allowed[1]))}
	}
	quoted := make([]string, len(allowed))
	for i, a := range allowed {
		quoted[i] = strconv.Quote(string(a))
	}
	return field.ErrorList{field.Invalid(at, v, fmt.Sprintf("%q is not one of %s", v, strings.Join(quoted, ", ")))}
}

// positive requires a duration above 0.
func positive(at *field.Path, d time.Duration) field.ErrorList {
	if d > 0 {
		return nil
	}
	return field.ErrorList{field.Invalid(at, d, fmt.Sprintf("%s is not positive", d))}
}

// dnsSubdomain requires a DNS subdomain (what it names is said by what).
func dnsSubdomain(at *field.Path, v, what string) field.ErrorList {
	if msgs := validation.IsDNS1123Subdomain(v); len(msgs) > 0 {
		return field.ErrorList{field.Invalid(at, v, fmt.Sprintf("%q is not %s: %s", v, what, strings.Join(msgs, "; ")))}
	}
	return nil
}

func (m *MPS) validate(at *field.Path) field.ErrorList {
	errs := oneOf(at.Child("daemon"), m.Daemon, MPSExternal, MPSManaged)
	errs = append(errs, absolute(at.Child("controlCommand"), m.ControlCommand)...)
	errs = append(errs, absolute(at.Child("root"), m.Root)...)
	if m.HostRoot != "" {
		errs = append(errs, absolute(at.Child("hostRoot"), m.HostRoot)...)
	}
	return append(errs, positive(at.Child("checkInterval"), m.CheckInterval)...)
}

func (s *Sharing) validate(at *field.Path) field.ErrorList {
	var errs field.ErrorList
	if len(s.Devices) == 0 {
		errs = append(errs, field.Required(at.Child("devices"), "at least one glob is needed"))
	}
	errs = append(errs, globs(at.Child("devices"), s.Devices)...)
	if s.Replicas < 2 {
		errs = append(errs, field.Invalid(at.Child("replicas"), s.Replicas, fmt.Sprintf("%d: a shared device needs 2 replicas or more", s.Replicas)))
	}
	switch s.Strategy {
	case StrategyTimeSlicing:
		if s.ActiveThreadPercentage != 0 || s.PinnedMemoryLimit != "" {
			errs = append(errs, field.Forbidden(at, "activeThreadPercentage and pinnedMemoryLimit bound MPS clients only (time-slicing's holders are bounded by the driver's memory limits; set strategy: mps)"))
		}
	case StrategyMPS:
		if s.ActiveThreadPercentage < 0 || s.ActiveThreadPercentage > 100 {
			errs = append(errs, field.Invalid(at.Child("activeThreadPercentage"), s.ActiveThreadPercentage, fmt.Sprintf("%d is not between 1 and 100 (0 means 100/replicas)", s.ActiveThreadPercentage)))
		}
		if _, err := s.PinnedMemory(); err != nil {
			errs = append(errs, field.Invalid(at.Child("pinnedMemoryLimit"), s.PinnedMemoryLimit, err.Error()))
		}
	default:
		errs = append(errs, oneOf(at.Child("strategy"), s.Strategy, StrategyTimeSlicing, StrategyMPS)...)
	}
	if s.MemoryQuota && s.Strategy != StrategyTimeSlicing {
		errs = append(errs, field.Forbidden(at.Child("memoryQuota"), "MPS bounds each client's memory; memoryQuota is for timeSlicing, which cannot"))
	}
	_, amountErrs := s.amounts(at)
	return append(errs, amountErrs...)
}

// Amounts are a shared GPU's memory settings in bytes; 0 is unset (by
// default).
type Amounts struct {
	Memory, Default, Minimum, Maximum, Step int64
}

// Amounts returns Memory and MemoryRequest in bytes (Step 1Mi unless
// set) of a validated entry.
func (s *Sharing) Amounts() Amounts {
	a, _ := s.amounts(nil)
	return a
}

// amounts returns Memory and MemoryRequest in bytes (Step 1Mi unless
// set), or what is wrong with them (under at): each a quantity of 1Mi
// or more, a multiple of Step, Minimum <= Default <= Maximum <= Memory
// where set, and Default unset when pinnedMemoryLimit is (it is the
// default then).
func (s *Sharing) amounts(at *field.Path) (Amounts, field.ErrorList) {
	req := at.Child("memoryRequest")
	var (
		out  = Amounts{Step: 1 << 20}
		errs field.ErrorList
	)
	parse := func(p *field.Path, v string, to *int64) {
		if v == "" {
			return
		}
		q, err := resource.ParseQuantity(v)
		switch {
		case err != nil:
			errs = append(errs, field.Invalid(p, v, fmt.Sprintf("%q is not a quantity such as 10Gi: %v", v, err)))
		case q.Value() < 1<<20:
			errs = append(errs, field.Invalid(p, v, fmt.Sprintf("%q is less than 1Mi", v)))
		default:
			*to = q.Value()
		}
	}
	parse(req.Child("step"), s.MemoryRequest.Step, &out.Step)
	parse(at.Child("memory"), s.Memory, &out.Memory)
	parse(req.Child("default"), s.MemoryRequest.Default, &out.Default)
	parse(req.Child("minimum"), s.MemoryRequest.Minimum, &out.Minimum)
	parse(req.Child("maximum"), s.MemoryRequest.Maximum, &out.Maximum)
	if len(errs) > 0 {
		return Amounts{}, errs
	}
	named := []struct {
		path  *field.Path
		value string
		bytes int64
	}{
		{req.Child("minimum"), s.MemoryRequest.Minimum, out.Minimum},
		{req.Child("default"), s.MemoryRequest.Default, out.Default},
		{req.Child("maximum"), s.MemoryRequest.Maximum, out.Maximum},
		{at.Child("memory"), s.Memory, out.Memory},
	}
	for _, n := range named {
		if n.bytes%out.Step != 0 {
			errs = append(errs, field.Invalid(n.path, n.value, fmt.Sprintf("%q is not a multiple of memoryRequest.step (%s)", n.value, quantity(out.Step))))
		}
	}
	// In order, of those set.
	last := -1
	for i, n := range named {
		if n.bytes == 0 {
			continue
		}
		if last >= 0 && named[last].bytes > n.bytes {
			errs = append(errs, field.Invalid(n.path, n.value, fmt.Sprintf("%q is less than %s (%s)", n.value, named[last].path, named[last].value)))
		}
		last = i
	}
	if s.MemoryRequest.Default != "" && s.PinnedMemoryLimit != "" {
		errs = append(errs, field.Forbidden(req.Child("default"), "pinnedMemoryLimit is what a user consumes by default; set one of them"))
	}
	if len(errs) > 0 {
		return Amounts{}, errs
	}
	return out, nil
}

// quantity writes bytes as a binary quantity ("1Mi").
func quantity(bytes int64) string { return resource.NewQuantity(bytes, resource.BinarySI).String() }

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

// Validate checks a start.dra block on its own, as Validate checks it
// within a configuration: for a DRA driver handed the block nri-gpu
// validated.
func (d *DRA) Validate() error {
	if errs := d.validate(key("start.dra")); len(errs) > 0 {
		return invalid(errs)
	}
	return nil
}

func (d *DRA) validate(at *field.Path) field.ErrorList {
	errs := dnsSubdomain(at.Child("driverName"), d.DriverName, "a DNS subdomain")
	if len(d.Kinds) == 0 {
		errs = append(errs, field.Required(at.Child("kinds"), "at least one CDI kind is needed"))
	}
	for i, k := range d.Kinds {
		errs = append(errs, kind(at.Child("kinds").Index(i), k)...)
	}
	errs = append(errs, globs(at.Child("devices"), d.Devices)...)
	if d.NodeName != "" {
		errs = append(errs, dnsSubdomain(at.Child("nodeName"), d.NodeName, "a node name")...)
	}
	if d.Kubeconfig != "" {
		errs = append(errs, absolute(at.Child("kubeconfig"), d.Kubeconfig)...)
	}
	errs = append(errs, absolute(at.Child("pluginDir"), d.PluginDir)...)
	errs = append(errs, oneOf(at.Child("unhealthyTaint"), d.UnhealthyTaint, TaintNoSchedule, TaintNoExecute)...)
	errs = append(errs, oneOf(at.Child("cdiDevices"), d.CDIDevices, CDICRI, CDINRIGPU)...)
	errs = append(errs, positive(at.Child("sweepInterval"), d.SweepInterval)...)
	if d.MetricsAddress != "" {
		if _, port, err := net.SplitHostPort(d.MetricsAddress); err != nil || port == "" {
			errs = append(errs, field.Invalid(at.Child("metricsAddress"), d.MetricsAddress, fmt.Sprintf("%q is not HOST:PORT (the host may be empty: every address)", d.MetricsAddress)))
		}
	}
	return append(errs, absolute(at.Child("registryDir"), d.RegistryDir)...)
}

func (d *DevicePlugin) validate(at *field.Path) field.ErrorList {
	errs := absolute(at.Child("kubeletDir"), d.KubeletDir)
	errs = append(errs, absolute(at.Child("podResources"), d.PodResources)...)
	errs = append(errs, oneOf(at.Child("cdiDevices"), d.CDIDevices, CDIAnnotations, CDICRI, CDINRIGPU)...)
	if d.Relay != "" {
		errs = append(errs, absolute(at.Child("relay"), d.Relay)...)
	}
	seen := map[string]bool{}
	for i, r := range d.Resources {
		res := at.Child("resources").Index(i)
		// A resource name is an extended resource: a domain, a slash
		// and a name, as a CDI kind is written.
		errs = append(errs, kind(res.Child("name"), r.Name)...)
		if seen[r.Name] {
			errs = append(errs, field.Invalid(res.Child("name"), r.Name, fmt.Sprintf("%q is listed twice", r.Name)))
		}
		seen[r.Name] = true
		errs = append(errs, kind(res.Child("kind"), r.Kind)...)
		errs = append(errs, globs(res.Child("devices"), r.Devices)...)
	}
	return errs
}

func (p *Policy) validate(at *field.Path) field.ErrorList {
	errs := globs(at.Child("namespaces"), p.Namespaces)
	errs = append(errs, globs(at.Child("devices"), p.Devices)...)
	if p.MaxDevicesPerPod < 0 {
		errs = append(errs, field.Invalid(at.Child("maxDevicesPerPod"), p.MaxDevicesPerPod, fmt.Sprintf("%d is negative (0 means no limit)", p.MaxDevicesPerPod)))
	}
	for i, h := range p.HookPaths {
		errs = append(errs, absolute(at.Child("hookPaths").Index(i), h)...)
	}
	for i := range p.Sharing {
		errs = append(errs, p.Sharing[i].validate(at.Child("sharing").Index(i))...)
	}
	return append(errs, oneOf(at.Child("memoryLimits"), p.MemoryLimits, MemoryLimitsEnforced, MemoryLimitsAgreement)...)
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

// Changed returns the keys of the start block whose values differ in
// next ("start.dra"): what a reload or the runtime's configuration
// would change that only a start reads. The device plugin and DRA
// blocks of a door off before and after read nothing (their defaults
// follow defaultKind, which reloads).
func (s Start) Changed(next Start) []string {
	if len(s.DevicePlugin.Resources) == 0 && len(next.DevicePlugin.Resources) == 0 {
		s.DevicePlugin, next.DevicePlugin = DevicePlugin{}, DevicePlugin{}
	}
	if !s.DRA.Enabled && !next.DRA.Enabled {
		s.DRA, next.DRA = DRA{}, DRA{}
	}
	var keys []string
	was, is := reflect.ValueOf(s), reflect.ValueOf(next)
	for i := range was.NumField() {
		if !reflect.DeepEqual(was.Field(i).Interface(), is.Field(i).Interface()) {
			name, _, _ := strings.Cut(was.Type().Field(i).Tag.Get("yaml"), ",")
			keys = append(keys, key("start."+name).String())
		}
	}
	return keys
}

// Overrides are what the command line sets over every configuration,
// the file's, a reload's and the runtime's alike.
type Overrides struct {
	// SpecDirs, when set, replaces cdiSpecDirs (--cdi-spec-dirs).
	SpecDirs []string
	// Generate turns generate.enabled on (--generate-specs).
	Generate bool
	// HookPath is the CDI hook the specs nri-gpu generates name
	// (--hook-path; nri-gpu itself by default): as trusted as nri-gpu,
	// it is added to policy.hookPaths.
	HookPath string
}

// Apply returns c with the overrides, validated again; c itself when
// they change nothing.
func (o Overrides) Apply(c *Config) (*Config, error) {
	hook := o.HookPath != "" && !slices.Contains(c.Policy.HookPaths, o.HookPath)
	if len(o.SpecDirs) == 0 && (!o.Generate || c.Generate.Enabled) && !hook {
		return c, nil
	}
	out := *c
	if len(o.SpecDirs) > 0 {
		out.CDISpecDirs = slices.Clone(o.SpecDirs)
		if err := out.Validate(); err != nil {
			return nil, fmt.Errorf("--cdi-spec-dirs: %w", err)
		}
	}
	out.Generate.Enabled = out.Generate.Enabled || o.Generate
	if hook {
		out.Policy.HookPaths = append(slices.Clone(out.Policy.HookPaths), o.HookPath)
	}
	return &out, nil
}
