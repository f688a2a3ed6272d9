package metrics_test

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nri-gpu/nri-gpu/pkg/metrics"
)

func TestServe(t *testing.T) {
	var off *metrics.Metrics
	off.Request(metrics.ResultInjected, "", time.Millisecond) // metrics off: no panic
	off.Refused("injectedTwice")

	m := metrics.New()
	m.Request(metrics.ResultInjected, "", 30*time.Microsecond)
	m.Request(metrics.ResultDenied, "unresolvable", time.Millisecond)
	m.Refused("injectedTwice")
	m.DevicesHeld(3)
	m.SpecErrors(1)
	m.UnhealthyGPUs(2)
	m.ConfigLoaded("sha256:old")
	m.ConfigLoaded("sha256:0123456789ab")
	m.RecordRebuilt(true)
	ready := errors.New("not registered")
	addr, _, err := m.Serve("127.0.0.1:0", func() error { return ready })
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + addr.String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if strings.Contains(string(body), "sha256:old") {
		t.Error("the replaced configuration is still reported")
	}
	for _, want := range []string{
		`nri_gpu_requests_total{result="injected"} 1`,
		`nri_gpu_requests_total{result="denied"} 1`,
		`nri_gpu_denials_total{rule="unresolvable"} 1`,
		`nri_gpu_denials_total{rule="injectedTwice"} 1`,
		`nri_gpu_request_duration_seconds_bucket{le="5e-05"} 1`,
		`nri_gpu_devices_held 3`,
		`nri_gpu_spec_errors 1`,
		`nri_gpu_unhealthy_gpus 2`,
		`nri_gpu_config_info{digest="sha256:0123456789ab"} 1`,
		`nri_gpu_record_rebuilt 1`,
	} {
		// Whole lines: a metric's help may hold its name and a number.
		if !slices.Contains(strings.Split(string(body), "\n"), want) {
			t.Errorf("metrics lack %q:\n%s", want, body)
		}
	}

	// The probes: alive at once, ready when ready says so.
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get("http://" + addr.String() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	if code, _ := get("/healthz"); code != http.StatusOK {
		t.Errorf("/healthz: %d", code)
	}
	if code, body := get("/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "not registered") {
		t.Errorf("/readyz while not ready: %d %q", code, body)
	}
	ready = nil
	if code, _ := get("/readyz"); code != http.StatusOK {
		t.Errorf("/readyz when ready: %d", code)
	}
	if got := buckets(scrapeAll(t, m), "nri_gpu_request_duration_seconds"); !slices.Equal(got,
		[]string{"1e-05", "2.5e-05", "5e-05", "0.0001", "0.00025", "0.0005", "0.001", "0.005", "0.025", "0.1", "1", "+Inf"}) {
		t.Errorf("request duration buckets %v", got)
	}
	m.RecordRebuilt(false)
	if !slices.Contains(strings.Split(scrapeAll(t, m), "\n"), "nri_gpu_record_rebuilt 0") {
		t.Error("the record no longer rebuilt is still said rebuilt")
	}

	// An address nri-gpu cannot listen on is an error, for both servers.
	if _, _, err := m.Serve("256.0.0.1:0", func() error { return nil }); err == nil {
		t.Error("nri-gpu's metrics served on an address that is none")
	}
	if _, _, err := metrics.NewDRA(nil).Serve("256.0.0.1:0"); err == nil {
		t.Error("the DRA driver's metrics served on an address that is none")
	}
}

// scrapeAll returns everything m serves at /metrics, in its order.
func scrapeAll(t *testing.T, m *metrics.Metrics) string {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	return rec.Body.String()
}

// TestResultOf: a request is counted denied whatever it would have
// given, none when it gave no device, injected otherwise.
func TestResultOf(t *testing.T) {
	for _, tc := range []struct {
		denied  bool
		devices int
		want    string
	}{
		{denied: true, devices: 1, want: metrics.ResultDenied},
		{denied: true, want: metrics.ResultDenied},
		{want: metrics.ResultNone},
		{devices: 1, want: metrics.ResultInjected},
		{devices: 8, want: metrics.ResultInjected},
	} {
		if got := metrics.ResultOf(tc.denied, tc.devices); got != tc.want {
			t.Errorf("denied %t, %d devices: %q, want %q", tc.denied, tc.devices, got, tc.want)
		}
	}
}
