package nvidia

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// SetComputeMode puts the GPU of uuid in compute mode mode (as
// nvidia-smi -c does), unless it is in it already, and returns the mode
// it was in. It initialises and shuts down NVML itself.
func SetComputeMode(lib nvml.Interface, uuid string, mode nvml.ComputeMode) (nvml.ComputeMode, error) {
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return 0, fmt.Errorf("%w: %w", ErrNVML, ret)
	}
	defer lib.Shutdown()
	d, ret := lib.DeviceGetHandleByUUID(uuid)
	if ret != nvml.SUCCESS {
		return 0, fmt.Errorf("NVML: GPU %s: %w", uuid, ret)
	}
	was, ret := d.GetComputeMode()
	if ret != nvml.SUCCESS {
		return 0, fmt.Errorf("NVML: GPU %s: compute mode: %w", uuid, ret)
	}
	if was == mode {
		return was, nil
	}
	if ret := d.SetComputeMode(mode); ret != nvml.SUCCESS {
		return was, fmt.Errorf("NVML: GPU %s: setting compute mode %s: %w", uuid, ModeName(mode), ret)
	}
	return was, nil
}

// ModeName is a compute mode as nvidia-smi writes it.
func ModeName(m nvml.ComputeMode) string {
	switch m {
	case nvml.COMPUTEMODE_DEFAULT:
		return "Default"
	case nvml.COMPUTEMODE_EXCLUSIVE_THREAD:
		return "Exclusive_Thread"
	case nvml.COMPUTEMODE_PROHIBITED:
		return "Prohibited"
	case nvml.COMPUTEMODE_EXCLUSIVE_PROCESS:
		return "Exclusive_Process"
	}
	return fmt.Sprintf("mode %d", m)
}
