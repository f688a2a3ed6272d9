package plugin

import (
	"context"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/memlimit"
	"github.com/nri-gpu/nri-gpu/pkg/mps"
	"github.com/nri-gpu/nri-gpu/pkg/record"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// overrides are what the command line sets over every configuration,
// the file's, a reload's and the runtime's alike.
type overrides struct {
	// config are the flags that override keys of the configuration
	// (--cdi-spec-dirs, --generate-specs, --hook-path).
	config config.Overrides
	// nvml, when set, replaces the driver's NVML (tests).
	nvml nvml.Interface
	// cgroups, when set, replaces where the containers' cgroups are
	// found (tests).
	cgroups *memlimit.Cgroups
	// parts, when set, replaces the capability major the host's
	// /proc/devices lists (tests).
	parts specs.PartMajors
	// mpsStart starts managed MPS daemons (nri-gpu's mps-shm command).
	mpsStart mps.Launcher
	// record is the state file (--state-file), read only for explain;
	// takeOver, when set, has New wait for another nri-gpu holding it to
	// stop (--take-over).
	record   *record.File
	takeOver context.Context
}
