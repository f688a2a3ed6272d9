// Package logflags sets a logger up from the --log-level and --log-format
// flags that nri-gpu and its DRA driver both take.
package logflags

import (
	"fmt"

	"github.com/sirupsen/logrus"
)

// Apply sets log's level (debug, info, warn or error) and format (text
// or json).
func Apply(log *logrus.Logger, level, format string) error {
	l, err := logrus.ParseLevel(level)
	if err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log.SetLevel(l)
	switch format {
	case "text":
	case "json":
		log.SetFormatter(&logrus.JSONFormatter{})
	default:
		return fmt.Errorf("--log-format: %q is neither text nor json", format)
	}
	return nil
}
