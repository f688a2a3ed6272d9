package policy

import (
	"errors"
	"fmt"
	"path"
	"strings"

	"tags.cncf.io/container-device-interface/pkg/parser"

	"github.com/nri-gpu/nri-gpu/pkg/config"
)

// ErrDenied is wrapped by every policy denial.
var ErrDenied = errors.New("denied by policy")

// Policy decides which requests are allowed. This version enforces the
// policy.devices and policy.allowAll keys.
type Policy struct {
	devices  []string
	allowAll bool
}

// New returns the policy of a validated configuration block.
func New(p config.Policy) *Policy {
	return &Policy{
		devices:  append([]string(nil), p.Devices...),
		allowAll: p.AllowAll,
	}
}

// Check returns nil when every request is allowed, and otherwise an error
// that wraps ErrDenied for each denied request, naming the rule, the
// request and the config key that would allow it.
func (p *Policy) Check(reqs []Request) error {
	var errs []error
	for _, r := range reqs {
		if err := p.check(r); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (p *Policy) check(r Request) error {
	if !p.matchesDevices(r.Device) {
		return fmt.Errorf("%s: %w: device %q matches none of policy.devices [%s]; add a glob that matches it to policy.devices",
			r, ErrDenied, r.Device, strings.Join(p.devices, ", "))
	}
	if _, _, name := parser.ParseDevice(r.Device); name == AllDevice && r.Source == SourcePod && !p.allowAll {
		return fmt.Errorf("%s: %w: device %q gives every device of its kind; set policy.allowAll: true to allow it",
			r, ErrDenied, r.Device)
	}
	return nil
}

func (p *Policy) matchesDevices(device string) bool {
	for _, g := range p.devices {
		// Globs were validated with the configuration.
		if ok, _ := path.Match(g, device); ok {
			return true
		}
	}
	return false
}
