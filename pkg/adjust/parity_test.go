package adjust_test

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"
	nrigen "github.com/containerd/nri/pkg/runtime-tools/generate"
	"github.com/google/go-cmp/cmp"
	oci "github.com/opencontainers/runtime-spec/specs-go"
	rgen "github.com/opencontainers/runtime-tools/generate"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/nri-gpu/nri-gpu/pkg/adjust"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// baseSpec is a container spec as a runtime hands it to NRI and to CDI.
func baseSpec() *oci.Spec {
	return &oci.Spec{
		Process: &oci.Process{Env: []string{"PATH=/bin", "SHARED=0"}},
		Mounts:  []oci.Mount{{Destination: "/proc", Type: "proc", Source: "proc"}},
		Linux: &oci.Linux{Resources: &oci.LinuxResources{
			Devices: []oci.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}},
		}},
	}
}

// overlapSpec shares a mount destination, an env key and a device node
// path with gpuSpec, and has a deeper mount, so that applying both must
// replace and sort as CDI does.
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
    - {hookName: poststop, path: /bin/cleanup, timeout: 5}
devices:
  - name: x
    containerEdits:
      env: ["EXAMPLE_VISIBLE=x"]
      deviceNodes:
        - {path: /dev/example0, hostPath: /dev/zero}
        - {path: /dev/extra, hostPath: /dev/full, permissions: rw}
`

// TestParityWithCDIInjection applies the adjustment the way a runtime's NRI
// does, and the devices the way a runtime's own CDI support does, to the
// same spec, and compares the results.
func TestParityWithCDIInjection(t *testing.T) {
	tests := []struct {
		name  string
		names []string
	}{
		{name: "two devices of one spec", names: []string{"example.com/gpu=0", "example.com/gpu=1"}},
		{name: "a later spec replaces env, a device node and a mount of an earlier one",
			names: []string{"example.com/gpu=0", "example.com/overlap=x", "example.com/gpu=1"}},
		{name: "the other way round", names: []string{"example.com/overlap=x", "example.com/gpu=1", "example.com/gpu=0"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			devs, snap := load(t, map[string]string{"gpu.yaml": gpuSpec, "overlap.yaml": overlapSpec}, tc.names...)
			nodes := snap.HostNodes
			viaCDI := injectedByCDI(t, snap, devs, tc.names)
			res, err := adjust.Build(devs, nodes, adjust.Options{})
			if err != nil {
				t.Fatal(err)
			}
			viaNRI := adjustedByNRI(t, res.Adjustment)

			if diff := cmp.Diff(viaCDI.Process.Env, viaNRI.Process.Env); diff != "" {
				t.Errorf("env (-cdi +nri):\n%s", diff)
			}
			if diff := cmp.Diff(viaCDI.Mounts, viaNRI.Mounts); diff != "" {
				t.Errorf("mounts (-cdi +nri):\n%s", diff)
			}
			// nri-gpu gives a hook without an environment a minimal one
			// (CDI leaves it empty, and the hook inherits the runtime's).
			for _, point := range [][]oci.Hook{viaCDI.Hooks.CreateContainer, viaCDI.Hooks.Poststop} {
				for i := range point {
					if len(point[i].Env) != 0 {
						t.Fatal("the test spec's hooks have an env; this test needs them without")
					}
					point[i].Env = []string{specs.HookEnv}
				}
			}
			if diff := cmp.Diff(viaCDI.Hooks, viaNRI.Hooks); diff != "" {
				t.Errorf("hooks (-cdi +nri):\n%s", diff)
			}
			if diff := cmp.Diff(viaCDI.Linux.Devices, viaNRI.Linux.Devices); diff != "" {
				t.Errorf("devices (-cdi +nri):\n%s", diff)
			}
			// NRI adds an "rw" rule of its own for each device it adds;
			// less those, the rules must be CDI's, in CDI's order.
			rules := slices.Clone(viaNRI.Linux.Resources.Devices)
			for _, d := range viaNRI.Linux.Devices {
				i := slices.IndexFunc(rules, func(r oci.LinuxDeviceCgroup) bool {
					return r.Allow && r.Access == "rw" && r.Type == d.Type && *r.Major == d.Major && *r.Minor == d.Minor
				})
				if i < 0 {
					t.Fatalf("no rw rule for device %s", d.Path)
				}
				rules = slices.Delete(rules, i, i+1)
			}
			if diff := cmp.Diff(viaCDI.Linux.Resources.Devices, rules); diff != "" {
				t.Errorf("cgroup device rules (-cdi +nri):\n%s", diff)
			}
		})
	}
}

// injectedByCDI injects the named devices into a base spec as a runtime's
// own CDI support does, from the spec directory of devs.
func injectedByCDI(t *testing.T, snap *specs.Snapshot, devs []*cdi.Device, names []string) *oci.Spec {
	t.Helper()
	spec := baseSpec()
	cache, err := cdi.NewCache(cdi.WithSpecDirs(filepath.Dir(snap.SpecPath(devs[0].GetSpec()))), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cache.InjectDevices(spec, names...); err != nil {
		t.Fatal(err)
	}
	return spec
}

// adjustedByNRI applies an adjustment to a base spec as a runtime's NRI does.
func adjustedByNRI(t *testing.T, adj *api.ContainerAdjustment) *oci.Spec {
	t.Helper()
	g := rgen.NewFromSpec(baseSpec())
	if err := nrigen.SpecGenerator(&g).Adjust(adj); err != nil {
		t.Fatal(err)
	}
	return g.Config
}

// TestParityManySpecs asks for devices of more specs than a request
// usually names, each spec's own edits setting the same variable, in an
// order that comes back to earlier specs: a spec's own edits are applied
// once, when its first device is, as CDI's own injection does.
func TestParityManySpecs(t *testing.T) {
	const specs = 11
	yamls := map[string]string{}
	var names []string
	for i := 0; i < specs; i++ {
		yamls[fmt.Sprintf("s%02d.yaml", i)] = fmt.Sprintf(`
cdiVersion: "0.6.0"
kind: example.com/s%d
containerEdits:
  env: ["LAST_SPEC=%d", "SPEC_%d=1"]
devices:
  - {name: a, containerEdits: {env: ["LAST_DEVICE=%d/a"]}}
  - {name: b, containerEdits: {env: ["LAST_DEVICE=%d/b"]}}
`, i, i, i, i, i)
		names = append(names, fmt.Sprintf("example.com/s%d=a", i))
	}
	for i := specs - 2; i >= 0; i -= 3 { // 9 first: a spec beyond the first 8
		names = append(names, fmt.Sprintf("example.com/s%d=b", i))
	}
	devs, snap := load(t, yamls, names...)
	nodes := snap.HostNodes
	viaCDI := injectedByCDI(t, snap, devs, names)
	plain, err := adjust.Build(devs, nodes, adjust.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(viaCDI.Process.Env, adjustedByNRI(t, plain.Adjustment).Process.Env); diff != "" {
		t.Errorf("env (-cdi +nri):\n%s", diff)
	}
}

// TestParityManyMounts injects a spec of our own with hundreds of mounts,
// some sharing a destination and at several depths, as no published spec
// of the corpus has: the mounts must be CDI's (a later mount of a
// destination replaces an earlier one; shallower ones first). NRI orders
// mounts of one depth by destination where CDI keeps the spec's order;
// as none of them can cover another, the container sees the same.
func TestParityManyMounts(t *testing.T) {
	var b strings.Builder
	b.WriteString("cdiVersion: \"0.6.0\"\nkind: example.com/mounts\ncontainerEdits:\n  mounts:\n")
	for i := 0; i < 300; i++ {
		dest := fmt.Sprintf("/usr/lib/%slib%d.so", strings.Repeat("d/", i%5), i%250) // 50 destinations twice
		fmt.Fprintf(&b, "    - {hostPath: /opt/m%d, containerPath: %s, options: [ro, nosuid, nodev, bind]}\n", i, dest)
	}
	b.WriteString("devices:\n  - {name: x, containerEdits: {env: [X=1]}}\n")
	names := []string{"example.com/mounts=x"}
	devs, snap := load(t, map[string]string{"mounts.yaml": b.String()}, names...)
	nodes := snap.HostNodes
	viaCDI := injectedByCDI(t, snap, devs, names)
	res, err := adjust.Build(devs, nodes, adjust.Options{})
	if err != nil {
		t.Fatal(err)
	}
	viaNRI := adjustedByNRI(t, res.Adjustment)
	if len(viaCDI.Mounts) < 250 {
		t.Fatalf("CDI gave %d mounts; the test spec is wrong", len(viaCDI.Mounts))
	}
	byDepth := func(ms []oci.Mount) []oci.Mount {
		out := slices.Clone(ms)
		slices.SortStableFunc(out, func(a, b oci.Mount) int {
			da, db := strings.Count(filepath.Clean(a.Destination), "/"), strings.Count(filepath.Clean(b.Destination), "/")
			if da != db {
				return da - db
			}
			return strings.Compare(a.Destination, b.Destination)
		})
		return out
	}
	if diff := cmp.Diff(byDepth(viaCDI.Mounts), viaNRI.Mounts); diff != "" {
		t.Errorf("mounts (-cdi +nri):\n%s", diff)
	}
}
