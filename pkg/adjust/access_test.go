package adjust_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nri-gpu/nri-gpu/pkg/adjust"
)

// TestAccessOf: what a sandbox must reach for devices (nri-gpu access):
// the spec-level edits once however many of its devices are asked for,
// then each device's; a node's type and numbers from the spec, else the
// host's (a fifo has no numbers);
// "rwm" unless the spec narrows it; a mount read-only by its last ro/rw
// option; each additional group once, never root's.
func TestAccessOf(t *testing.T) {
	const spec = `
cdiVersion: "0.7.0"
kind: example.com/gpu
containerEdits:
  env: ["SHARED=1"]
  deviceNodes:
    - path: /dev/examplectl
      hostPath: /dev/zero
  mounts:
    - {hostPath: /usr/lib/libexample.so.1, containerPath: /usr/lib/libexample.so.1, options: [ro, nosuid, bind]}
    - {hostPath: /var/lib/example, containerPath: /var/lib/example, options: [ro, rw]}
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
        - {path: /dev/examplefifo, hostPath: /dev/null, type: p}
      mounts:
        - {hostPath: /opt/example/1, containerPath: /opt/example/1, options: [rw, ro]}
`
	devs, nodes := devices(t, map[string]string{"gpu.yaml": spec}, "example.com/gpu=0", "example.com/gpu=1")
	got := adjust.AccessOf(devs, nodes)
	want := &adjust.Access{
		Devices: []string{"example.com/gpu=0", "example.com/gpu=1"},
		DeviceNodes: []adjust.AccessNode{
			{Path: "/dev/examplectl", HostPath: "/dev/zero", Type: "c", Major: 1, Minor: 5, Permissions: "rwm"},
			{Path: "/dev/example0", HostPath: "/dev/null", Type: "c", Major: 1, Minor: 3, Permissions: "rwm"},
			{Path: "/dev/example1", HostPath: "/dev/full", Type: "c", Major: 240, Minor: 1, Permissions: "rw"},
			{Path: "/dev/examplefifo", HostPath: "/dev/null", Type: "p", Permissions: "rwm"},
		},
		Mounts: []adjust.AccessMount{
			{HostPath: "/usr/lib/libexample.so.1", ContainerPath: "/usr/lib/libexample.so.1", ReadOnly: true, Options: []string{"ro", "nosuid", "bind"}},
			{HostPath: "/var/lib/example", ContainerPath: "/var/lib/example", ReadOnly: false, Options: []string{"ro", "rw"}},
			{HostPath: "/opt/example/1", ContainerPath: "/opt/example/1", ReadOnly: true, Options: []string{"rw", "ro"}},
		},
		Hooks:          []adjust.AccessHook{{HookName: "createContainer", Path: "/usr/bin/example-hook", Args: []string{"example-hook", "update-ldcache"}}},
		AdditionalGIDs: []uint32{44, 107},
		Env:            []string{"SHARED=1", "EXAMPLE_VISIBLE=0", "EXAMPLE_VISIBLE=1"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("access (-want +got):\n%s", diff)
	}

	none := adjust.AccessOf(nil, nodes)
	if diff := cmp.Diff(&adjust.Access{Devices: []string{}, DeviceNodes: []adjust.AccessNode{}, Mounts: []adjust.AccessMount{}, Hooks: []adjust.AccessHook{}, AdditionalGIDs: []uint32{}, Env: []string{}}, none); diff != "" {
		t.Errorf("no devices: lists must be empty, not null, in JSON (-want +got):\n%s", diff)
	}
}
