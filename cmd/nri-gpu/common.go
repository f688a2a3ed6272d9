package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/pkg/config"
)

// configFlags are the flags of every command that reads nri-gpu's
// configuration.
type configFlags struct {
	file, specDirs *string
}

// addConfigFlags defines --config and --cdi-spec-dirs on fs.
func addConfigFlags(fs *flag.FlagSet) configFlags {
	return configFlags{
		file: fs.String("config", "", "nri-gpu's YAML configuration file (default: the built-in defaults)"),
		specDirs: fs.String("cdi-spec-dirs", "", "comma-separated CDI spec directories, later ones winning (overrides cdiSpecDirs; default "+
			strings.Join(config.DefaultCDISpecDirs, ",")+")"),
	}
}

// load loads the configuration the flags name.
func (f configFlags) load() (*config.Config, error) { return loadConfig(*f.file, *f.specDirs) }

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

// EnvPrefix starts the environment variable of every flag: --state-file
// is NRI_GPU_STATE_FILE. A flag given on the command line beats its
// variable, which beats the configuration file.
const EnvPrefix = "NRI_GPU_"

// envName is the environment variable of the flag name.
func envName(flag string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// parseFlags sets fs's flags from their environment variables and then
// from args. It returns done and the exit code when the command must end:
// after --help (0), or on a bad flag or variable (2), said on fs's output.
func parseFlags(fs *flag.FlagSet, args []string) (code int, done bool) {
	var bad error
	fs.VisitAll(func(f *flag.Flag) {
		if v, ok := os.LookupEnv(envName(f.Name)); ok && bad == nil {
			if err := f.Value.Set(v); err != nil {
				bad = fmt.Errorf("%s=%q: %w", envName(f.Name), v, err)
			}
		}
	})
	if bad != nil {
		fmt.Fprintf(fs.Output(), "%s: %v\n", fs.Name(), bad)
		return exitUsage, true
	}
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		return exitOK, true
	} else if err != nil {
		return exitUsage, true
	}
	return exitOK, false
}
