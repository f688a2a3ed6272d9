package config

import "time"

// unversioned is a file without version: the layout nri-gpu read before
// versions, with the settings read at start beside the others and the
// generation and health keys flat. Parse converts it, so that existing
// files keep working; its errors name the keys as the file spells them.
type unversioned struct {
	CDISpecDirs         []string         `yaml:"cdiSpecDirs"`
	DefaultKind         string           `yaml:"defaultKind"`
	HonorCDIAnnotations *bool            `yaml:"honorCDIAnnotations"`
	AnnotationKeys      []string         `yaml:"annotationKeys"`
	UnsupportedEdits    UnsupportedEdits `yaml:"unsupportedEdits"`
	HookFree            bool             `yaml:"hookFree"`
	GenerateSpecs       bool             `yaml:"generateSpecs"`
	GenerateInterval    time.Duration    `yaml:"generateInterval"`
	DriverRoot          string           `yaml:"driverRoot"`
	HealthInterval      time.Duration    `yaml:"healthInterval"`
	HealthRecoverAfter  time.Duration    `yaml:"healthRecoverAfter"`
	Policy              Policy           `yaml:"policy"`
	DevicePlugin        DevicePlugin     `yaml:"devicePlugin"`
	DRA                 DRA              `yaml:"dra"`
	MPS                 MPS              `yaml:"mps"`
	Events              Events           `yaml:"events"`
}

// unversionedKeys are the keys of v1 spelt otherwise without version
// (those of start spelt without "start." are not listed).
var unversionedKeys = map[string]string{
	"generate.enabled":          "generateSpecs",
	"generate.interval":         "generateInterval",
	"start.health.interval":     "healthInterval",
	"start.health.recoverAfter": "healthRecoverAfter",
}

// convert returns the configuration the file says, in v1. The managed
// MPS daemons were looked at every healthInterval then, and still are
// unless mps.checkInterval says otherwise.
func (u *unversioned) convert() *Config {
	c := &Config{
		CDISpecDirs:         u.CDISpecDirs,
		DefaultKind:         u.DefaultKind,
		HonorCDIAnnotations: u.HonorCDIAnnotations,
		AnnotationKeys:      u.AnnotationKeys,
		UnsupportedEdits:    u.UnsupportedEdits,
		HookFree:            u.HookFree,
		Generate:            Generate{Enabled: u.GenerateSpecs, Interval: u.GenerateInterval},
		Policy:              u.Policy,
		Start: Start{
			DriverRoot:   u.DriverRoot,
			Health:       Health{Interval: u.HealthInterval, RecoverAfter: u.HealthRecoverAfter},
			DevicePlugin: u.DevicePlugin,
			DRA:          u.DRA,
			MPS:          u.MPS,
			Events:       u.Events,
		},
	}
	if c.Start.MPS.CheckInterval == 0 {
		c.Start.MPS.CheckInterval = u.HealthInterval
	}
	return c
}
