package dra

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/sirupsen/logrus"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/resourceclaim"

	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
)

// ErrGpuConfig is wrapped by the error for a claim's opaque configuration
// nri-gpu does not honour: another kind or version than NVIDIA's
// GpuConfig, a field it does not know, a value out of range.
var ErrGpuConfig = errors.New("opaque device configuration not honoured")

// The opaque parameters NVIDIA's DRA driver reads (its
// api/nvidia.com/resource/v1beta1 GpuConfig), as nri-gpu honours them.
const (
	gpuConfigVersion = "resource.nvidia.com/v1beta1"
	gpuConfigKind    = "GpuConfig"
)

type gpuConfig struct {
	APIVersion string      `json:"apiVersion"`
	Kind       string      `json:"kind"`
	Sharing    *gpuSharing `json:"sharing,omitempty"`
}

type gpuSharing struct {
	Strategy          string             `json:"strategy"`
	TimeSlicingConfig *timeSlicingConfig `json:"timeSlicingConfig,omitempty"`
	MpsConfig         *mpsConfig         `json:"mpsConfig,omitempty"`
}

type timeSlicingConfig struct {
	Interval *string `json:"interval,omitempty"`
}

type mpsConfig struct {
	DefaultActiveThreadPercentage     *int                         `json:"defaultActiveThreadPercentage,omitempty"`
	DefaultPinnedDeviceMemoryLimit    *resource.Quantity           `json:"defaultPinnedDeviceMemoryLimit,omitempty"`
	DefaultPerDevicePinnedMemoryLimit map[string]resource.Quantity `json:"defaultPerDevicePinnedMemoryLimit,omitempty"`
	MultiUser                         *bool                        `json:"multiUser,omitempty"`
}

// parsedConfig is what a GpuConfig asks of a device's sharing: keys of
// perDevice are the devices' index or UUID.
type parsedConfig struct {
	policy.GpuConfig
	perDevice map[string]int64
	// unapplied are the fields accepted and not applied, each with why.
	unapplied []string
}

// parseGpuConfig reads one opaque configuration's parameters strictly:
// NVIDIA's GpuConfig of resource.nvidia.com/v1beta1, every field known,
// each value in range.
func parseGpuConfig(raw []byte) (parsedConfig, error) {
	var c gpuConfig
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return parsedConfig{}, fmt.Errorf("%w: %w", ErrGpuConfig, err)
	}
	if c.APIVersion != gpuConfigVersion || c.Kind != gpuConfigKind {
		return parsedConfig{}, fmt.Errorf("%w: %s of %s; nri-gpu honours %s of %s", ErrGpuConfig, orNone(c.Kind), orNone(c.APIVersion), gpuConfigKind, gpuConfigVersion)
	}
	var out parsedConfig
	s := c.Sharing
	if s == nil {
		return out, nil
	}
	switch s.Strategy {
	case "TimeSlicing":
		out.Strategy = config.StrategyTimeSlicing
		if s.MpsConfig != nil {
			return parsedConfig{}, fmt.Errorf("%w: mpsConfig with strategy TimeSlicing", ErrGpuConfig)
		}
		// The interval is the GPU's, not a claim's: nri-gpu leaves
		// it as the operator set it (nvidia-smi compute-policy).
		if t := s.TimeSlicingConfig; t != nil && t.Interval != nil {
			if !slices.Contains([]string{"Default", "Short", "Medium", "Long"}, *t.Interval) {
				return parsedConfig{}, fmt.Errorf("%w: timeSlicingConfig.interval %q is none of Default, Short, Medium, Long", ErrGpuConfig, *t.Interval)
			}
			out.unapplied = append(out.unapplied, fmt.Sprintf("timeSlicingConfig.interval %q is not applied: the GPU's time slice is the operator's (nvidia-smi compute-policy --set-timeslice), not a claim's", *t.Interval))
		}
	case "MPS":
		out.Strategy = config.StrategyMPS
		if s.TimeSlicingConfig != nil {
			return parsedConfig{}, fmt.Errorf("%w: timeSlicingConfig with strategy MPS", ErrGpuConfig)
		}
		if err := out.mps(s.MpsConfig); err != nil {
			return parsedConfig{}, err
		}
	default:
		return parsedConfig{}, fmt.Errorf("%w: sharing.strategy %q is neither TimeSlicing nor MPS", ErrGpuConfig, s.Strategy)
	}
	return out, nil
}

func (a *parsedConfig) mps(m *mpsConfig) error {
	if m == nil {
		return nil
	}
	if m.MultiUser != nil && *m.MultiUser {
		return fmt.Errorf("%w: mpsConfig.multiUser: nri-gpu runs one MPS daemon per GPU for all its users, as the operator starts it", ErrGpuConfig)
	}
	if p := m.DefaultActiveThreadPercentage; p != nil {
		if *p < 1 || *p > 100 {
			return fmt.Errorf("%w: mpsConfig.defaultActiveThreadPercentage %d is not between 1 and 100", ErrGpuConfig, *p)
		}
		a.ActiveThreadPercentage = *p
	}
	limit := func(at string, q resource.Quantity) (int64, error) {
		if q.Value() < 1<<20 {
			return 0, fmt.Errorf("%w: mpsConfig.%s %s is less than 1Mi", ErrGpuConfig, at, q.String())
		}
		return q.Value(), nil
	}
	if q := m.DefaultPinnedDeviceMemoryLimit; q != nil {
		v, err := limit("defaultPinnedDeviceMemoryLimit", *q)
		if err != nil {
			return err
		}
		a.PinnedMemory = v
	}
	for key, q := range m.DefaultPerDevicePinnedMemoryLimit {
		v, err := limit("defaultPerDevicePinnedMemoryLimit["+key+"]", q)
		if err != nil {
			return err
		}
		if a.perDevice == nil {
			a.perDevice = map[string]int64{}
		}
		a.perDevice[key] = v
	}
	return nil
}

func orNone(s string) string {
	if s == "" {
		return `""`
	}
	return s
}

// askedOf returns what the claim's configurations of this driver ask of
// the device allocated for request (its ResourceSlice entry's index and
// UUID name it in a per-device limit): the class's first, then the
// claim's, a later one of the request overriding an earlier, as NVIDIA's
// driver reads them.
func (d *Driver) askedOf(c *resourceapi.ResourceClaim, request string, index int, uuid string) (policy.GpuConfig, error) {
	var (
		out       policy.GpuConfig
		unapplied []string // the effective configuration's
	)
	for _, cfg := range configsOf(c) {
		o := cfg.Opaque
		if o == nil || o.Driver != d.cfg.DriverName {
			continue
		}
		if len(cfg.Requests) > 0 && !slices.Contains(cfg.Requests, request) && !slices.Contains(cfg.Requests, resourceclaim.BaseRequestRef(request)) {
			continue
		}
		a, err := parseGpuConfig(o.Parameters.Raw)
		if err != nil {
			which := "config of every request" // no requests: all of them
			if len(cfg.Requests) > 0 {
				which = "config of requests [" + strings.Join(cfg.Requests, ", ") + "]"
			}
			return policy.GpuConfig{}, fmt.Errorf("%s: %w", which, err)
		}
		for key, v := range a.perDevice {
			if key == uuid || (index >= 0 && key == fmt.Sprint(index)) {
				a.PinnedMemory = v
			}
		}
		out, unapplied = a.GpuConfig, a.unapplied
	}
	for _, why := range unapplied {
		d.log.WithFields(logrus.Fields{"namespace": c.Namespace, "claim": c.Name, "request": request}).Warn(why)
	}
	return out, nil
}

// configsOf returns the allocation's configurations, the class's before
// the claim's.
func configsOf(c *resourceapi.ResourceClaim) []resourceapi.DeviceAllocationConfiguration {
	cfgs := slices.Clone(c.Status.Allocation.Devices.Config)
	slices.SortStableFunc(cfgs, func(a, b resourceapi.DeviceAllocationConfiguration) int {
		rank := func(s resourceapi.AllocationConfigSource) int {
			if s == resourceapi.AllocationConfigSourceClass {
				return 0
			}
			return 1
		}
		return rank(a.Source) - rank(b.Source)
	})
	return cfgs
}
