// Package specs finds, loads and watches CDI specs, and resolves qualified
// device names against them.
//
// It is a thin layer over CDI's own cache (tags.cncf.io/container-device-interface/pkg/cdi):
// the cache parses and validates spec files, gives later directories
// priority over earlier ones, and refreshes itself when a spec directory
// changes. This package adds errors that say why a device did not resolve.
package specs

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
)

// ErrUnresolvable is wrapped by the error for a device found in no spec.
var ErrUnresolvable = errors.New("unresolvable CDI device")

// Registry holds the CDI specs of a set of directories, kept current by
// watching the directories.
type Registry struct {
	dirs  []string
	cache *cdi.Cache
}

// Open loads the specs in dirs, a later directory winning over an earlier
// one, and watches the directories for changes. Missing directories are
// not an error: they are watched for, and reported by Errors.
func Open(dirs []string) (*Registry, error) {
	if len(dirs) == 0 {
		return nil, errors.New("no CDI spec directories")
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(dirs...), cdi.WithAutoRefresh(true))
	if err != nil {
		return nil, fmt.Errorf("loading CDI specs from %s: %w", strings.Join(dirs, ", "), err)
	}
	return &Registry{dirs: slices.Clone(dirs), cache: cache}, nil
}

// Close stops watching the spec directories.
func (r *Registry) Close() error {
	return r.cache.Configure(cdi.WithAutoRefresh(false))
}

// Dirs returns the spec directories, lowest priority first.
func (r *Registry) Dirs() []string {
	return slices.Clone(r.dirs)
}

// Devices lists the qualified names of all devices that resolve.
func (r *Registry) Devices() []string {
	return r.cache.ListDevices()
}

// Errors returns the problems of the last load, by spec file or directory,
// including the spec files that are not trusted and why.
func (r *Registry) Errors() map[string][]error {
	errs := r.cache.GetErrors()
	for _, vendor := range r.cache.ListVendors() {
		for _, spec := range r.cache.GetVendorSpecs(vendor) {
			if err := checkTrust(spec.GetPath()); err != nil {
				errs[spec.GetPath()] = append(errs[spec.GetPath()], err)
			}
		}
	}
	return errs
}

// Footprints returns the footprints of devices by name, whether or not
// their specs are trusted; a name no spec defines has an empty footprint.
// It serves to rebuild what pods held, not to inject.
func (r *Registry) Footprints(names []string) []Device {
	out := make([]Device, len(names))
	for i, name := range names {
		if d := r.cache.GetDevice(name); d != nil {
			out[i] = Footprint(d)
		} else {
			out[i] = Device{Name: name}
		}
	}
	return out
}

// Candidates returns the individual devices of a kind (vendor/class) that
// come from trusted specs: every device but "all", each with its
// footprint, sorted by name (numbers in numeric order).
func (r *Registry) Candidates(kind string) []Device {
	vendor, class := parser.ParseQualifier(kind)
	var out []Device
	for _, spec := range r.cache.GetVendorSpecs(vendor) {
		if spec.GetClass() != class || checkTrust(spec.GetPath()) != nil {
			continue
		}
		for _, raw := range spec.Devices {
			if raw.Name == "all" {
				continue
			}
			d := spec.GetDevice(raw.Name)
			// A device of the same name in a spec of higher priority wins.
			if d == nil || r.cache.GetDevice(d.GetQualifiedName()) != d {
				continue
			}
			out = append(out, Footprint(d))
		}
	}
	slices.SortFunc(out, func(a, b Device) int { return naturalCompare(a.Name, b.Name) })
	return out
}

// Resolve looks up each qualified name. It returns the devices in the
// order asked, or an error naming every name that did not resolve and the
// spec files that failed to load, which may be why.
func (r *Registry) Resolve(names []string) ([]*cdi.Device, error) {
	devices := make([]*cdi.Device, 0, len(names))
	var errs []error
	for _, name := range names {
		d := r.cache.GetDevice(name)
		if d == nil {
			errs = append(errs, fmt.Errorf("%w %q: no CDI spec in %s defines it%s",
				ErrUnresolvable, name, strings.Join(r.dirs, ", "), r.specErrorHint()))
			continue
		}
		if err := checkTrust(d.GetSpec().GetPath()); err != nil {
			errs = append(errs, fmt.Errorf("device %q: %w", name, err))
			continue
		}
		devices = append(devices, d)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return devices, nil
}

// specErrorHint describes the spec files that failed to load, if any.
func (r *Registry) specErrorHint() string {
	specErrs := r.cache.GetErrors()
	var b strings.Builder
	for _, path := range slices.Sorted(maps.Keys(specErrs)) {
		if slices.Contains(r.dirs, path) {
			continue // a missing directory is not a broken spec
		}
		fmt.Fprintf(&b, "; spec %s: %v", path, errors.Join(specErrs[path]...))
	}
	if b.Len() == 0 {
		return ""
	}
	return " (it may be in a spec that failed to load" + b.String() + ")"
}
