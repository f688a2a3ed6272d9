package adjust_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nri-gpu/nri-gpu/pkg/adjust"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// givenSpec has spec-level and device edits of every kind a record
// lists.
const givenSpec = `
cdiVersion: "0.7.0"
kind: example.com/gpu
containerEdits:
  env: ["SHARED=1"]
  deviceNodes:
    - path: /dev/examplectl
      hostPath: /dev/zero
  mounts:
    - {hostPath: /usr/lib/libexample.so.1, containerPath: /usr/lib/libexample.so.1, options: [ro, nosuid, bind]}
  hooks:
    - {hookName: createContainer, path: /usr/bin/example-hook, args: [example-hook, update-ldcache]}
  additionalGids: [0, 44]
devices:
  - name: "0"
    containerEdits:
      env: ["EXAMPLE_VISIBLE=0"]
      deviceNodes:
        - {path: /dev/example0, hostPath: /dev/null}
      additionalGids: [44, 107]
  - name: "1"
    containerEdits:
      env: ["EXAMPLE_VISIBLE=1"]
      deviceNodes:
        - {path: /dev/example1, hostPath: /dev/full, major: 240, minor: 1, permissions: rw}
        - {path: /dev/null, permissions: rw}
`

func u32(v uint32) *uint32 { return &v }

// TestGiven: Result.Given is what the adjustment gives the container, as
// CDI edits: each device node once, with its type and numbers (the
// spec's, else the host's), its mode and owner as given (the process's
// user where the spec gives none), its permissions; in a user namespace
// a node whose hostPath differs from its path is listed as a node with
// its hostPath (not as a mount) and the host node's mode; mounts,
// environment (one value per key) and hooks as applied (a hook with
// specs.HookEnv); the
// additional groups the devices need that the process has (root, or its
// own), and none it lacks (left out with unsupportedEdits: warn).
func TestGiven(t *testing.T) {
	v2 := adjust.RuntimeOf("containerd", "v2.3.7")
	hook := &cdispec.Hook{HookName: "createContainer", Path: "/usr/bin/example-hook", Args: []string{"example-hook", "update-ldcache"}, Env: []string{specs.HookEnv}}
	lib := &cdispec.Mount{HostPath: "/usr/lib/libexample.so.1", ContainerPath: "/usr/lib/libexample.so.1", Options: []string{"ro", "nosuid", "bind"}}
	env := []string{"SHARED=1", "EXAMPLE_VISIBLE=1"} // the later device's value, as CDI applies it
	for _, tc := range []struct {
		name string
		opts adjust.Options
		want cdispec.ContainerEdits
	}{
		{name: "root", opts: adjust.Options{Runtime: v2}, want: cdispec.ContainerEdits{
			Env: env,
			DeviceNodes: []*cdispec.DeviceNode{
				{Path: "/dev/examplectl", Type: "c", Major: 1, Minor: 5, FileMode: fileMode(0o666)},
				{Path: "/dev/example0", Type: "c", Major: 1, Minor: 3, FileMode: fileMode(0o666)},
				{Path: "/dev/example1", Type: "c", Major: 240, Minor: 1, FileMode: fileMode(0o666), Permissions: "rw"},
				{Path: "/dev/null", Type: "c", Major: 1, Minor: 3, FileMode: fileMode(0o666), Permissions: "rw"},
			},
			Mounts: []*cdispec.Mount{lib}, Hooks: []*cdispec.Hook{hook}, AdditionalGIDs: []uint32{44, 107},
		}},
		{name: "user 1000 in group 44, lacking 107", opts: adjust.Options{Runtime: v2, UID: 1000, GID: 44, SkipUnsupported: true}, want: cdispec.ContainerEdits{
			Env: env,
			DeviceNodes: []*cdispec.DeviceNode{
				{Path: "/dev/examplectl", Type: "c", Major: 1, Minor: 5, FileMode: fileMode(0o666), UID: u32(1000), GID: u32(44)},
				{Path: "/dev/example0", Type: "c", Major: 1, Minor: 3, FileMode: fileMode(0o666), UID: u32(1000), GID: u32(44)},
				{Path: "/dev/example1", Type: "c", Major: 240, Minor: 1, FileMode: fileMode(0o666), Permissions: "rw", UID: u32(1000), GID: u32(44)},
				{Path: "/dev/null", Type: "c", Major: 1, Minor: 3, FileMode: fileMode(0o666), Permissions: "rw", UID: u32(1000), GID: u32(44)},
			},
			Mounts: []*cdispec.Mount{lib}, Hooks: []*cdispec.Hook{hook}, AdditionalGIDs: []uint32{44},
		}},
		{name: "user namespace", opts: adjust.Options{Runtime: v2, UserNS: true}, want: cdispec.ContainerEdits{
			Env: env,
			DeviceNodes: []*cdispec.DeviceNode{
				{Path: "/dev/examplectl", HostPath: "/dev/zero", Type: "c", Major: 1, Minor: 5, FileMode: fileMode(0o666)},
				{Path: "/dev/example0", HostPath: "/dev/null", Type: "c", Major: 1, Minor: 3, FileMode: fileMode(0o666)},
				{Path: "/dev/example1", HostPath: "/dev/full", Type: "c", Major: 240, Minor: 1, FileMode: fileMode(0o666), Permissions: "rw"},
				{Path: "/dev/null", Type: "c", Major: 1, Minor: 3, FileMode: fileMode(0o666), Permissions: "rw"},
			},
			Mounts: []*cdispec.Mount{lib}, Hooks: []*cdispec.Hook{hook}, AdditionalGIDs: []uint32{44, 107},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := build(t, map[string]string{"gpu.yaml": givenSpec}, tc.opts, "example.com/gpu=0", "example.com/gpu=1")
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(&tc.want, res.Given); diff != "" {
				t.Errorf("given (-want +got):\n%s", diff)
			}
		})
	}
}
