package policy_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// TestUsage: what a GPU offers and who uses how much of it, whichever
// door each holder came through: a pod by name, by count, by kubelet's
// allocation, a claim by its allocated amount, a pod of "all", a pod
// found with no record; shared (4 replicas, 80Gi, 20Gi each by default)
// and not.
func TestUsage(t *testing.T) {
	candidates, byName := gpus()
	gpu0, gpu1, all := byName["0"], byName["1"], byName["all"]
	shared := config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices, Sharing: []config.Sharing{
		{Devices: []string{"nvidia.com/gpu=0"}, Replicas: 4, Strategy: config.StrategyMPS},
	}}
	plain := config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices}
	claimOf := func(name string, d specs.Device, use policy.Use) func(*policy.Allocations, *policy.Policy) error {
		return func(a *policy.Allocations, p *policy.Policy) error {
			_, err := a.AdmitClaim(p, policy.Claim{UID: "uid-" + name, Namespace: "ns", Name: name, Pods: []policy.PodName{{Namespace: "ns", Name: name}}},
				claimAsked([]policy.ClaimDevice{{Device: d, Requests: []string{"gpu"}, Use: use}}), policy.Choice{})
			return err
		}
	}
	named := func(name string, d specs.Device, kubelet bool) func(*policy.Allocations, *policy.Policy) error {
		return func(a *policy.Allocations, p *policy.Policy) error {
			var from []string
			if kubelet {
				from = []string{d.Name}
			}
			_, err := admit(a, p, pod(name), []specs.Device{d}, 0, policy.Choice{}, from)
			return err
		}
	}
	counted := func(name string) func(*policy.Allocations, *policy.Policy) error {
		return func(a *policy.Allocations, p *policy.Policy) error {
			_, err := admit(a, p, pod(name), nil, 1, policy.Choice{Candidates: candidates}, nil)
			return err
		}
	}
	claim := policy.Claim{UID: "uid-c", Namespace: "ns", Name: "c", Pods: []policy.PodName{{Namespace: "ns", Name: "c"}}}
	tests := []struct {
		name   string
		cfg    config.Policy
		holds  []func(*policy.Allocations, *policy.Policy) error
		found  []policy.Holding // restored as found with no record
		device specs.Device
		want   policy.Usage
	}{
		{name: "free", cfg: plain, device: gpu0, want: policy.Usage{Capacity: policy.Capacity{Shares: 1}}},
		{
			name: "held by name", cfg: plain, device: gpu0, holds: []func(*policy.Allocations, *policy.Policy) error{named("a", byName["GPU-0"], false)},
			want: policy.Usage{Capacity: policy.Capacity{Shares: 1}, Used: policy.Use{Shares: 1}, Users: []policy.User{{Pod: pod("a"), Device: byName["GPU-0"], Use: policy.Use{Shares: 1}}}},
		},
		{
			name: "by kubelet, another GPU free", cfg: plain, device: gpu1, holds: []func(*policy.Allocations, *policy.Policy) error{named("a", gpu0, true)},
			want: policy.Usage{Capacity: policy.Capacity{Shares: 1}},
		},
		{
			name: "by kubelet", cfg: plain, device: gpu0, holds: []func(*policy.Allocations, *policy.Policy) error{named("a", gpu0, true)},
			want: policy.Usage{Capacity: policy.Capacity{Shares: 1}, Used: policy.Use{Shares: 1}, Users: []policy.User{{Pod: pod("a"), Device: gpu0, Kubelet: true, Use: policy.Use{Shares: 1}}}},
		},
		{
			name: "by count", cfg: plain, device: gpu0, holds: []func(*policy.Allocations, *policy.Policy) error{counted("a")},
			want: policy.Usage{Capacity: policy.Capacity{Shares: 1}, Used: policy.Use{Shares: 1}, Users: []policy.User{{Pod: pod("a"), Device: gpu0, Counted: true, Use: policy.Use{Shares: 1}}}},
		},
		{
			name: "all", cfg: plain, device: gpu1, holds: []func(*policy.Allocations, *policy.Policy) error{named("a", all, false)},
			want: policy.Usage{Capacity: policy.Capacity{Shares: 1}, Used: policy.Use{Shares: 1}, Users: []policy.User{{Pod: pod("a"), Device: all, Use: policy.Use{Shares: 1}}}},
		},
		{
			name: "found with no record", cfg: plain, device: gpu0, found: []policy.Holding{{Pod: pod("a"), Named: []specs.Device{gpu0}, Sole: []string{gpu0.Name}}},
			want: policy.Usage{Capacity: policy.Capacity{Shares: 1}, Used: policy.Use{Shares: 1}, Users: []policy.User{{Pod: pod("a"), Device: gpu0, Found: true, Use: policy.Use{Shares: 1}}}},
		},
		{
			name: "a claim", cfg: plain, device: gpu0, holds: []func(*policy.Allocations, *policy.Policy) error{claimOf("c", gpu0, policy.Use{})},
			want: policy.Usage{Capacity: policy.Capacity{Shares: 1}, Used: policy.Use{Shares: 1}, Users: []policy.User{{Claim: &claim, Device: gpu0, Use: policy.Use{Shares: 1}}}},
		},
		{
			name: "shared: a claim's amount and pods' defaults", cfg: shared, device: gpu0,
			holds: []func(*policy.Allocations, *policy.Policy) error{claimOf("c", gpu0, policy.Use{Shares: 1, Memory: 30 * gi}), named("a", gpu0, false), named("b", byName["GPU-0"], true)},
			want: policy.Usage{
				Capacity: policy.Capacity{Shares: 4, Memory: 80 * gi, Default: 20 * gi, Minimum: 1 << 20, Maximum: 80 * gi, Step: 1 << 20},
				Used:     policy.Use{Shares: 3, Memory: 70 * gi},
				Users: []policy.User{
					{Claim: &claim, Device: gpu0, Use: policy.Use{Shares: 1, Memory: 30 * gi}},
					{Pod: pod("a"), Device: gpu0, Use: policy.Use{Shares: 1, Memory: 20 * gi}},
					{Pod: pod("b"), Device: byName["GPU-0"], Kubelet: true, Use: policy.Use{Shares: 1, Memory: 20 * gi}},
				},
			},
		},
		{
			name: "shared, and found held alone: all of it", cfg: shared, device: gpu0, found: []policy.Holding{{Pod: pod("a"), Named: []specs.Device{gpu0}, Sole: []string{gpu0.Name}}},
			want: policy.Usage{
				Capacity: policy.Capacity{Shares: 4, Memory: 80 * gi, Default: 20 * gi, Minimum: 1 << 20, Maximum: 80 * gi, Step: 1 << 20},
				Used:     policy.Use{Shares: 4, Memory: 80 * gi},
				Users:    []policy.User{{Pod: pod("a"), Device: gpu0, Found: true, Use: policy.Use{Shares: 4, Memory: 80 * gi}}},
			},
		},
		{
			name: "a pod holding it by two names: one user", cfg: plain, device: gpu0, holds: []func(*policy.Allocations, *policy.Policy) error{func(a *policy.Allocations, p *policy.Policy) error {
				_, err := admit(a, p, pod("a"), []specs.Device{gpu0, all}, 0, policy.Choice{}, nil)
				return err
			}},
			want: policy.Usage{Capacity: policy.Capacity{Shares: 1}, Used: policy.Use{Shares: 1}, Users: []policy.User{{Pod: pod("a"), Device: gpu0, Use: policy.Use{Shares: 1}}}},
		},
		{
			name: "shared, and all held: all of it", cfg: shared, device: gpu0, holds: []func(*policy.Allocations, *policy.Policy) error{named("a", all, false)},
			want: policy.Usage{
				Capacity: policy.Capacity{Shares: 4, Memory: 80 * gi, Default: 20 * gi, Minimum: 1 << 20, Maximum: 80 * gi, Step: 1 << 20},
				Used:     policy.Use{Shares: 4, Memory: 80 * gi},
				Users:    []policy.User{{Pod: pod("a"), Device: all, Use: policy.Use{Shares: 4, Memory: 80 * gi}}},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := gpuPolicy(tc.cfg).WithMemory(func(d specs.Device) int64 {
				if d.Same(gpu0) {
					return 80 * gi
				}
				return 0
			})
			a := policy.NewAllocations()
			if len(tc.found) > 0 {
				if err := a.Restore(p, tc.found); err != nil {
					t.Fatal(err)
				}
			}
			for _, h := range tc.holds {
				if err := h(a, p); err != nil {
					t.Fatal(err)
				}
			}
			if diff := cmp.Diff(tc.want, a.Usage(p, tc.device)); diff != "" {
				t.Errorf("usage of %s (-want +got):\n%s", tc.device.Name, diff)
			}
		})
	}
}
