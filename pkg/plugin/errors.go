package plugin

import (
	"errors"
	"fmt"

	"github.com/nri-gpu/nri-gpu/pkg/adjust"
	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
	"github.com/nri-gpu/nri-gpu/pkg/mps"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/record"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// ErrStartOnly is wrapped by Reload's error for a configuration that
// changes what only a start reads.
var ErrStartOnly = errors.New("cannot change while nri-gpu runs")

// ErrDriverChanged is wrapped by Serve's error when the NVIDIA driver's
// kernel module was replaced under the NVML this process has loaded
// (NVML_ERROR_LIB_RM_VERSION_MISMATCH, after it had answered): a process
// cannot load another NVML in place of the one it has, so nri-gpu is to
// be started again (cmd/nri-gpu executes itself anew).
var ErrDriverChanged = errors.New("the NVIDIA driver changed under the NVML nri-gpu has loaded")

// ErrNotReady is wrapped by Ready's error.
var ErrNotReady = errors.New("not ready")

// maxErrorLen bounds the error returned to the runtime, which shows it to
// users (crictl, kubelet events) and must fit in one ttrpc message.
const maxErrorLen = 4096

// boundedError is an error whose message was cut to maxErrorLen.
type boundedError struct {
	msg string
	err error
}

func (e *boundedError) Error() string { return e.msg }

// Unwrap returns the whole error, for errors.Is and errors.As.
func (e *boundedError) Unwrap() error { return e.err }

// bounded returns err with its message cut to maxErrorLen.
func bounded(err error) error {
	msg := err.Error()
	if len(msg) <= maxErrorLen {
		return err
	}
	cut := fmt.Sprintf(" ... (%d more bytes; the plugin's log has all of it)", len(msg)-(maxErrorLen-64))
	return &boundedError{msg: msg[:maxErrorLen-64] + cut, err: err}
}

// rule names what refused a container, for the denials metric: a policy
// rule, or the kind of problem with the request.
func rule(err error) string {
	var d *policy.Denial
	switch {
	case err == nil:
		return ""
	case errors.As(err, &d):
		return d.Rule
	case errors.Is(err, policy.ErrInvalidRequest):
		return "invalidRequest"
	case errors.Is(err, specs.ErrUntrusted):
		return "untrustedSpec"
	case errors.Is(err, specs.ErrUnresolvable):
		return "unresolvable"
	case errors.Is(err, adjust.ErrUnsupportedEdit):
		return "unsupportedEdits"
	case errors.Is(err, adjust.ErrInjectedTwice):
		return "injectedTwice"
	case errors.Is(err, record.ErrNotRecorded):
		return "notRecorded"
	case errors.Is(err, mps.ErrNotServed):
		return "mps"
	case errors.Is(err, link.ErrClaimsUnknown):
		return "claimsUnknown"
	}
	return "other"
}

// ErrConfig is wrapped by Serve's error when the runtime handed the plugin
// a configuration it rejected.
var ErrConfig = errors.New("invalid configuration")
