package policy_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
)

func TestCheck(t *testing.T) {
	req := func(device string, src policy.Source) policy.Request {
		return policy.Request{Device: device, Item: device, Key: "k", Source: src}
	}
	tests := []struct {
		name    string
		policy  config.Policy
		reqs    []policy.Request
		wantErr []string
	}{
		{
			name:   "default devices allow nvidia.com/gpu",
			policy: config.Policy{Devices: config.DefaultDevices},
			reqs:   []policy.Request{req("nvidia.com/gpu=0", policy.SourcePod), req("nvidia.com/gpu=GPU-1", policy.SourceCDI)},
		},
		{
			name:    "default devices deny another kind, from either source",
			policy:  config.Policy{Devices: config.DefaultDevices},
			reqs:    []policy.Request{req("example.com/nic=0", policy.SourcePod), req("example.com/fpga=1", policy.SourceCDI)},
			wantErr: []string{`device "example.com/nic=0" matches none of policy.devices [nvidia.com/gpu=*]`, `"example.com/fpga=1"`, "add a glob"},
		},
		{
			name:   "*/* allows every device",
			policy: config.Policy{Devices: []string{"*/*"}},
			reqs:   []policy.Request{req("example.com/nic=0", policy.SourcePod)},
		},
		{
			name:    "all denied without allowAll",
			policy:  config.Policy{Devices: config.DefaultDevices},
			reqs:    []policy.Request{req("nvidia.com/gpu=all", policy.SourcePod)},
			wantErr: []string{`device "nvidia.com/gpu=all" gives every device of its kind`, "policy.allowAll: true"},
		},
		{
			name:   "all allowed with allowAll",
			policy: config.Policy{Devices: config.DefaultDevices, AllowAll: true},
			reqs:   []policy.Request{req("nvidia.com/gpu=all", policy.SourcePod)},
		},
		{
			name:   "all from a cdi.k8s.io annotation (set by node components) is not a pod's request",
			policy: config.Policy{Devices: config.DefaultDevices},
			reqs:   []policy.Request{req("nvidia.com/gpu=all", policy.SourceCDI)},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := policy.New(tc.policy).Check(tc.reqs)
			if len(tc.wantErr) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, policy.ErrDenied) {
				t.Fatalf("error %v does not wrap ErrDenied", err)
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}
