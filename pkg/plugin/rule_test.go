package plugin

import (
	"errors"
	"fmt"
	"testing"

	"github.com/nri-gpu/nri-gpu/pkg/adjust"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

func TestRule(t *testing.T) {
	denial := policy.New(config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices}).
		Check(policy.Pod{}, policy.Ask{Requests: []policy.Request{{Device: "x.com/y=0"}}})
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"no error", nil, ""},
		{"policy denial", fmt.Errorf("container: %w", denial), policy.RuleDevices},
		{"malformed request", fmt.Errorf("pod: %w", policy.ErrInvalidRequest), "invalidRequest"},
		{"untrusted spec", fmt.Errorf("x: %w", specs.ErrUntrusted), "untrustedSpec"},
		{"unknown device", fmt.Errorf("x: %w", specs.ErrUnresolvable), "unresolvable"},
		{"edit NRI cannot express", fmt.Errorf("x: %w", adjust.ErrUnsupportedEdit), "unsupportedEdits"},
		{"another plugin injects it too", fmt.Errorf("x: %w", adjust.ErrInjectedTwice), "injectedTwice"},
		{"anything else", errors.New("something else"), "other"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := rule(tc.err); got != tc.want {
				t.Errorf("rule(%v) = %q, want %q", tc.err, got, tc.want)
			}
		})
	}
}
