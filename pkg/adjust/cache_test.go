package adjust_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/nri-gpu/nri-gpu/pkg/adjust"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// overlapSpec shares a mount destination, an env key and a device node
// path with gpuSpec, so that merging must replace as CDI does.
const overlapSpec = `
cdiVersion: "0.6.0"
kind: example.com/overlap
containerEdits:
  env: ["SHARED=overlap", "DEEP=1"]
  mounts:
    - {hostPath: /opt/other, containerPath: /usr/lib/libexample.so.1, options: [ro, bind]}
    - {hostPath: /opt/deep, containerPath: /a/b/c/d, options: [ro, bind]}
    - {hostPath: /opt/top, containerPath: /top, options: [ro, bind]}
  hooks:
    - {hookName: poststop, path: /bin/cleanup}
devices:
  - name: x
    containerEdits:
      env: ["EXAMPLE_VISIBLE=x"]
      deviceNodes:
        - {path: /dev/example0, hostPath: /dev/zero}
        - {path: /dev/extra, hostPath: /dev/full, permissions: rw}
`

// TestBuildCachedEqualsBuild checks the prepared-fragment path against
// the plain one for device lists that overlap in every way merging cares
// about, in several orders, twice (the second time from the cache).
func TestBuildCachedEqualsBuild(t *testing.T) {
	yamls := map[string]string{"gpu.yaml": gpuSpec, "overlap.yaml": overlapSpec, "odd.yaml": unsupportedSpec}
	lists := [][]string{
		{"example.com/gpu=0"},
		{"example.com/gpu=0", "example.com/gpu=1"},
		{"example.com/gpu=1", "example.com/gpu=0"},
		{"example.com/gpu=0", "example.com/overlap=x"},
		{"example.com/overlap=x", "example.com/gpu=0", "example.com/gpu=1"},
		{"example.com/gpu=1", "example.com/overlap=x", "example.com/gpu=0"},
		{"example.com/odd=net"}, // unsupported: both fail the same way
	}
	var all []string
	for _, l := range lists {
		all = append(all, l...)
	}
	devs, nodes := devices(t, yamls, uniq(all)...)
	byName := map[string]*cdi.Device{}
	for _, d := range devs {
		byName[d.GetQualifiedName()] = d
	}
	cache := &adjust.Cache{}
	snapshot := &specs.Snapshot{}
	for round := 0; round < 2; round++ {
		for _, l := range lists {
			var ds []*cdi.Device
			for _, n := range l {
				ds = append(ds, byName[n])
			}
			want, wantErr := adjust.Build(ds, nodes, adjust.Options{})
			got, gotErr := adjust.BuildCached(cache, snapshot, ds, nodes, adjust.Options{})
			if (wantErr == nil) != (gotErr == nil) || (wantErr != nil && wantErr.Error() != gotErr.Error()) {
				t.Fatalf("%v: errors differ: %v / %v", l, wantErr, gotErr)
			}
			if wantErr != nil {
				continue
			}
			if diff := cmp.Diff(want.Adjustment, got.Adjustment, protocmp.Transform()); diff != "" {
				t.Errorf("round %d, %v (-Build +BuildCached):\n%s", round, l, diff)
			}
		}
	}
	// The user's UID changes owners: the plain path serves it.
	want, _ := adjust.Build(devs[:1], nodes, adjust.Options{UID: 1000, GID: 1000})
	got, _ := adjust.BuildCached(cache, snapshot, devs[:1], nodes, adjust.Options{UID: 1000, GID: 1000})
	if diff := cmp.Diff(want.Adjustment, got.Adjustment, protocmp.Transform()); diff != "" {
		t.Errorf("non-root user (-Build +BuildCached):\n%s", diff)
	}
}

func uniq(names []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, n := range names {
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	return out
}
