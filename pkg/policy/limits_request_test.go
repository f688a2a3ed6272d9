package policy_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
)

// names returns n device names of the default kind, "0" to "n-1", joined
// by commas, qualified or not.
func names(n int, qualified bool) string { return namesFrom(0, n, qualified) }

// namesFrom returns n device names from "start" on, as names does.
func namesFrom(start, n int, qualified bool) string {
	items := make([]string, n)
	for i := range items {
		items[i] = fmt.Sprint(start + i)
		if qualified {
			items[i] = "nvidia.com/gpu=" + items[i]
		}
	}
	return strings.Join(items, ",")
}

// TestParseAtLimits: each limit on what a tenant may write is met
// exactly and then passed by one: a count of 1 and 1024, not 0 or 1025;
// 256 items in one annotation, over all of a container's annotations,
// and with its CRI request, not 257.
func TestParseAtLimits(t *testing.T) {
	cdi := func(start, n int) []string { return strings.Split(namesFrom(start, n, true), ",") }
	tests := []struct {
		name    string
		podAnn  map[string]string
		ctrAnn  map[string]string
		cdiDevs []string
		count   int
		items   int
		wantErr []string
	}{
		{name: "count 1", podAnn: map[string]string{"gpu-count.nri-gpu.io": "1"}, count: 1},
		{name: "count 1024", podAnn: map[string]string{"gpu-count.nri-gpu.io": "1024"}, count: 1024},
		{name: "count 0", podAnn: map[string]string{"gpu-count.nri-gpu.io": "0"}, wantErr: []string{`"0" is not a whole number from 1 to 1024`}},
		{name: "count 1025", podAnn: map[string]string{"gpu-count.nri-gpu.io": "1025"}, wantErr: []string{`"1025" is not a whole number from 1 to 1024`}},
		{name: "256 items in a pod annotation", podAnn: map[string]string{"gpus.nri-gpu.io": names(256, false)}, items: 256},
		{name: "257 items in a pod annotation", podAnn: map[string]string{"gpus.nri-gpu.io": names(257, false)}, wantErr: []string{"257 items, more than 256"}},
		{name: "256 items in container annotations", ctrAnn: map[string]string{"cdi.k8s.io/a": names(128, true), "cdi.k8s.io/b": namesFrom(128, 128, true)}, items: 256},
		{name: "257 items in container annotations", ctrAnn: map[string]string{"cdi.k8s.io/a": names(128, true), "cdi.k8s.io/b": namesFrom(128, 129, true)}, wantErr: []string{"more than 256"}},
		{name: "256 CRI CDI devices", cdiDevs: cdi(0, 256), items: 256},
		{name: "257 CRI CDI devices", cdiDevs: cdi(0, 257), wantErr: []string{"CDI devices of the container's CRI request", "257, more than 256"}},
		{name: "256 between annotations and the CRI request", podAnn: map[string]string{"gpus.nri-gpu.io": names(128, false)}, cdiDevs: cdi(128, 128), items: 256},
		{name: "257 between annotations and the CRI request", podAnn: map[string]string{"gpus.nri-gpu.io": names(129, false)}, cdiDevs: cdi(129, 128), wantErr: []string{"257 devices asked for, more than 256"}},
	}
	parser, err := policy.NewParser("nvidia.com/gpu", true)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ask, err := parser.Parse(policy.Container{PodAnnotations: tc.podAnn, Annotations: tc.ctrAnn, CDIDevices: tc.cdiDevs})
			if tc.wantErr != nil {
				testutil.ErrorSays(t, err, tc.wantErr...)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if ask.Count != tc.count || len(ask.Requests) != tc.items {
				t.Errorf("count %d, %d requests; want %d and %d", ask.Count, len(ask.Requests), tc.count, tc.items)
			}
		})
	}
}

// TestRequestNames: a request is named by the item as written, and the
// device it means when that differs (a short name), so that a tenant sees
// which of its items was refused.
func TestRequestNames(t *testing.T) {
	parser, err := policy.NewParser("nvidia.com/gpu", true)
	if err != nil {
		t.Fatal(err)
	}
	ask, err := parser.Parse(policy.Container{PodAnnotations: map[string]string{"gpus.nri-gpu.io": "1,nvidia.com/gpu=2"}})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{`pod annotation "gpus.nri-gpu.io" request "1" (nvidia.com/gpu=1)`, `pod annotation "gpus.nri-gpu.io" request "nvidia.com/gpu=2"`}
	for i, r := range ask.Requests {
		if got := r.String(); got != want[i] {
			t.Errorf("request %d: %q, want %q", i, got, want[i])
		}
	}
}

// TestLongItemsCut: an item is quoted whole in an error up to 64 bytes,
// and cut after that.
func TestLongItemsCut(t *testing.T) {
	parser, err := policy.NewParser("nvidia.com/gpu", true)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		value, want string
	}{
		{strings.Repeat("9", 64), `"` + strings.Repeat("9", 64) + `" is not`},
		{strings.Repeat("9", 65), `"` + strings.Repeat("9", 64) + `..." is not`},
	} {
		_, err := parser.Parse(policy.Container{PodAnnotations: map[string]string{"gpu-count.nri-gpu.io": tc.value}})
		testutil.ErrorSays(t, err, tc.want)
	}
}
