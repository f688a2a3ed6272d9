package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/config"
)

type fakeReloader struct {
	mu   sync.Mutex
	cfgs []*config.Config
}

func (f *fakeReloader) Reload(c *config.Config) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cfgs = append(f.cfgs, c)
	return nil
}

func (f *fakeReloader) last() (*config.Config, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.cfgs) == 0 {
		return nil, 0
	}
	return f.cfgs[len(f.cfgs)-1], len(f.cfgs)
}

// TestWatchConfig: a valid change of the file is handed over for the next
// request; an invalid one is logged with its line and not handed over;
// SIGHUP reloads even an unchanged file.
func TestWatchConfig(t *testing.T) {
	file := filepath.Join(t.TempDir(), "nri-gpu.yaml")
	// Written whole at once, as kubelet updates a ConfigMap's file (a
	// rename): a truncated file seen between two polls of a loaded
	// machine would be an empty, valid configuration.
	write := func(s string) {
		t.Helper()
		tmp := file + ".tmp"
		if err := os.WriteFile(tmp, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, file); err != nil {
			t.Fatal(err)
		}
	}
	write("policy:\n  namespaces: [a]\n")
	log, hook := logtest.NewNullLogger()
	log.SetOutput(io.Discard)
	r := &fakeReloader{}
	hup := make(chan os.Signal, 1)
	var digests []string
	var mu sync.Mutex
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go watchConfig(ctx, file, digest(file), func() (*config.Config, error) { return config.Load(file) }, r, hup, 10*time.Millisecond, log,
		func(d string) { mu.Lock(); digests = append(digests, d); mu.Unlock() })

	write("policy:\n  namespaces: [a, b]\n")
	testutil.Within(t, 5*time.Second, "the change handed over", func() bool {
		c, _ := r.last()
		return c != nil && len(c.Policy.Namespaces) == 2
	})
	_, n := r.last()
	write("policy:\n  namespace: [c]\n")
	testutil.Within(t, 5*time.Second, "the invalid change logged", func() bool {
		for _, e := range hook.AllEntries() {
			if e.Level == logrus.ErrorLevel && strings.Contains(e.Message, "line 2") && strings.Contains(e.Message, "the one in force stays") {
				return true
			}
		}
		return false
	})
	if _, m := r.last(); m != n {
		t.Errorf("an invalid configuration was handed over")
	}
	write("policy:\n  namespaces: [a, b]\n")
	testutil.Within(t, 5*time.Second, "the mended file handed over", func() bool { _, m := r.last(); return m == n+1 })
	hup <- os.Interrupt // any signal on the channel stands for SIGHUP
	testutil.Within(t, 5*time.Second, "SIGHUP reloads the unchanged file", func() bool { _, m := r.last(); return m == n+2 })
	mu.Lock()
	defer mu.Unlock()
	if len(digests) != 3 || !strings.HasPrefix(digests[0], "sha256:") || digests[0] != digests[2] {
		t.Errorf("digests reported %v: want one per reload, the same for the same content", digests)
	}
}
