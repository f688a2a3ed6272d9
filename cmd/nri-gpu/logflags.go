package main

import (
	"flag"

	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/internal/logflags"
)

// logFlags are the flags of the commands that run until stopped and log
// as they go (the plugin, the relay).
type logFlags struct {
	level, format *string
}

// addLogFlags defines --log-level and --log-format on fs.
func addLogFlags(fs *flag.FlagSet) logFlags {
	return logFlags{
		level:  fs.String("log-level", "info", "log level: debug, info, warn or error"),
		format: fs.String("log-format", "text", "log format: text or json"),
	}
}

// apply sets log's level and format as the flags say.
func (f logFlags) apply(log *logrus.Logger) error { return logflags.Apply(log, *f.level, *f.format) }
