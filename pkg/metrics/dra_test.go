package metrics_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nri-gpu/nri-gpu/pkg/metrics"
)

// draSamples returns the DRA driver's samples, by line.
func draSamples(m *metrics.DRA) string {
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	return rec.Body.String()
}

// TestDRA: claims being prepared and unprepared are in flight until they
// end, then counted by result with their durations; failed requests to
// the API server are counted by verb, not those it answered; the slice's
// follow time is observed; the claims prepared are read at each scrape;
// metrics off record nothing and wrap nothing.
func TestDRA(t *testing.T) {
	prepared := 3.0
	m := metrics.NewDRA(func() float64 { return prepared })
	end := m.Start(true)
	if s := draSamples(m); !strings.Contains(s, "nri_gpu_dra_requests_in_flight 1") {
		t.Errorf("a claim being prepared is not in flight:\n%s", s)
	}
	end(false)
	m.Start(true)(true)
	m.Start(false)(false)
	m.SliceFollowed(30 * time.Millisecond)
	prepared = 4

	codes := []int{200, 404, 409, 429, 500, 503}
	i := 0
	rt := m.CountAPIErrors(fakeRoundTrip(func(r *http.Request) (*http.Response, error) {
		if i == len(codes) {
			return nil, errors.New("connection refused")
		}
		i++
		return &http.Response{StatusCode: codes[i-1], Body: http.NoBody}, nil
	}))
	for range len(codes) + 1 {
		_, _ = rt.RoundTrip(httptest.NewRequest("GET", "/api/v1/pods", nil))
	}
	_, _ = rt.RoundTrip(httptest.NewRequest("PATCH", "/apis/resource.k8s.io/v1/resourceslices/x", nil))

	s := draSamples(m)
	for _, want := range []string{
		"nri_gpu_dra_requests_in_flight 0",
		`nri_gpu_dra_prepare_total{result="ok"} 1`,
		`nri_gpu_dra_prepare_total{result="error"} 1`,
		`nri_gpu_dra_unprepare_total{result="ok"} 1`,
		"nri_gpu_dra_prepare_duration_seconds_count 2",
		"nri_gpu_dra_unprepare_duration_seconds_count 1",
		`nri_gpu_dra_slice_follow_seconds_bucket{le="0.025"} 0`,
		`nri_gpu_dra_slice_follow_seconds_bucket{le="0.1"} 1`,
		"nri_gpu_dra_claims_prepared 4",
		`nri_gpu_dra_api_errors_total{verb="GET"} 4`,
		`nri_gpu_dra_api_errors_total{verb="PATCH"} 1`,
	} {
		if !strings.Contains(s, want) {
			t.Errorf("no %s in:\n%s", want, s)
		}
	}

	// The histograms' buckets, as the dashboard's quantiles read them.
	for name, want := range map[string][]string{
		"nri_gpu_dra_prepare_duration_seconds":   {"0.001", "0.005", "0.025", "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "30", "+Inf"},
		"nri_gpu_dra_unprepare_duration_seconds": {"0.001", "0.005", "0.025", "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "30", "+Inf"},
		"nri_gpu_dra_slice_follow_seconds":       {"0.001", "0.005", "0.025", "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "+Inf"},
	} {
		if got := buckets(s, name); !slices.Equal(got, want) {
			t.Errorf("%s buckets %v, want %v", name, got, want)
		}
	}

	// The client sees what the API server (or the network) said.
	refused := errors.New("connection refused")
	answer := &http.Response{StatusCode: http.StatusServiceUnavailable, Body: http.NoBody}
	for _, inner := range []struct {
		resp *http.Response
		err  error
	}{{nil, refused}, {answer, nil}} {
		resp, err := m.CountAPIErrors(fakeRoundTrip(func(*http.Request) (*http.Response, error) { return inner.resp, inner.err })).
			RoundTrip(httptest.NewRequest("GET", "/api/v1/pods", nil))
		if resp != inner.resp || !errors.Is(err, inner.err) {
			t.Errorf("through the count: %v, %v; want %v, %v", resp, err, inner.resp, inner.err)
		}
	}

	var off *metrics.DRA
	off.Start(true)(true)
	off.SliceFollowed(time.Second)
	inner := fakeRoundTrip(func(*http.Request) (*http.Response, error) { return nil, nil })
	if got := off.CountAPIErrors(inner); got == nil {
		t.Error("metrics off lost the round tripper")
	}
}

// buckets returns the le labels of histogram name's buckets in samples,
// in order.
func buckets(samples, name string) []string {
	var out []string
	for _, line := range strings.Split(samples, "\n") {
		if rest, ok := strings.CutPrefix(line, name+`_bucket{le="`); ok {
			le, _, _ := strings.Cut(rest, `"`)
			out = append(out, le)
		}
	}
	return out
}

type fakeRoundTrip func(*http.Request) (*http.Response, error)

func (f fakeRoundTrip) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
