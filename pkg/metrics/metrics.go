// Package metrics exposes nri-gpu's Prometheus metrics: requests by
// result, denials by rule, injection latency, devices held and spec
// problems; and, read at each scrape, who holds which device of the node,
// what each offers and how much of it is used, and its MPS daemon.
package metrics

import (
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Results of a CreateContainer request.
const (
	ResultInjected = "injected"
	ResultDenied   = "denied"
	ResultNone     = "none" // the container asked for nothing
)

// ResultOf is the result of a request that was denied, or gave
// devices devices.
func ResultOf(denied bool, devices int) string {
	switch {
	case denied:
		return ResultDenied
	case devices == 0:
		return ResultNone
	}
	return ResultInjected
}

// Metrics records nri-gpu's metrics in a registry of its own.
type Metrics struct {
	registry  *prometheus.Registry
	requests  *prometheus.CounterVec
	denials   *prometheus.CounterVec
	latency   prometheus.Histogram
	held      prometheus.Gauge
	specErrs  prometheus.Gauge
	unhealthy prometheus.Gauge
	rebuilt   prometheus.Gauge
	config    *prometheus.GaugeVec
	// node reads the node's devices at a scrape, once WatchNode is
	// called (nodeOnce registers its collector).
	node     atomic.Pointer[func() Node]
	nodeOnce sync.Once
}

// New returns metrics registered in a new registry.
func New() *Metrics {
	m := &Metrics{
		registry: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nri_gpu_requests_total", Help: "CreateContainer requests, by result (injected, denied, none).",
		}, []string{"result"}),
		denials: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nri_gpu_denials_total", Help: "Containers refused, by the rule or reason that refused them.",
		}, []string{"rule"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "nri_gpu_request_duration_seconds",
			Help:    "Time nri-gpu spends on a CreateContainer request.",
			Buckets: []float64{10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 5e-3, 25e-3, 100e-3, 1},
		}),
		held: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "nri_gpu_devices_held", Help: "Devices held by pods and prepared DRA claims.",
		}),
		specErrs: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "nri_gpu_spec_errors", Help: "CDI spec files not used: broken, conflicting or not trusted.",
		}),
		unhealthy: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "nri_gpu_unhealthy_gpus", Help: "NVIDIA GPUs found unhealthy (a critical Xid error, or lost).",
		}),
		rebuilt: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "nri_gpu_record_rebuilt",
			Help: "1 while nri-gpu runs on a rebuilt record of holdings: its state file was unusable at start, or pods hold devices found in their containers that no record had (each alone, until removed).",
		}),
		config: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "nri_gpu_config_info", Help: "The configuration file in force, by its digest (1 for the one in force).",
		}, []string{"digest"}),
	}
	m.registry.MustRegister(m.requests, m.denials, m.latency, m.held, m.specErrs, m.unhealthy, m.rebuilt, m.config)
	return m
}

// Request records a request's result and duration and, for a denied
// request, the rule or reason that denied it. Like every method, it does
// nothing on nil Metrics (metrics off).
func (m *Metrics) Request(result, rule string, d time.Duration) {
	if m == nil {
		return
	}
	m.requests.WithLabelValues(result).Inc()
	m.latency.Observe(d.Seconds())
	if result == ResultDenied {
		m.denials.WithLabelValues(rule).Inc()
	}
}

// Refused records a container refused after its request was served (by
// validation, when another plugin's adjustment conflicts with nri-gpu's),
// by the reason that refused it.
func (m *Metrics) Refused(rule string) {
	if m != nil {
		m.denials.WithLabelValues(rule).Inc()
	}
}

// DevicesHeld sets the number of devices pods hold.
func (m *Metrics) DevicesHeld(n int) {
	if m != nil {
		m.held.Set(float64(n))
	}
}

// SpecErrors sets the number of spec files not used.
func (m *Metrics) SpecErrors(n int) {
	if m != nil {
		m.specErrs.Set(float64(n))
	}
}

// ConfigLoaded records which configuration file is in force, by digest.
func (m *Metrics) ConfigLoaded(digest string) {
	if m != nil {
		m.config.Reset()
		m.config.WithLabelValues(digest).Set(1)
	}
}

// RecordRebuilt records whether nri-gpu runs on a rebuilt record.
func (m *Metrics) RecordRebuilt(rebuilt bool) {
	if m != nil {
		m.rebuilt.Set(bool01(rebuilt))
	}
}

// UnhealthyGPUs records how many NVIDIA GPUs are unhealthy.
func (m *Metrics) UnhealthyGPUs(n int) {
	if m != nil {
		m.unhealthy.Set(float64(n))
	}
}

// Handler serves the metrics.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{})
}

// Serve listens on addr and serves the metrics at /metrics, and the
// probes: /healthz answers 200 while the process serves, /readyz 200 when
// ready returns nil and 503 with its error otherwise. It returns the
// address listened on and a channel that receives the error the server
// stops with, or the error of listening.
func (m *Metrics) Serve(addr string, ready func() error) (net.Addr, <-chan error, error) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", m.Handler())
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := ready(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	return serve(addr, mux)
}

// serve listens on addr and serves mux; see Serve.
func serve(addr string, mux *http.ServeMux) (net.Addr, <-chan error, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	errs := make(chan error, 1)
	go func() { errs <- srv.Serve(l) }()
	return l.Addr(), errs, nil
}
