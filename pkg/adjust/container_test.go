package adjust_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/pkg/adjust"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// annotations returns what an adjustment sets (key: value) and removes
// ("-key": "", as NRI marks a removal).
func annotations(adj *api.ContainerAdjustment) map[string]string {
	if adj == nil {
		return nil
	}
	return adj.GetAnnotations()
}

// TestAnnotate: nri-gpu's annotations say what the container got and
// what was counted; a counted annotation the container carries is removed
// when nothing was counted.
func TestAnnotate(t *testing.T) {
	for _, tc := range []struct {
		name           string
		ctr            map[string]string
		given, counted []string
		want           map[string]string
	}{
		{"given and counted", nil, []string{"a=0", "a=1"}, []string{"a=1"},
			map[string]string{adjust.DevicesAnnotation: "a=0,a=1", adjust.CountedAnnotation: "a=1"}},
		{"none counted", nil, []string{"a=0"}, nil, map[string]string{adjust.DevicesAnnotation: "a=0"}},
		{"none counted, a counted annotation carried", map[string]string{adjust.CountedAnnotation: "a=7"}, []string{"a=0"}, nil,
			map[string]string{adjust.DevicesAnnotation: "a=0", "-" + adjust.CountedAnnotation: ""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			adj := &api.ContainerAdjustment{}
			adjust.Annotate(adj, &api.Container{Annotations: tc.ctr}, tc.given, tc.counted)
			if got := annotations(adj); !equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func equal(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestScrub: a container given nothing loses nri-gpu's annotations, and
// only those; one with none needs no adjustment.
func TestScrub(t *testing.T) {
	for _, tc := range []struct {
		name string
		ctr  map[string]string
		want map[string]string
	}{
		{"none", map[string]string{"other": "x"}, nil},
		{"devices", map[string]string{adjust.DevicesAnnotation: "a=0", "other": "x"}, map[string]string{"-" + adjust.DevicesAnnotation: ""}},
		{"both", map[string]string{adjust.DevicesAnnotation: "a=0", adjust.CountedAnnotation: "a=0"},
			map[string]string{"-" + adjust.DevicesAnnotation: "", "-" + adjust.CountedAnnotation: ""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			adj := adjust.Scrub(&api.Container{Annotations: tc.ctr})
			if tc.want == nil && adj != nil {
				t.Fatalf("got %v, want no adjustment", annotations(adj))
			}
			if got := annotations(adj); !equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// TestUserNS: a container has a user namespace of its own only when the
// runtime lists one.
func TestUserNS(t *testing.T) {
	for _, tc := range []struct {
		name string
		ctr  *api.Container
		want bool
	}{
		{"no linux", &api.Container{}, false},
		{"network only", &api.Container{Linux: &api.LinuxContainer{Namespaces: []*api.LinuxNamespace{{Type: "network"}}}}, false},
		{"user", &api.Container{Linux: &api.LinuxContainer{Namespaces: []*api.LinuxNamespace{{Type: "network"}, {Type: "user"}}}}, true},
	} {
		if got := adjust.UserNS(tc.ctr); got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestInjectedByRuntime: a device counts as injected by the runtime when
// the runtime reports it, or when every node and env entry of its own
// edits is in the container already.
func TestInjectedByRuntime(t *testing.T) {
	_, snap := load(t, map[string]string{"gpu.yaml": gpuSpec}, "example.com/gpu=0")
	e, err := snap.Lookup("example.com/gpu=0")
	if err != nil {
		t.Fatal(err)
	}
	node := []*api.LinuxDevice{{Path: "/dev/example0", Type: "c", Major: 1, Minor: 3}}
	for _, tc := range []struct {
		name string
		ctr  *api.Container
		want bool
	}{
		{"nothing", &api.Container{}, false},
		{"reported", &api.Container{CDIDevices: []*api.CDIDevice{{Name: "example.com/gpu=0"}}}, true},
		{"another reported", &api.Container{CDIDevices: []*api.CDIDevice{{Name: "example.com/gpu=1"}}}, false},
		{"its node and env", &api.Container{Env: []string{"EXAMPLE_VISIBLE=0"}, Linux: &api.LinuxContainer{Devices: node}}, true},
		{"its node, not its env", &api.Container{Env: []string{"EXAMPLE_VISIBLE=1"}, Linux: &api.LinuxContainer{Devices: node}}, false},
		{"its env, not its node", &api.Container{Env: []string{"EXAMPLE_VISIBLE=0"}}, false},
	} {
		if got := adjust.InjectedByRuntime(e, tc.ctr); got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
	bare := &specs.Entry{Device: e.Device, Footprint: e.Footprint}
	bare.Device.ContainerEdits.Env, bare.Device.ContainerEdits.DeviceNodes = nil, nil
	if adjust.InjectedByRuntime(bare, &api.Container{}) {
		t.Error("a device with neither nodes nor env counts as injected")
	}
}

// TestWithNodesOf: a candidate is in a container when all its device
// nodes are, whatever their paths; one without nodes never is.
func TestWithNodesOf(t *testing.T) {
	gpu0 := specs.Device{Name: "g=0", Nodes: []string{"c 195:0", "c 195:255"}}
	gpu1 := specs.Device{Name: "g=1", Nodes: []string{"c 195:1", "c 195:255"}}
	none := specs.Device{Name: "g=x"}
	dev := func(major, minor int64) *api.LinuxDevice {
		return &api.LinuxDevice{Path: "/dev/any", Type: "c", Major: major, Minor: minor}
	}
	for _, tc := range []struct {
		name string
		devs []*api.LinuxDevice
		want string
	}{
		{"none", nil, ""},
		{"one of two nodes", []*api.LinuxDevice{dev(195, 0)}, ""},
		{"all of one", []*api.LinuxDevice{dev(195, 0), dev(195, 255)}, "g=0"},
		{"all of both", []*api.LinuxDevice{dev(195, 1), dev(195, 0), dev(195, 255)}, "g=0,g=1"},
		{"a block device of the same numbers", []*api.LinuxDevice{{Type: "b", Major: 195, Minor: 0}, dev(195, 255)}, ""},
	} {
		got := specs.Names(adjust.WithNodesOf(&api.Container{Linux: &api.LinuxContainer{Devices: tc.devs}}, []specs.Device{gpu0, gpu1, none}))
		if strings.Join(got, ",") != tc.want {
			t.Errorf("%s: got %v, want %s", tc.name, got, tc.want)
		}
	}
	many := make([]*api.LinuxDevice, adjust.MaxContainerDevices)
	for i := range many {
		many[i] = dev(1, 3)
	}
	many = append(many, dev(195, 0), dev(195, 255))
	if got := adjust.WithNodesOf(&api.Container{Linux: &api.LinuxContainer{Devices: many}}, []specs.Device{gpu0}); len(got) != 0 {
		t.Errorf("nodes past the first %d were looked at: %v", adjust.MaxContainerDevices, specs.Names(got))
	}
}

// TestInjectedTwice: a device another plugin has the runtime inject is
// refused when it shares hardware with one nri-gpu injects itself, naming
// both and the other plugin; one the runtime injects for nri-gpu's own
// request anyway, or other hardware, is not.
func TestInjectedTwice(t *testing.T) {
	_, snap := load(t, map[string]string{"gpu.yaml": gpuSpec}, "example.com/gpu=0")
	owners := api.NewOwningPlugins()
	owners.ClaimCdiDevice("ctr", "example.com/gpu=0", "nvidia")
	for _, tc := range []struct {
		name    string
		given   string
		asked   []string
		runtime []string
		owners  *api.OwningPlugins
		want    string
	}{
		{"nothing given", "", []string{"example.com/gpu=0"}, nil, nil, ""},
		{"nothing asked", "example.com/gpu=0", nil, nil, nil, ""},
		{"other hardware", "example.com/gpu=0", []string{"example.com/gpu=1"}, nil, nil, ""},
		{"the same", "example.com/gpu=0", []string{"example.com/gpu=0"}, nil, nil,
			"example.com/gpu=0, which nri-gpu injects as example.com/gpu=0 and another plugin asks"},
		{"the same, its owner named", "example.com/gpu=0,example.com/gpu=1", []string{"example.com/gpu=0"}, nil, owners,
			`and plugin "nvidia" asks`},
		{"the runtime injects it for nri-gpu too", "example.com/gpu=0", []string{"example.com/gpu=0"}, []string{"example.com/gpu=0"}, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := &api.ValidateContainerAdjustmentRequest{
				Container: &api.Container{Id: "ctr"},
				Adjust:    &api.ContainerAdjustment{},
				Owners:    tc.owners,
			}
			if tc.given != "" {
				req.Adjust.AddAnnotation(adjust.DevicesAnnotation, tc.given)
			}
			for _, n := range tc.asked {
				req.Adjust.AddCDIDevice(&api.CDIDevice{Name: n})
			}
			for _, n := range tc.runtime {
				req.Container.CDIDevices = append(req.Container.CDIDevices, &api.CDIDevice{Name: n})
			}
			err := adjust.InjectedTwice(snap, req)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if !errors.Is(err, adjust.ErrInjectedTwice) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want ErrInjectedTwice saying %q", err, tc.want)
			}
		})
	}
}
