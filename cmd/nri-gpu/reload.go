package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/pkg/config"
)

// reloader is what a reloaded configuration is handed to (the plugin).
type reloader interface {
	Reload(*config.Config) error
}

// configReloadInterval is how often the configuration file is looked at
// for a change.
const configReloadInterval = 2 * time.Second

// watchConfig reloads the configuration file on SIGHUP (hup) and when its
// content changes from what is in force (inForce, its digest; looked at
// every interval, and taken once it has stayed the same for an interval;
// a ConfigMap's file changes by a swapped symlink, which reading follows),
// until ctx is done. A valid
// new configuration is handed to r for the next request and loaded is
// told its digest; an invalid one is logged with its file and line, and
// the old one stays.
func watchConfig(ctx context.Context, file, inForce string, load func() (*config.Config, error), r reloader, hup <-chan os.Signal,
	interval time.Duration, log logrus.FieldLogger, loaded func(digest string)) {
	last, pending := inForce, ""
	for {
		var why, d string
		select {
		case <-ctx.Done():
			return
		case <-hup:
			why, d = "SIGHUP", digest(file)
		case <-time.After(interval):
			// A change counts once the file has stayed the same for an
			// interval: a file being written is not read half-way.
			if d = digest(file); d == last || d != pending {
				pending = d
				continue
			}
			why = "the file changed"
		}
		last, pending = d, ""
		cfg, err := load()
		if err == nil {
			err = r.Reload(cfg)
		}
		if err != nil {
			log.Errorf("configuration not reloaded (%s); the one in force stays: %v", why, err)
			continue
		}
		log.Infof("configuration reloaded (%s): %s in force", why, d)
		loaded(d)
	}
}

// digest names a file's content: "sha256:" and the first 12 hex digits,
// or "" when it cannot be read.
func digest(file string) string {
	data, err := os.ReadFile(file)
	if err != nil {
		return ""
	}
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:])[:12]
}
