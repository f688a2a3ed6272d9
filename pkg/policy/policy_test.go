package policy_test

import (
	"errors"
	"testing"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
)

func TestCheck(t *testing.T) {
	req := func(device string, src policy.Origin) policy.Request {
		return policy.Request{Device: device, Item: device, Key: "k", Origin: src}
	}
	open := config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices}
	tenants := config.Policy{Namespaces: []string{"agents-*", "ml"}, Devices: config.DefaultDevices}
	tests := []struct {
		name      string
		policy    config.Policy
		namespace string
		ask       policy.Ask
		wantRule  string // the rule that denies; "" when allowed
		wantErr   []string
	}{
		{
			name:   "default devices allow nvidia.com/gpu",
			policy: open,
			ask:    policy.Ask{Requests: []policy.Request{req("nvidia.com/gpu=0", policy.OriginPod), req("nvidia.com/gpu=GPU-1", policy.OriginCDI)}},
		},
		{
			name:     "default devices deny another kind, from either source",
			policy:   open,
			ask:      policy.Ask{Requests: []policy.Request{req("example.com/nic=0", policy.OriginPod), req("example.com/fpga=1", policy.OriginCDI)}},
			wantRule: policy.RuleDevices,
			wantErr:  []string{`device "example.com/nic=0" matches none of policy.devices [nvidia.com/gpu=*]`, `"example.com/fpga=1"`, "add a glob"},
		},
		{
			name:   "*/* allows every device",
			policy: config.Policy{Namespaces: []string{"*"}, Devices: []string{"*/*"}},
			ask:    policy.Ask{Requests: []policy.Request{req("example.com/nic=0", policy.OriginPod)}},
		},
		{
			name:     "all denied without allowAll",
			policy:   open,
			ask:      policy.Ask{Requests: []policy.Request{req("nvidia.com/gpu=all", policy.OriginPod)}},
			wantRule: policy.RuleAllowAll,
			wantErr:  []string{`device "nvidia.com/gpu=all" gives every device of its kind`, "policy.allowAll: true"},
		},
		{
			name:   "all allowed with allowAll",
			policy: config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices, AllowAll: true},
			ask:    policy.Ask{Requests: []policy.Request{req("nvidia.com/gpu=all", policy.OriginPod)}},
		},
		{
			name:     "all from a cdi.k8s.io annotation, which a tenant can write too, denied without allowAll",
			policy:   open,
			ask:      policy.Ask{Requests: []policy.Request{req("nvidia.com/gpu=all", policy.OriginCDI)}},
			wantRule: policy.RuleAllowAll,
			wantErr:  []string{`container annotation "k" request "nvidia.com/gpu=all"`, "policy.allowAll: true"},
		},
		{
			name:   "all from a cdi.k8s.io annotation, with exemptCDIAnnotations",
			policy: config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices, ExemptCDIAnnotations: true},
			ask:    policy.Ask{Requests: []policy.Request{req("nvidia.com/gpu=all", policy.OriginCDI)}},
		},
		{
			name:      "namespace allowed by a glob",
			policy:    tenants,
			namespace: "agents-7",
			ask:       policy.Ask{Requests: []policy.Request{req("nvidia.com/gpu=0", policy.OriginPod)}},
		},
		{
			name:      "namespace denied, naming it",
			policy:    tenants,
			namespace: "default",
			ask:       policy.Ask{Requests: []policy.Request{req("nvidia.com/gpu=0", policy.OriginPod)}},
			wantRule:  policy.RuleNamespaces,
			wantErr:   []string{`pod annotation "k" request "nvidia.com/gpu=0"`, `pods of namespace "default" may not request devices through annotations`, "policy.namespaces [agents-*, ml]"},
		},
		{
			name:      "namespace denied for a count request",
			policy:    tenants,
			namespace: "default",
			ask:       policy.Ask{Count: 1},
			wantRule:  policy.RuleNamespaces,
			wantErr:   []string{`pod annotation "gpu-count.nri-gpu.io" request for 1 devices`, `namespace "default"`},
		},
		{
			name:      "the runtime's CDI devices are subject to no rule here: node components chose them",
			policy:    tenants,
			namespace: "default",
			ask:       policy.Ask{Requests: []policy.Request{req("example.com/nic=all", policy.OriginRuntime)}},
		},
		{
			name:      "cdi.k8s.io requests are subject to namespaces",
			policy:    tenants,
			namespace: "default",
			ask:       policy.Ask{Requests: []policy.Request{req("nvidia.com/gpu=0", policy.OriginCDI)}},
			wantRule:  policy.RuleNamespaces,
			wantErr:   []string{`container annotation "k" request "nvidia.com/gpu=0"`, `pods of namespace "default"`},
		},
		{
			name:      "cdi.k8s.io requests exempt from namespaces with exemptCDIAnnotations",
			policy:    config.Policy{Namespaces: tenants.Namespaces, Devices: config.DefaultDevices, ExemptCDIAnnotations: true},
			namespace: "kube-system",
			ask:       policy.Ask{Requests: []policy.Request{req("nvidia.com/gpu=0", policy.OriginCDI)}},
		},
		{
			name:      "exemptCDIAnnotations does not exempt pod annotations",
			policy:    config.Policy{Namespaces: tenants.Namespaces, Devices: config.DefaultDevices, ExemptCDIAnnotations: true},
			namespace: "default",
			ask:       policy.Ask{Requests: []policy.Request{req("nvidia.com/gpu=0", policy.OriginCDI), req("nvidia.com/gpu=1", policy.OriginPod)}},
			wantRule:  policy.RuleNamespaces,
			wantErr:   []string{`pod annotation "k" request "nvidia.com/gpu=1"`},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ns := tc.namespace
			if ns == "" {
				ns = "default"
			}
			err := policy.New(tc.policy).Check(policy.Pod{ID: "id", Namespace: ns, Name: "p"}, tc.ask)
			wantDenied(t, err, tc.wantRule, tc.wantErr...)
		})
	}
}

func TestCheckHooks(t *testing.T) {
	p := policy.New(config.Policy{HookPaths: config.DefaultHookPaths})
	if err := p.CheckHooks("nvidia.com/gpu=0", []string{"/usr/bin/nvidia-cdi-hook", "/usr/bin/nvidia-ctk"}); err != nil {
		t.Errorf("listed hooks denied: %v", err)
	}
	err := p.CheckHooks("nvidia.com/gpu=0", []string{"/usr/bin/nvidia-cdi-hook", "/tmp/evil"})
	wantDenied(t, err, policy.RuleHookPaths, `device "nvidia.com/gpu=0"`, `hook "/tmp/evil", which is not in policy.hookPaths`, "add it to policy.hookPaths")
}

// wantDenied checks that err is nil when no rule is wanted, and otherwise
// a denial by that rule, wrapping ErrDenied and saying every wanted string.
func wantDenied(t *testing.T, err error, rule string, want ...string) {
	t.Helper()
	if rule == "" {
		if err != nil {
			t.Fatalf("denied: %v", err)
		}
		return
	}
	testutil.ErrorSays(t, err, want...)
	if !errors.Is(err, policy.ErrDenied) {
		t.Errorf("error %v does not wrap ErrDenied", err)
	}
	var d *policy.Denial
	if !errors.As(err, &d) {
		t.Errorf("error %v is not a Denial", err)
	} else if d.Rule != rule {
		t.Errorf("denied by rule %q, want %q: %v", d.Rule, rule, err)
	}
}
