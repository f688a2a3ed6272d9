package adjust_test

import (
	"testing"

	"github.com/containerd/nri/pkg/api"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/adjust"
)

const edgeSpec = `
cdiVersion: "1.1.0"
kind: example.com/edge
devices:
  - name: block-r
    containerEdits:
      deviceNodes: [{path: /dev/sdx, type: b, major: 8, minor: 16, permissions: r}]
  - name: char-r
    containerEdits:
      deviceNodes: [{path: /dev/ro, hostPath: /dev/null, permissions: r}]
  - name: fifo
    containerEdits:
      deviceNodes: [{path: /dev/fifo, hostPath: /nonexistent/fifo, type: p}]
  - name: numbers
    containerEdits:
      deviceNodes: [{path: /dev/numbered, hostPath: /dev/null, major: 240, minor: 7}]
  - name: typed-only
    containerEdits:
      deviceNodes: [{path: /dev/typed, hostPath: /nonexistent/typed, type: c}]
  - name: env
    containerEdits:
      env: [ONLY=env]
  - name: clos
    containerEdits:
      intelRdt: {closID: gold}
  - name: gids
    containerEdits:
      env: [GIDS=1]
      additionalGids: [0, 44]
`

// TestBuildEdges: device nodes and rules at the edges of CDI's rules
// (block devices, fifos, numbers from the spec or the host, permissions
// narrower than NRI's "rw" on each runtime), edits that need no Linux
// part, RDT with a CLOS only, and a group the process has or GID 0.
func TestBuildEdges(t *testing.T) {
	containerd17 := adjust.RuntimeOf("containerd", "1.7.35", "v0.8.0")
	containerd2 := adjust.RuntimeOf("containerd", "v2.3.7", "v0.12.5")
	blockRule := &api.LinuxDeviceCgroup{Allow: true, Type: "b", Major: api.Int64(8), Minor: api.Int64(16), Access: "r"}
	tests := []struct {
		name    string
		device  string
		opts    adjust.Options
		want    *api.ContainerAdjustment
		wantErr []string
	}{
		{
			name: "a block device read-only on 2.x: its rule, then a deny of what NRI's allows beyond it (rwm for block devices)", device: "example.com/edge=block-r",
			opts: adjust.Options{Runtime: containerd2},
			want: &api.ContainerAdjustment{Linux: &api.LinuxContainerAdjustment{
				Devices: []*api.LinuxDevice{{Path: "/dev/sdx", Type: "b", Major: 8, Minor: 16}},
				Resources: &api.LinuxResources{Devices: []*api.LinuxDeviceCgroup{
					blockRule, {Type: "b", Major: api.Int64(8), Minor: api.Int64(16), Access: "wm"}}},
			}},
		},
		{
			name: "a char device read-only on 2.x: the deny covers w only (NRI allows rw)", device: "example.com/edge=char-r",
			opts: adjust.Options{Runtime: containerd2},
			want: &api.ContainerAdjustment{Linux: &api.LinuxContainerAdjustment{
				Devices: []*api.LinuxDevice{charDev("/dev/ro", 1, 3)},
				Resources: &api.LinuxResources{Devices: []*api.LinuxDeviceCgroup{
					rule(1, 3, "r"), {Type: "c", Major: api.Int64(1), Minor: api.Int64(3), Access: "w"}}},
			}},
		},
		{
			name: "a device with the access NRI grants anyway, on 2.x: no deny rule", device: "example.com/edge=numbers",
			opts: adjust.Options{Runtime: containerd2},
			want: &api.ContainerAdjustment{Linux: &api.LinuxContainerAdjustment{
				Devices:   []*api.LinuxDevice{charDev("/dev/numbered", 240, 7)},
				Resources: &api.LinuxResources{Devices: []*api.LinuxDeviceCgroup{rule(240, 7, "rwm")}},
			}},
		},
		{
			name: "a read-only device on 1.7, which grants rw to every device NRI adds: refused", device: "example.com/edge=char-r",
			opts:    adjust.Options{Runtime: containerd17},
			wantErr: []string{`device node "/dev/ro" asks for cgroup permissions "r"`, "containerd 1.7.35"},
		},
		{
			name: "a fifo needs no host node and gets no cgroup rule", device: "example.com/edge=fifo",
			want: &api.ContainerAdjustment{Linux: &api.LinuxContainerAdjustment{
				Devices: []*api.LinuxDevice{{Path: "/dev/fifo", Type: "p"}},
			}},
		},
		{
			name: "numbers the spec gives win over the host node's, whose type is taken", device: "example.com/edge=numbers",
			want: &api.ContainerAdjustment{Linux: &api.LinuxContainerAdjustment{
				Devices:   []*api.LinuxDevice{charDev("/dev/numbered", 240, 7)},
				Resources: &api.LinuxResources{Devices: []*api.LinuxDeviceCgroup{rule(240, 7, "rwm")}},
			}},
		},
		{
			name: "a type without numbers needs the host node", device: "example.com/edge=typed-only",
			wantErr: []string{`failed to stat CDI host device "/nonexistent/typed"`},
		},
		{
			name: "env only: no Linux part at all", device: "example.com/edge=env",
			want: &api.ContainerAdjustment{Env: []*api.KeyValue{{Key: "ONLY", Value: "env"}}},
		},
		{
			name: "RDT with a CLOS only on 2.x: no schemata", device: "example.com/edge=clos",
			opts: adjust.Options{Runtime: containerd2},
			want: &api.ContainerAdjustment{Linux: &api.LinuxContainerAdjustment{Rdt: &api.LinuxRdt{ClosId: api.String("gold")}}},
		},
		{
			name: "additionalGids GID 0 and the process's own group: nothing to add", device: "example.com/edge=gids",
			opts: adjust.Options{Runtime: containerd17, UID: 1000, GID: 44},
			want: &api.ContainerAdjustment{Env: []*api.KeyValue{{Key: "GIDS", Value: "1"}}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res, err := build(t, map[string]string{"edge.yaml": edgeSpec}, tc.opts, tc.device)
			if tc.wantErr != nil {
				testutil.ErrorSays(t, err, tc.wantErr...)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, res.Adjustment, protocmp.Transform()); diff != "" {
				t.Errorf("adjustment (-want +got):\n%s", diff)
			}
		})
	}
}

// TestRuntimeString: the log line that says what the runtime applies.
func TestRuntimeString(t *testing.T) {
	for _, tc := range []struct {
		rt   adjust.Runtime
		want string
	}{
		{adjust.RuntimeOf("containerd", "v2.3.7", "v0.12.5"), "containerd v2.3.7 (NRI v0.12.5) applies cgroup rules, net devices, RDT"},
		{adjust.RuntimeOf("containerd", "1.7.35", "v0.8.0"), "containerd 1.7.35 (NRI v0.8.0) does not apply cgroup rules, net devices, RDT"},
		{adjust.RuntimeOf("cri-o", "1.34.0", "v0.10.0"), "cri-o 1.34.0 (NRI v0.10.0) applies cgroup rules; does not apply net devices, RDT"},
		{adjust.Runtime{Name: "x", CgroupRules: true}, "x applies cgroup rules; does not apply net devices, RDT"},
		{adjust.Runtime{}, "an unknown runtime does not apply cgroup rules, net devices, RDT"},
	} {
		if got := tc.rt.String(); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.rt, got, tc.want)
		}
	}
}
