package adjust_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/nri-gpu/nri-gpu/pkg/adjust"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// creationSpec is GPUs 0 and 1, and a device "rdt" whose intelRdt edit
// NRI v0.8 (containerd 1.7) cannot apply.
const creationSpec = `cdiVersion: "0.7.0"
kind: nvidia.com/gpu
devices:
  - name: "0"
    containerEdits: {deviceNodes: [{path: /dev/null, type: c, major: 1, minor: 3}]}
  - name: "1"
    containerEdits: {deviceNodes: [{path: /dev/zero, type: c, major: 1, minor: 5}]}
  - name: "rdt"
    containerEdits: {intelRdt: {closID: "x"}}
`

// TestCreationDecide: what a container asks is resolved once in its
// snapshot into what to inject and what the pool is asked; a device the
// runtime's own CDI injected is not injected again, one the runtime
// injects from its own spec dirs not at all, and a claim's device is
// used, not held again.
func TestCreationDecide(t *testing.T) {
	const gpu0, gpu1 = "nvidia.com/gpu=0", "nvidia.com/gpu=1"
	// zero has GPU 0's device node, as the runtime's CDI gives it.
	zero := &api.Container{Linux: &api.LinuxContainer{Devices: []*api.LinuxDevice{{Path: "/dev/null", Type: "c", Major: 1, Minor: 3}}}}
	for _, tc := range []struct {
		name string
		ctr  *api.Container
		ask  []policy.Request
		held []string
		// inject are the devices to inject; injected those the runtime
		// did; named what the pool holds by name; used the claims'
		// devices; byCDI those the runtime's CDI injected, logged.
		inject, injected, named, used, byCDI []string
		holds                                bool
	}{
		{name: "a pod annotation", ctr: &api.Container{}, ask: []policy.Request{{Device: gpu0}},
			inject: []string{gpu0}, named: []string{gpu0}, holds: true},
		{name: "cdi.k8s.io, injected by the runtime's CDI", ctr: zero, ask: []policy.Request{{Device: gpu0, Origin: policy.OriginCDI}},
			inject: []string{gpu0}, injected: []string{gpu0}, named: []string{gpu0}, byCDI: []string{gpu0}, holds: true},
		{name: "a pod annotation, the nodes there already: injected", ctr: zero, ask: []policy.Request{{Device: gpu0}},
			inject: []string{gpu0}, named: []string{gpu0}, holds: true},
		{name: "the runtime's own, from its spec dirs", ctr: &api.Container{}, ask: []policy.Request{{Device: gpu1, Origin: policy.OriginRuntime}},
			injected: []string{gpu1}, named: []string{gpu1}, holds: true},
		{name: "a claim's device, reported by the runtime too", ctr: &api.Container{}, held: []string{gpu1}, ask: []policy.Request{{Device: gpu1, Origin: policy.OriginRuntime}},
			inject: []string{gpu1}, used: []string{gpu1}},
		{name: "a claim's device the runtime injected", ctr: zero, held: []string{gpu0},
			inject: []string{gpu0}, injected: []string{gpu0}, used: []string{gpu0}},
		{name: "unresolvable: asked, not injected", ctr: &api.Container{}, ask: []policy.Request{{Device: "nvidia.com/gpu=9"}},
			named: []string{"nvidia.com/gpu=9"}, holds: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, snap := load(t, map[string]string{"gpu.yaml": creationSpec})
			c := &adjust.Creation{Snap: snap, Ctr: tc.ctr}
			var held []policy.ClaimDevice
			for _, d := range snap.Footprints(tc.held) {
				held = append(held, policy.ClaimDevice{Device: d})
			}
			a := c.Decide(policy.Ask{Requests: tc.ask}, held)
			var inject, injected, named, used []string
			for _, e := range a.Inject {
				inject = append(inject, e.Footprint.Name)
			}
			for _, d := range a.Injected {
				injected = append(injected, d.GetQualifiedName())
			}
			for _, d := range a.Want.Named {
				named = append(named, d.Name)
			}
			for _, d := range a.Want.Used {
				used = append(used, d.Name)
			}
			got := [][]string{inject, injected, named, used, a.ByRuntimeCDI}
			want := [][]string{tc.inject, tc.injected, tc.named, tc.used, tc.byCDI}
			if !slices.EqualFunc(got, want, slices.Equal) || a.HoldsAny() != tc.holds {
				t.Errorf("inject, injected, named, used, by CDI %v, holds %t; want %v, %t", got, a.HoldsAny(), want, tc.holds)
			}
			for _, d := range a.Want.Named {
				if (d.Unresolved != nil) != strings.HasSuffix(d.Name, "=9") {
					t.Errorf("%s unresolved: %v", d.Name, d.Unresolved)
				}
			}
		})
	}
}

// TestCreationDevices: the devices injected are those resolved, less the
// runtime's, then those counted; a counted device that does not resolve
// names the count annotation.
func TestCreationDevices(t *testing.T) {
	_, snap := load(t, map[string]string{"gpu.yaml": creationSpec})
	c := &adjust.Creation{Snap: snap, Ctr: &api.Container{}}
	a := c.Decide(policy.Ask{Requests: []policy.Request{{Device: "nvidia.com/gpu=0"}, {Device: "nvidia.com/gpu=1"}}}, nil)
	a.Injected = []*cdi.Device{a.Inject[1].Device}
	devs, err := c.Devices(a, snap.Footprints([]string{"nvidia.com/gpu=rdt"}))
	var names []string
	for _, d := range devs {
		names = append(names, d.GetQualifiedName())
	}
	if want := []string{"nvidia.com/gpu=0", "nvidia.com/gpu=rdt"}; err != nil || !slices.Equal(names, want) {
		t.Errorf("devices %v, %v; want %v", names, err, want)
	}
	_, err = c.Devices(a, []specs.Device{{Name: "nvidia.com/gpu=9"}})
	if !errors.Is(err, specs.ErrUnresolvable) || !strings.Contains(err.Error(), policy.CountAnnotationKey) {
		t.Errorf("a counted device that does not resolve: %v; want it unresolvable, naming %s", err, policy.CountAnnotationKey)
	}
}

// TestCreationUsable: a device whose edits the runtime cannot apply is
// not usable (what a count request passes over), unless the
// configuration skips such edits; one that does not resolve is not.
func TestCreationUsable(t *testing.T) {
	_, snap := load(t, map[string]string{"gpu.yaml": creationSpec})
	for _, tc := range []struct {
		device string
		skip   bool
		usable bool
	}{
		{"nvidia.com/gpu=0", false, true},
		{"nvidia.com/gpu=rdt", false, false},
		{"nvidia.com/gpu=rdt", true, true},
		{"nvidia.com/gpu=9", true, false},
	} {
		c := &adjust.Creation{Snap: snap, Ctr: &api.Container{}, SkipUnsupported: tc.skip}
		for range 2 { // the second answer is the first's, kept
			if err := c.Usable(specs.Device{Name: tc.device}); (err == nil) != tc.usable {
				t.Errorf("%s (skip unsupported: %t): usable says %v; want usable %t", tc.device, tc.skip, err, tc.usable)
			}
		}
	}
}
