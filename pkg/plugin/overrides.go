package plugin

import (
	"context"
	"fmt"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/mps"
	"github.com/nri-gpu/nri-gpu/pkg/record"
)

// overrides are what the command line sets over every configuration,
// the file's, a reload's and the runtime's alike.
type overrides struct {
	// specDirs, when set, replaces cdiSpecDirs (--cdi-spec-dirs).
	specDirs []string
	// generate turns generate.enabled on (--generate-specs).
	generate bool
	// nvml, when set, replaces the driver's NVML (tests).
	nvml nvml.Interface
	// mpsStart starts managed MPS daemons (nri-gpu's mps-shm command).
	mpsStart mps.Start
	// record is the state file (--state-file), read only for explain;
	// takeOver, when set, has New wait for another nri-gpu holding it to
	// stop (--take-over).
	record   *record.File
	takeOver context.Context
	// hookPath is the CDI hook that the specs the plugin generates name
	// (nri-gpu itself, by default), which the policy allows
	// (--hook-path).
	hookPath string
}

// apply returns cfg with the overrides, validated again.
func (o overrides) apply(cfg *config.Config) (*config.Config, error) {
	if len(o.specDirs) == 0 && (!o.generate || cfg.Generate.Enabled) {
		return cfg, nil
	}
	c := *cfg
	if len(o.specDirs) > 0 {
		c.CDISpecDirs = slices.Clone(o.specDirs)
		if err := c.Validate(); err != nil {
			return nil, fmt.Errorf("--cdi-spec-dirs: %w", err)
		}
	}
	c.Generate.Enabled = c.Generate.Enabled || o.generate
	return &c, nil
}
