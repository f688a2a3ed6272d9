package metrics_test

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nri-gpu/nri-gpu/pkg/adjust"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/metrics"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

func TestRule(t *testing.T) {
	denial := policy.New(config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices}).Check(policy.Pod{}, policy.Ask{Requests: []policy.Request{{Device: "x.com/y=0"}}})
	tests := []struct {
		err  error
		want string
	}{
		{denial, policy.RuleDevices},
		{fmt.Errorf("pod: %w", policy.ErrInvalidRequest), "invalidRequest"},
		{fmt.Errorf("x: %w", specs.ErrUntrusted), "untrustedSpec"},
		{fmt.Errorf("x: %w", specs.ErrUnresolvable), "unresolvable"},
		{fmt.Errorf("x: %w", adjust.ErrUnsupportedEdit), "unsupportedEdits"},
		{errors.New("something else"), "other"},
	}
	for _, tc := range tests {
		if got := metrics.Rule(tc.err); got != tc.want {
			t.Errorf("Rule(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}

func TestServe(t *testing.T) {
	var off *metrics.Metrics
	off.Request(metrics.ResultInjected, nil, time.Millisecond) // metrics off: no panic

	m := metrics.New()
	m.Request(metrics.ResultInjected, nil, 30*time.Microsecond)
	m.Request(metrics.ResultDenied, fmt.Errorf("x: %w", specs.ErrUnresolvable), time.Millisecond)
	m.DevicesHeld(3)
	m.SpecErrors(1)
	addr, _, err := m.Serve("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + addr.String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, want := range []string{
		`nri_gpu_requests_total{result="injected"} 1`,
		`nri_gpu_requests_total{result="denied"} 1`,
		`nri_gpu_denials_total{rule="unresolvable"} 1`,
		`nri_gpu_request_duration_seconds_bucket{le="5e-05"} 1`,
		`nri_gpu_devices_held 3`,
		`nri_gpu_spec_errors 1`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q:\n%s", want, body)
		}
	}
}
