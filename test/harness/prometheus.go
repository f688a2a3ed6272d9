package harness

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
)

// PrometheusBinary is where the tools hold Debian's Prometheus server
// (make e2e-tools extracts its package there, beside promtool).
const PrometheusBinary = "prometheus/prometheus"

// Prometheus is a Prometheus server of a test: Debian's, listening on a
// port of the loopback, its data under its directory.
type Prometheus struct {
	// URL is where it serves its HTTP API.
	URL string
	// API is a client of its HTTP API.
	API  promv1.API
	proc *process
}

// StartPrometheus starts the Prometheus server bin with the configuration
// config (YAML) under dir, and waits until it is ready. On error it stops
// what it started.
func StartPrometheus(dir, bin, config string) (*Prometheus, error) {
	if err := os.MkdirAll(filepath.Join(dir, "data"), 0o755); err != nil {
		return nil, err
	}
	cfg := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfg, []byte(config), 0o644); err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	proc, err := startProcess("prometheus", filepath.Join(dir, "prometheus.log"), bin,
		"--config.file", cfg, "--storage.tsdb.path", filepath.Join(dir, "data"), "--web.listen-address", addr)
	if err != nil {
		return nil, err
	}
	p := &Prometheus{URL: "http://" + addr, proc: proc}
	client, err := api.NewClient(api.Config{Address: p.URL})
	if err != nil {
		p.Stop()
		return nil, err
	}
	p.API = promv1.NewAPI(client)
	if err := proc.waitFor("ready", 30*time.Second, func() error {
		resp, err := http.Get(p.URL + "/-/ready")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/-/ready: %s", resp.Status)
		}
		return nil
	}); err != nil {
		p.Stop()
		return nil, err
	}
	return p, nil
}

// Query evaluates expr now and returns its instant vector; an expression
// that is not a vector, or that Prometheus warns of, is an error.
func (p *Prometheus) Query(ctx context.Context, expr string) (model.Vector, error) {
	v, warnings, err := p.API.Query(ctx, expr, time.Now())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", expr, err)
	}
	if len(warnings) > 0 {
		return nil, fmt.Errorf("%s: warnings %v", expr, warnings)
	}
	vec, ok := v.(model.Vector)
	if !ok {
		return nil, fmt.Errorf("%s: a %s, not a vector", expr, v.Type())
	}
	return vec, nil
}

// LogTail returns the end of the server's log.
func (p *Prometheus) LogTail(n int) string { return p.proc.LogTail(n) }

// Stop stops the server.
func (p *Prometheus) Stop() { p.proc.Stop(10 * time.Second) }
