package policy_test

import (
	"path"
	"testing"

	"tags.cncf.io/container-device-interface/pkg/parser"

	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
)

// FuzzParseAndCheck feeds any annotation values through parsing and the
// policy: it must never panic, and whatever it allows must be a valid
// qualified name inside policy.devices ("all" only with allowAll).
func FuzzParseAndCheck(f *testing.F) {
	for _, seed := range []struct {
		pod, count, cdi string
		allowAll        bool
	}{
		{"0", "", "", false},
		{" 0 , nvidia.com/gpu=1,1 ", "", "", false},
		{"all", "", "", true},
		{"GPU-4f0c,0:1", "", "nvidia.com/gpu=3", false},
		{"example.com/nic=0", "", "example.com/nic=1,nvidia.com/gpu=all", false},
		{"", "2", "", false},
		{"0,,1", "x", "nvidia.com/gpu=", false},
		{"../../dev/sda;rm -rf /", "-1", "\xff\xfe", false},
		{"nvidia.com/gpu=*", "", "nvidia.com/gpu=[", true},
	} {
		f.Add(seed.pod, seed.count, seed.cdi, seed.allowAll)
	}
	p, err := policy.NewParser("nvidia.com/gpu", true)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, podValue, count, cdiValue string, allowAll bool) {
		podAnn := map[string]string{"gpus.nri-gpu.io/pod": podValue}
		if count != "" {
			podAnn = map[string]string{"gpu-count.nri-gpu.io": count}
		}
		ask, err := p.Parse(policy.Container{
			Namespace: "ns", Pod: "p", Name: "c",
			PodAnnotations: podAnn,
			Annotations:    map[string]string{"cdi.k8s.io/x": cdiValue},
		})
		if err != nil {
			return
		}
		rules := config.Policy{Namespaces: []string{"*"}, Devices: config.DefaultDevices, AllowAll: allowAll}
		if err := policy.New(rules).Check(policy.Pod{ID: "id", Namespace: "ns", Name: "p"}, ask); err != nil {
			return
		}
		for _, r := range ask.Requests {
			if _, _, _, err := parser.ParseQualifiedName(r.Device); err != nil {
				t.Fatalf("allowed an invalid name %q: %v", r.Device, err)
			}
			if ok, _ := path.Match(config.DefaultDevices[0], r.Device); !ok {
				t.Fatalf("allowed %q, outside policy.devices", r.Device)
			}
			if _, _, name := parser.ParseDevice(r.Device); name == policy.AllDevice && r.Origin == policy.OriginPod && !allowAll {
				t.Fatalf("allowed %q without allowAll", r.Device)
			}
		}
	})
}
