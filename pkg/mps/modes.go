package mps

import (
	"errors"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// The compute modes a Manager sets and restores, as nvidia-smi writes
// them.
const (
	ModeDefault   = "Default"
	ModeExclusive = "Exclusive_Process"
)

// Modes reads and sets a GPU's compute mode (nri-gpu's: through NVML,
// NVMLModes).
type Modes interface {
	// Mode returns the compute mode of the GPU of uuid.
	Mode(uuid string) (string, error)
	// Set puts the GPU of uuid in compute mode mode.
	Set(uuid, mode string) error
}

// ErrNoModes is wrapped by the error of a Modes that cannot read or set
// any GPU's mode here (NVML cannot be loaded): a daemon is kept all the
// same, since where NVML cannot be loaded neither can the daemon's own
// driver libraries on a real node.
var ErrNoModes = errors.New("compute modes cannot be set here")

// NVMLModes is Modes through NVML: lib returns the library to ask
// (initialised and shut down at each call).
type NVMLModes struct{ Lib func() nvml.Interface }

var _ Modes = NVMLModes{}

// Mode returns the GPU's compute mode; an NVML that cannot be loaded is
// ErrNoModes.
func (m NVMLModes) Mode(uuid string) (string, error) {
	var mode nvml.ComputeMode
	err := m.with(uuid, func(d nvml.Device) error {
		var ret nvml.Return
		if mode, ret = d.GetComputeMode(); ret != nvml.SUCCESS {
			return fmt.Errorf("NVML: GPU %s: compute mode: %w", uuid, ret)
		}
		return nil
	})
	return ModeName(mode), err
}

// Set puts the GPU in the compute mode (as nvidia-smi -c does), unless it
// is in it already.
func (m NVMLModes) Set(uuid, mode string) error {
	want, ok := modeOf[mode]
	if !ok {
		return fmt.Errorf("GPU %s: no compute mode %q", uuid, mode)
	}
	return m.with(uuid, func(d nvml.Device) error {
		was, ret := d.GetComputeMode()
		if ret != nvml.SUCCESS {
			return fmt.Errorf("NVML: GPU %s: compute mode: %w", uuid, ret)
		}
		if was == want {
			return nil
		}
		if ret := d.SetComputeMode(want); ret != nvml.SUCCESS {
			return fmt.Errorf("NVML: GPU %s: setting compute mode %s: %w", uuid, mode, ret)
		}
		return nil
	})
}

// with opens NVML, calls do with the GPU of uuid and closes it.
func (m NVMLModes) with(uuid string, do func(nvml.Device) error) error {
	lib := m.Lib()
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return fmt.Errorf("%w: NVML: %w", ErrNoModes, ret)
	}
	defer lib.Shutdown()
	d, ret := lib.DeviceGetHandleByUUID(uuid)
	if ret != nvml.SUCCESS {
		return fmt.Errorf("NVML: GPU %s: %w", uuid, ret)
	}
	return do(d)
}

// modeOf is each compute mode by its name.
var modeOf = map[string]nvml.ComputeMode{
	ModeDefault:        nvml.COMPUTEMODE_DEFAULT,
	"Exclusive_Thread": nvml.COMPUTEMODE_EXCLUSIVE_THREAD,
	"Prohibited":       nvml.COMPUTEMODE_PROHIBITED,
	ModeExclusive:      nvml.COMPUTEMODE_EXCLUSIVE_PROCESS,
}

// ModeName is a compute mode as nvidia-smi writes it.
func ModeName(m nvml.ComputeMode) string {
	for name, mode := range modeOf {
		if mode == m {
			return name
		}
	}
	return fmt.Sprintf("mode %d", m)
}
