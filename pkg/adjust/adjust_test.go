package adjust_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/adjust"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// devices writes the given specs into a temp dir, loads them as the
// plugin does, and resolves names.
func devices(t *testing.T, yamls map[string]string, names ...string) ([]*cdi.Device, map[string]specs.HostNode) {
	t.Helper()
	devs, snap := load(t, yamls, names...)
	return devs, snap.HostNodes
}

// load loads the specs and resolves the names in them.
func load(t *testing.T, yamls map[string]string, names ...string) ([]*cdi.Device, *specs.Snapshot) {
	t.Helper()
	dir := t.TempDir()
	for file, yaml := range yamls {
		if err := os.WriteFile(filepath.Join(dir, file), []byte(yaml), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	reg, err := specs.Open([]string{dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	snap := reg.Snapshot()
	if len(snap.Problems) > 0 {
		t.Fatalf("spec problems: %v", snap.Problems)
	}
	entries, err := snap.Resolve(names)
	if err != nil {
		t.Fatal(err)
	}
	var out []*cdi.Device
	for _, e := range entries {
		out = append(out, e.Device)
	}
	return out, snap
}

// build builds the adjustment for names of the given specs.
func build(t *testing.T, yamls map[string]string, opts adjust.Options, names ...string) (*adjust.Result, error) {
	t.Helper()
	devs, snap := load(t, yamls, names...)
	opts.SpecPath, opts.Sonames = snap.SpecPath, snap.Sonames
	return adjust.Build(devs, snap.HostNodes, opts)
}

// /dev/null (c 1:3, 0666, root) stands in for a host GPU node, so these
// tests need no root.
const gpuSpec = `
cdiVersion: "0.6.0"
kind: example.com/gpu
containerEdits:
  env: ["SHARED=1"]
  deviceNodes:
    - path: /dev/examplectl
      hostPath: /dev/zero
  mounts:
    - hostPath: /usr/lib/libexample.so.1
      containerPath: /usr/lib/libexample.so.1
      options: [ro, nosuid, nodev, bind]
  hooks:
    - hookName: createContainer
      path: /usr/bin/example-hook
      args: [example-hook, update-ldcache]
devices:
  - name: "0"
    containerEdits:
      env: ["EXAMPLE_VISIBLE=0"]
      deviceNodes:
        - path: /dev/example0
          hostPath: /dev/null
  - name: "1"
    containerEdits:
      env: ["EXAMPLE_VISIBLE=1"]
      deviceNodes:
        - path: /dev/example1
          hostPath: /dev/full
`

func charDev(path string, major, minor int64) *api.LinuxDevice {
	return &api.LinuxDevice{
		Path: path, Type: "c", Major: major, Minor: minor,
		FileMode: api.FileMode(fileMode(0o666)),
	}
}

func fileMode(m os.FileMode) *os.FileMode { return &m }

func rule(major, minor int64, access string) *api.LinuxDeviceCgroup {
	return &api.LinuxDeviceCgroup{Allow: true, Type: "c", Major: api.Int64(major), Minor: api.Int64(minor), Access: access}
}

func TestBuild(t *testing.T) {
	ctlMount := &api.Mount{
		Source: "/usr/lib/libexample.so.1", Destination: "/usr/lib/libexample.so.1",
		Options: []string{"ro", "nosuid", "nodev", "bind"},
	}
	// A hook whose spec gives no environment gets the minimal one, never
	// an inherited one.
	env := []string{specs.HookEnv}
	ldcache := &api.Hook{Path: "/usr/bin/example-hook", Args: []string{"example-hook", "update-ldcache"}, Env: env}

	tests := []struct {
		name  string
		specs map[string]string
		names []string
		want  *api.ContainerAdjustment
	}{
		{
			name:  "one device: spec-level and device edits, nodes from the host",
			specs: map[string]string{"gpu.yaml": gpuSpec},
			names: []string{"example.com/gpu=0"},
			want: &api.ContainerAdjustment{
				Env:    []*api.KeyValue{{Key: "SHARED", Value: "1"}, {Key: "EXAMPLE_VISIBLE", Value: "0"}},
				Mounts: []*api.Mount{ctlMount},
				Hooks:  &api.Hooks{CreateContainer: []*api.Hook{ldcache}},
				Linux: &api.LinuxContainerAdjustment{
					Devices:   []*api.LinuxDevice{charDev("/dev/examplectl", 1, 5), charDev("/dev/example0", 1, 3)},
					Resources: &api.LinuxResources{Devices: []*api.LinuxDeviceCgroup{rule(1, 5, "rwm"), rule(1, 3, "rwm")}},
				},
			},
		},
		{
			name:  "two devices of one spec: spec-level edits once, later env wins",
			specs: map[string]string{"gpu.yaml": gpuSpec},
			names: []string{"example.com/gpu=0", "example.com/gpu=1"},
			want: &api.ContainerAdjustment{
				Env:    []*api.KeyValue{{Key: "SHARED", Value: "1"}, {Key: "EXAMPLE_VISIBLE", Value: "1"}},
				Mounts: []*api.Mount{ctlMount},
				Hooks:  &api.Hooks{CreateContainer: []*api.Hook{ldcache}},
				Linux: &api.LinuxContainerAdjustment{
					Devices: []*api.LinuxDevice{charDev("/dev/examplectl", 1, 5), charDev("/dev/example0", 1, 3), charDev("/dev/example1", 1, 7)},
					Resources: &api.LinuxResources{Devices: []*api.LinuxDeviceCgroup{
						rule(1, 5, "rwm"), rule(1, 3, "rwm"), rule(1, 7, "rwm")}},
				},
			},
		},
		{
			name: "every hook point kept apart, a spec's hook env kept, spec owner and mode honoured, permissions passed on",
			specs: map[string]string{"hooks.yaml": `
cdiVersion: "0.6.0"
kind: example.com/hooks
devices:
  - name: h
    containerEdits:
      deviceNodes:
        - path: /dev/owned
          hostPath: /dev/null
          uid: 1000
          gid: 44
          fileMode: 0600
          permissions: rw
      hooks:
        - {hookName: prestart, path: /bin/p, args: [p], env: ["A=1"], timeout: 5}
        - {hookName: createRuntime, path: /bin/cr}
        - {hookName: createContainer, path: /bin/cc}
        - {hookName: startContainer, path: /bin/sc}
        - {hookName: poststart, path: /bin/ps}
        - {hookName: poststop, path: /bin/pt}
`},
			names: []string{"example.com/hooks=h"},
			want: &api.ContainerAdjustment{
				Hooks: &api.Hooks{
					Prestart:        []*api.Hook{{Path: "/bin/p", Args: []string{"p"}, Env: []string{"A=1"}, Timeout: api.Int(5)}},
					CreateRuntime:   []*api.Hook{{Path: "/bin/cr", Env: env}},
					CreateContainer: []*api.Hook{{Path: "/bin/cc", Env: env}},
					StartContainer:  []*api.Hook{{Path: "/bin/sc", Env: env}},
					Poststart:       []*api.Hook{{Path: "/bin/ps", Env: env}},
					Poststop:        []*api.Hook{{Path: "/bin/pt", Env: env}},
				},
				Linux: &api.LinuxContainerAdjustment{
					Devices: []*api.LinuxDevice{{
						Path: "/dev/owned", Type: "c", Major: 1, Minor: 3,
						FileMode: api.FileMode(fileMode(0o600)), Uid: api.UInt32(uint32(1000)), Gid: api.UInt32(uint32(44)),
					}},
					Resources: &api.LinuxResources{Devices: []*api.LinuxDeviceCgroup{rule(1, 3, "rw")}},
				},
			},
		},
		{
			name: "devices of two specs, each spec's edits once; a later mount for a path replaces an earlier one",
			specs: map[string]string{
				"gpu.yaml": gpuSpec,
				"other.yaml": `
cdiVersion: "0.6.0"
kind: example.com/nic
containerEdits:
  mounts:
    - {hostPath: /opt/other, containerPath: /usr/lib/libexample.so.1, options: [ro, bind]}
devices:
  - name: x
    containerEdits:
      env: ["NIC=x"]
`},
			names: []string{"example.com/gpu=0", "example.com/nic=x"},
			want: &api.ContainerAdjustment{
				Env:    []*api.KeyValue{{Key: "SHARED", Value: "1"}, {Key: "EXAMPLE_VISIBLE", Value: "0"}, {Key: "NIC", Value: "x"}},
				Mounts: []*api.Mount{{Source: "/opt/other", Destination: "/usr/lib/libexample.so.1", Options: []string{"ro", "bind"}}},
				Hooks:  &api.Hooks{CreateContainer: []*api.Hook{ldcache}},
				Linux: &api.LinuxContainerAdjustment{
					Devices:   []*api.LinuxDevice{charDev("/dev/examplectl", 1, 5), charDev("/dev/example0", 1, 3)},
					Resources: &api.LinuxResources{Devices: []*api.LinuxDeviceCgroup{rule(1, 5, "rwm"), rule(1, 3, "rwm")}},
				},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res, err := build(t, tc.specs, adjust.Options{}, tc.names...)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, res.Adjustment, protocmp.Transform()); diff != "" {
				t.Errorf("adjustment (-want +got):\n%s", diff)
			}
			if len(res.Skipped) != 0 {
				t.Errorf("skipped %v, want nothing", res.Skipped)
			}
		})
	}
}

func TestBuildNonRootUserOwnsUnownedNodes(t *testing.T) {
	res, err := build(t, map[string]string{"gpu.yaml": gpuSpec}, adjust.Options{UID: 1000, GID: 1001}, "example.com/gpu=0")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range res.Adjustment.GetLinux().GetDevices() {
		if d.GetUid().GetValue() != 1000 || d.GetGid().GetValue() != 1001 {
			t.Errorf("device %s owned by %v:%v, want 1000:1001 as CDI does for a non-root process",
				d.Path, d.GetUid(), d.GetGid())
		}
	}
}

const unsupportedSpec = `
cdiVersion: "1.1.0"
kind: example.com/odd
containerEdits:
  additionalGids: [44]
devices:
  - name: rdt
    containerEdits:
      env: ["ODD=rdt"]
      intelRdt:
        closID: gold
  - name: net
    containerEdits:
      env: ["ODD=net"]
      netDevices:
        - {hostInterfaceName: eth9, name: net0}
  - name: readonly
    containerEdits:
      deviceNodes:
        - path: /dev/ro
          hostPath: /dev/null
          permissions: r
`

func TestBuildUnsupportedEdits(t *testing.T) {
	containerd17 := adjust.RuntimeOf("containerd", "1.7.35", "v0.8.0")
	containerd2 := adjust.RuntimeOf("containerd", "v2.3.7", "v0.12.5")
	user := adjust.Options{UID: 1000, GID: 1000}
	tests := []struct {
		name         string
		device       string
		opts         adjust.Options
		wantErrs     []string
		wantSkips    []adjust.Skipped
		wantUnneeded []adjust.Skipped
		wantEnvKey   string
	}{
		{
			name:   "1.7: intelRdt fails by default, naming device, edit, runtime and setting",
			device: "example.com/odd=rdt",
			opts:   adjust.Options{Runtime: containerd17},
			wantErrs: []string{
				`device "example.com/odd=rdt": CDI edit not expressible through NRI: containerd 1.7.35 cannot apply intelRdt`,
				"unsupportedEdits: warn",
			},
		},
		{
			name:     "1.7: additionalGids for a process without the group fail by default",
			device:   "example.com/odd=rdt",
			opts:     adjust.Options{Runtime: containerd17, UID: 1000, GID: 1000},
			wantErrs: []string{`device "example.com/odd=rdt" (spec-level edits of `, "cannot apply additionalGids"},
		},
		{
			name:         "1.7: additionalGids for a root process change nothing: left out, reported",
			device:       "example.com/odd=net",
			opts:         adjust.Options{Runtime: containerd17, SkipUnsupported: true},
			wantSkips:    []adjust.Skipped{{Device: "example.com/odd=net", Edit: "netDevices"}},
			wantUnneeded: []adjust.Skipped{{Device: "example.com/odd=net", Edit: "additionalGids", Spec: "odd.yaml"}},
			wantEnvKey:   "ODD",
		},
		{
			name:         "1.7: additionalGids the process has already change nothing",
			device:       "example.com/odd=net",
			opts:         adjust.Options{Runtime: containerd17, SkipUnsupported: true, UID: 1000, GID: 1000, AdditionalGIDs: []uint32{44}},
			wantSkips:    []adjust.Skipped{{Device: "example.com/odd=net", Edit: "netDevices"}},
			wantUnneeded: []adjust.Skipped{{Device: "example.com/odd=net", Edit: "additionalGids", Spec: "odd.yaml"}},
			wantEnvKey:   "ODD",
		},
		{
			name:     "1.7: netDevices fail by default",
			device:   "example.com/odd=net",
			opts:     adjust.Options{Runtime: containerd17},
			wantErrs: []string{`device "example.com/odd=net": CDI edit not expressible through NRI: containerd 1.7.35 cannot apply netDevices`},
		},
		{
			name:   "1.7: warn skips them and reports each",
			device: "example.com/odd=net",
			opts:   adjust.Options{Runtime: containerd17, SkipUnsupported: true, UID: user.UID, GID: user.GID},
			wantSkips: []adjust.Skipped{
				{Device: "example.com/odd=net", Edit: "additionalGids", Spec: "odd.yaml"},
				{Device: "example.com/odd=net", Edit: "netDevices"},
			},
			wantEnvKey: "ODD",
		},
		{
			name:     "1.7: permissions narrower than rw fail even with warn",
			device:   "example.com/odd=readonly",
			opts:     adjust.Options{Runtime: containerd17, SkipUnsupported: true},
			wantErrs: []string{`device node "/dev/ro" asks for cgroup permissions "r", but containerd 1.7.35 grants "rw"`},
		},
		{
			name:         "2.x: net devices are applied",
			device:       "example.com/odd=net",
			opts:         adjust.Options{Runtime: containerd2},
			wantEnvKey:   "ODD",
			wantUnneeded: []adjust.Skipped{{Device: "example.com/odd=net", Edit: "additionalGids", Spec: "odd.yaml"}},
		},
		{
			name:         "2.x: RDT is applied",
			device:       "example.com/odd=rdt",
			opts:         adjust.Options{Runtime: containerd2},
			wantEnvKey:   "ODD",
			wantUnneeded: []adjust.Skipped{{Device: "example.com/odd=rdt", Edit: "additionalGids", Spec: "odd.yaml"}},
		},
		{
			name:     "2.x: additionalGids a non-root process lacks still fail by default",
			device:   "example.com/odd=rdt",
			opts:     adjust.Options{Runtime: containerd2, UID: 1000, GID: 1000},
			wantErrs: []string{"containerd v2.3.7 cannot apply additionalGids"},
		},
		{
			name:         "2.x: narrower permissions are applied",
			device:       "example.com/odd=readonly",
			opts:         adjust.Options{Runtime: containerd2},
			wantUnneeded: []adjust.Skipped{{Device: "example.com/odd=readonly", Edit: "additionalGids", Spec: "odd.yaml"}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res, err := build(t, map[string]string{"odd.yaml": unsupportedSpec}, tc.opts, tc.device)
			if len(tc.wantErrs) > 0 {
				testutil.ErrorSays(t, err, tc.wantErrs...)
				if !errors.Is(err, adjust.ErrUnsupportedEdit) {
					t.Errorf("error %v does not wrap ErrUnsupportedEdit", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, list := range [][]adjust.Skipped{res.Skipped, res.Unneeded} {
				for i, s := range list {
					if s.Spec != "" {
						list[i].Spec = filepath.Base(s.Spec)
					}
				}
			}
			if diff := cmp.Diff(tc.wantSkips, res.Skipped); diff != "" {
				t.Errorf("skipped (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantUnneeded, res.Unneeded); diff != "" {
				t.Errorf("left out as unneeded (-want +got):\n%s", diff)
			}
			if env := res.Adjustment.GetEnv(); tc.wantEnvKey != "" && (len(env) != 1 || env[0].Key != tc.wantEnvKey) {
				t.Errorf("env %v, want the supported edits kept", env)
			}
		})
	}
}

// TestRuntimeOf: what a runtime applies follows the NRI version it runs,
// as NRI's own map of containerd's and CRI-O's releases infers it: cgroup
// rules from v0.10.0 (NRI's generator applies none before), net devices
// and RDT from v0.11.0; none where the version is not known.
func TestRuntimeOf(t *testing.T) {
	tests := []struct {
		name, version, nri   string
		cgroups, netDev, rdt bool
	}{
		{"containerd", "1.7.35", "v0.8.0", false, false, false},
		{"containerd", "v2.1.5", "v0.8.0", false, false, false},
		{"containerd", "v2.2.0", "v0.10.0", true, false, false},
		{"containerd", "v2.3.7", "v0.12.5", true, true, true},
		{"cri-o", "1.31.0", "v0.6.1", false, false, false},
		{"cri-o", "1.32.0", "v0.9.0", false, false, false},
		{"cri-o", "1.33.3", "v0.9.1-0.20250219030224-e597e7849f24", false, false, false},
		{"cri-o", "1.35.0", "v0.10.0", true, false, false},
		{"other", "v9.0.0", "v0.11.0", true, true, true},
		{"containerd", "v2.3.7", "unknown", false, false, false},
		{"containerd", "v2.3.7", "", false, false, false},
	}
	for _, tc := range tests {
		rt := adjust.RuntimeOf(tc.name, tc.version, tc.nri)
		if rt.CgroupRules != tc.cgroups || rt.NetDevices != tc.netDev || rt.RDT != tc.rdt {
			t.Errorf("RuntimeOf(%q, %q, %q) = %+v, want cgroup rules %v, net devices %v, RDT %v", tc.name, tc.version, tc.nri, rt, tc.cgroups, tc.netDev, tc.rdt)
		}
	}
}

// TestInferNRI: the NRI version of a runtime's release that does not
// report it is NRI's map's, but where a release's own go.mod was read
// to say otherwise: CRI-O 1.34 (its v1.34.0 requires NRI
// v0.9.1-0.20250219030224-e597e7849f24, which applies no cgroup rule;
// the map says v0.10.0), so that nri-gpu refuses what needs a cgroup
// rule there instead of letting the device's access widen.
func TestInferNRI(t *testing.T) {
	for _, tc := range []struct {
		name, version, want string
		cgroups             bool
	}{
		{"cri-o", "1.34.0", "v0.9.1-0.20250219030224-e597e7849f24", false},
		{"cri-o", "v1.34.4", "v0.9.1-0.20250219030224-e597e7849f24", false},
		{"cri-o", "1.35.0", "v0.11.0", true},
		{"cri-o", "1.33.2", "v0.9.1-0.20250219030224-e597e7849f24", false},
		{"containerd", "2.3.7", "v0.11.0", true}, // containerd reports its own (v0.12.0)
		{"containerd", "1.7.25", "v0.6.1", false},
		{"containerd", "v2.2.0", "v0.10.0", true},
	} {
		got, err := adjust.InferNRI(tc.name, tc.version)
		if tc.want == "" {
			if err == nil {
				t.Errorf("InferNRI(%q, %q) = %q, want no inference", tc.name, tc.version, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("InferNRI(%q, %q) = %q, %v; want %q", tc.name, tc.version, got, err, tc.want)
		}
		if rt := adjust.RuntimeOf(tc.name, tc.version, got); rt.CgroupRules != tc.cgroups {
			t.Errorf("%s %s (NRI %s): cgroup rules %v, want %v", tc.name, tc.version, got, rt.CgroupRules, tc.cgroups)
		}
	}
}

func TestBuildDoesNotModifyCachedSpecs(t *testing.T) {
	devs, nodes := devices(t, map[string]string{"odd.yaml": unsupportedSpec}, "example.com/odd=net")
	if _, err := adjust.Build(devs, nodes, adjust.Options{SkipUnsupported: true}); err != nil {
		t.Fatal(err)
	}
	if len(devs[0].ContainerEdits.NetDevices) != 1 || len(devs[0].GetSpec().ContainerEdits.AdditionalGIDs) != 1 {
		t.Error("skipping edits changed the cached spec")
	}
}

func TestBuildMissingHostNode(t *testing.T) {
	_, err := build(t, map[string]string{"gone.yaml": `
cdiVersion: "0.6.0"
kind: example.com/gone
devices:
  - name: "0"
    containerEdits:
      deviceNodes:
        - path: /dev/gone0
          hostPath: /nonexistent/gone0
`}, adjust.Options{}, "example.com/gone=0")
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/gone0") || !strings.Contains(err.Error(), "example.com/gone=0") {
		t.Errorf("error %v, want one naming the device and the missing host node", err)
	}
}

// TestBuildUserNS: in a user namespace the runtime cannot create device
// nodes (runc bind-mounts each from the host path equal to its container
// path): a node whose hostPath differs from its path is given as a bind
// mount of its hostPath at its path, with its cgroup rule, where the
// runtime applies cgroup rules from NRI, and refused where it does not;
// a node whose hostPath is its path stays a device node.
func TestBuildUserNS(t *testing.T) {
	spec := map[string]string{"gpu.yaml": gpuSpec, "same.yaml": `
cdiVersion: "0.6.0"
kind: example.com/same
devices:
  - name: "0"
    containerEdits:
      deviceNodes:
        - path: /dev/null
`, "file.yaml": `
cdiVersion: "0.6.0"
kind: example.com/file
devices:
  - name: "0"
    containerEdits:
      deviceNodes:
        - {path: /dev/file0, hostPath: /etc/hostname, type: c, major: 1, minor: 3}
`}
	v2, v17 := adjust.RuntimeOf("containerd", "v2.3.7", "v0.12.5"), adjust.RuntimeOf("containerd", "1.7.35", "v0.8.0")
	for _, tc := range []struct {
		name    string
		opts    adjust.Options
		names   []string
		devices []*api.LinuxDevice
		mounts  []string
		rules   []*api.LinuxDeviceCgroup
		wantErr string
	}{
		{name: "no user namespace", opts: adjust.Options{Runtime: v2},
			devices: []*api.LinuxDevice{charDev("/dev/examplectl", 1, 5), charDev("/dev/example0", 1, 3), charDev("/dev/null", 1, 3)},
			mounts:  []string{"/usr/lib/libexample.so.1:/usr/lib/libexample.so.1"},
			rules:   []*api.LinuxDeviceCgroup{rule(1, 5, "rwm"), rule(1, 3, "rwm"), rule(1, 3, "rwm")}},
		{name: "user namespace, containerd 2.x", opts: adjust.Options{Runtime: v2, UserNS: true},
			devices: []*api.LinuxDevice{charDev("/dev/null", 1, 3)},
			mounts:  []string{"/dev/null:/dev/example0", "/dev/zero:/dev/examplectl", "/usr/lib/libexample.so.1:/usr/lib/libexample.so.1"},
			rules:   []*api.LinuxDeviceCgroup{rule(1, 5, "rwm"), rule(1, 3, "rwm"), rule(1, 3, "rwm")}},
		{name: "user namespace, a host node that is no device node", opts: adjust.Options{Runtime: v2, UserNS: true}, names: []string{"example.com/file=0"},
			wantErr: `device node "/dev/file0": its host node "/etc/hostname" is not a c device node (not a device node), which a user-namespaced container is given by a bind mount of it`},
		{name: "user namespace, containerd 1.7", opts: adjust.Options{Runtime: v17, UserNS: true},
			wantErr: `device node not expressible in a user namespace: device node "/dev/examplectl" (host "/dev/zero"): in a user namespace the runtime cannot create it, and a bind mount of it needs a cgroup rule, which containerd 1.7.35 does not apply from NRI`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			names := tc.names
			if names == nil {
				names = []string{"example.com/gpu=0", "example.com/same=0"}
			}
			res, err := build(t, spec, tc.opts, names...)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			adj := res.Adjustment
			var devs []string
			for _, d := range adj.GetLinux().GetDevices() {
				devs = append(devs, d.Path)
			}
			var want []string
			for _, d := range tc.devices {
				want = append(want, d.Path)
			}
			if !slices.Equal(devs, want) {
				t.Errorf("device nodes %v, want %v", devs, want)
			}
			var mounts []string
			for _, m := range adj.GetMounts() {
				mounts = append(mounts, m.Source+":"+m.Destination)
			}
			slices.Sort(mounts)
			if !slices.Equal(mounts, tc.mounts) {
				t.Errorf("mounts %v, want %v", mounts, tc.mounts)
			}
			var rules []string
			for _, r := range adj.GetLinux().GetResources().GetDevices() {
				rules = append(rules, fmt.Sprintf("%v %s %d:%d %s", r.Allow, r.Type, r.Major.GetValue(), r.Minor.GetValue(), r.Access))
			}
			var wantRules []string
			for _, r := range tc.rules {
				wantRules = append(wantRules, fmt.Sprintf("%v %s %d:%d %s", r.Allow, r.Type, r.Major.GetValue(), r.Minor.GetValue(), r.Access))
			}
			if !slices.Equal(rules, wantRules) {
				t.Errorf("cgroup rules %v, want %v", rules, wantRules)
			}
		})
	}
}
