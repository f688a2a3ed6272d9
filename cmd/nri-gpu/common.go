package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/pkg/config"
)

// loadConfig loads the configuration file (the defaults when file is
// empty) and applies a --cdi-spec-dirs override.
func loadConfig(file, specDirs string) (*config.Config, error) {
	cfg := config.Default()
	if file != "" {
		var err error
		if cfg, err = config.Load(file); err != nil {
			return nil, err
		}
	}
	if specDirs != "" {
		cfg.CDISpecDirs = strings.Split(specDirs, ",")
		if err := cfg.Validate(); err != nil {
			return nil, fmt.Errorf("--cdi-spec-dirs: %w", err)
		}
	}
	return cfg, nil
}

// quietLogger is a logger for commands that report through their output.
func quietLogger() *logrus.Logger {
	log := logrus.New()
	log.SetOutput(io.Discard)
	return log
}

// keyValues is a repeatable KEY=VALUE flag.
type keyValues map[string]string

func (kv keyValues) String() string { return fmt.Sprint(map[string]string(kv)) }

func (kv keyValues) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("%q is not KEY=VALUE", s)
	}
	kv[k] = v
	return nil
}
