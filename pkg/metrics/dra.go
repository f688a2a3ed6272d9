package metrics

import (
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Results of preparing or unpreparing a claim.
const (
	ResultOK    = "ok"
	ResultError = "error"
)

// DRA records the metrics of nri-gpu's DRA driver, a process of its own,
// in a registry of its own. Like Metrics, every method does nothing on a
// nil DRA (metrics off).
type DRA struct {
	registry         *prometheus.Registry
	prepare          *prometheus.CounterVec
	unprepare        *prometheus.CounterVec
	prepareSeconds   prometheus.Histogram
	unprepareSeconds prometheus.Histogram
	inFlight         prometheus.Gauge
	apiErrors        *prometheus.CounterVec
	sliceFollow      prometheus.Histogram
}

// claimBuckets span a claim prepared from memory (a millisecond) to one
// that waits on nri-gpu taking over or on the MPS daemon it starts.
var claimBuckets = []float64{1e-3, 5e-3, 25e-3, 100e-3, 250e-3, 500e-3, 1, 2.5, 5, 10, 30}

// NewDRA returns the DRA driver's metrics, registered in a new registry;
// prepared, when not nil, says at each scrape how many claims the pool
// holds prepared on the node.
func NewDRA(prepared func() float64) *DRA {
	m := &DRA{
		registry: prometheus.NewRegistry(),
		prepare: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nri_gpu_dra_prepare_total", Help: "Claims kubelet asked the DRA driver to prepare, by result (ok, error).",
		}, []string{"result"}),
		unprepare: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nri_gpu_dra_unprepare_total", Help: "Claims kubelet asked the DRA driver to unprepare, by result (ok, error).",
		}, []string{"result"}),
		prepareSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "nri_gpu_dra_prepare_duration_seconds", Help: "Time to prepare one claim.", Buckets: claimBuckets,
		}),
		unprepareSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "nri_gpu_dra_unprepare_duration_seconds", Help: "Time to unprepare one claim.", Buckets: claimBuckets,
		}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "nri_gpu_dra_requests_in_flight", Help: "Claims being prepared or unprepared now.",
		}),
		apiErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nri_gpu_dra_api_errors_total", Help: "Requests of the DRA driver to the API server that failed (no answer, or a 5xx or 429 status), by verb.",
		}, []string{"verb"}),
		sliceFollow: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "nri_gpu_dra_slice_follow_seconds",
			Help:    "Time from nri-gpu telling the DRA driver that its devices, their health or what is held changed, to the node's ResourceSlice published with it.",
			Buckets: []float64{1e-3, 5e-3, 25e-3, 100e-3, 250e-3, 500e-3, 1, 2.5, 5, 10},
		}),
	}
	m.registry.MustRegister(m.prepare, m.unprepare, m.prepareSeconds, m.unprepareSeconds, m.inFlight, m.apiErrors, m.sliceFollow)
	if prepared != nil {
		m.registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "nri_gpu_dra_claims_prepared", Help: "Claims prepared on the node, held in nri-gpu's pool.",
		}, prepared))
	}
	return m
}

// Start records a claim being prepared or unprepared; the function it
// returns records that it ended, and how (prepare: whether preparing,
// else unpreparing; failed: whether it failed).
func (m *DRA) Start(prepare bool) (done func(failed bool)) {
	if m == nil {
		return func(bool) {}
	}
	began := time.Now()
	m.inFlight.Inc()
	return func(failed bool) {
		m.inFlight.Dec()
		count, took := m.unprepare, m.unprepareSeconds
		if prepare {
			count, took = m.prepare, m.prepareSeconds
		}
		result := ResultOK
		if failed {
			result = ResultError
		}
		count.WithLabelValues(result).Inc()
		took.Observe(time.Since(began).Seconds())
	}
}

// SliceFollowed records how long the ResourceSlice took to follow a
// change.
func (m *DRA) SliceFollowed(d time.Duration) {
	if m != nil {
		m.sliceFollow.Observe(d.Seconds())
	}
}

// CountAPIErrors returns rt counting the requests to the API server that
// fail: no answer, or a 5xx or 429 status.
func (m *DRA) CountAPIErrors(rt http.RoundTripper) http.RoundTripper {
	if m == nil {
		return rt
	}
	return roundTripper(func(r *http.Request) (*http.Response, error) {
		resp, err := rt.RoundTrip(r)
		if err != nil || resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests {
			m.apiErrors.WithLabelValues(r.Method).Inc()
		}
		return resp, err
	})
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// Serve listens on addr and serves the metrics at /metrics. It returns
// the address listened on and a channel that receives the error the
// server stops with, or the error of listening.
func (m *DRA) Serve(addr string) (net.Addr, <-chan error, error) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", m.Handler())
	return serve(addr, mux)
}

// Handler serves the metrics.
func (m *DRA) Handler() http.Handler {
	return promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{})
}
