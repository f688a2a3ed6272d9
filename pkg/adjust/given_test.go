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
	"golang.org/x/sys/unix"
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
	v2 := adjust.RuntimeOf("containerd", "v2.3.7", "v0.12.5")
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

// TestGivenByRuntime: devices the runtime's own CDI injected are not
// injected again, and the record lists what they gave. In a user
// namespace, a node of theirs whose hostPath differs from its path, where
// the host has no such node at the path (runc would bind it from there),
// is refused saying what to do; one whose path on the host is that very
// node (as /dev/null is) is not.
func TestGivenByRuntime(t *testing.T) {
	const spec = `
cdiVersion: "0.6.0"
kind: example.com/rt
devices:
  - name: moved
    containerEdits:
      env: [RT=moved]
      deviceNodes: [{path: /dev/example-moved, hostPath: /dev/null}]
  - name: same
    containerEdits:
      env: [RT=same]
      deviceNodes: [{path: /dev/null, hostPath: /dev/null}]
  - name: alias
    containerEdits:
      deviceNodes: [{path: /dev/zero, hostPath: /dev/zero}]
`
	v2 := adjust.RuntimeOf("containerd", "v2.3.7", "v0.12.5")
	for _, tc := range []struct {
		name, injected string
		userNS         bool
		wantErr        string
	}{
		{name: "moved node, no user namespace", injected: "example.com/rt=moved"},
		{name: "moved node, user namespace", injected: "example.com/rt=moved", userNS: true,
			wantErr: `device node "/dev/example-moved" (host "/dev/null"), which the runtime's own CDI injects`},
		{name: "node at its own path, user namespace", injected: "example.com/rt=same", userNS: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			devs, snap := load(t, map[string]string{"rt.yaml": spec}, "example.com/rt=alias", tc.injected)
			res, err := adjust.Build(devs[:1], snap.HostNodes, adjust.Options{Runtime: v2, UserNS: tc.userNS, Injected: devs[1:]})
			if tc.wantErr != "" {
				if !errors.Is(err, adjust.ErrUserNS) || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "enable_cdi = false") {
					t.Fatalf("error %v, want %q saying what to do", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var nodes []string
			for _, n := range res.Given.DeviceNodes {
				nodes = append(nodes, n.Path)
			}
			injected := devs[1].ContainerEdits.DeviceNodes[0].Path
			if !slices.Equal(nodes, []string{"/dev/zero", injected}) {
				t.Errorf("record's nodes %v, want nri-gpu's /dev/zero, then the runtime's %s", nodes, injected)
			}
			if len(res.Given.Env) != 1 || !strings.HasPrefix(res.Given.Env[0], "RT=") {
				t.Errorf("record's env %v, want the runtime's device's", res.Given.Env)
			}
			for _, d := range res.Adjustment.GetLinux().GetDevices() {
				if d.Path == injected {
					t.Errorf("the runtime's node %s injected again", injected)
				}
			}
		})
	}
}

// TestBuildUserNSRestricted: in a user namespace a node whose host node
// gives others no read-write access (0660, for its group) is bound
// read-only and idmapped, even where its hostPath is its path (runc's own
// bind would show its group as nobody); a node open to all (/dev/null,
// 0666) at its own path is left to runc.
func TestBuildUserNSRestricted(t *testing.T) {
	node := mknod(t, filepath.Join(t.TempDir(), "nvmap"), 0o660, 0)
	spec := fmt.Sprintf(`
cdiVersion: "0.6.0"
kind: example.com/jetson
devices:
  - name: "0"
    containerEdits:
      deviceNodes: [{path: %s}, {path: /dev/null}]
`, node)
	res, err := build(t, map[string]string{"j.yaml": spec}, adjust.Options{Runtime: adjust.RuntimeOf("containerd", "v2.3.7", "v0.12.5"), UserNS: true}, "example.com/jetson=0")
	if err != nil {
		t.Fatal(err)
	}
	var devs []string
	for _, d := range res.Adjustment.GetLinux().GetDevices() {
		devs = append(devs, d.Path)
	}
	if !slices.Equal(devs, []string{"/dev/null"}) {
		t.Errorf("device nodes %v, want /dev/null alone", devs)
	}
	var binds []string
	for _, m := range res.Adjustment.GetMounts() {
		binds = append(binds, m.Source+":"+m.Destination+":"+strings.Join(m.Options, ","))
	}
	if want := []string{node + ":" + node + ":bind,ro,idmap"}; !slices.Equal(binds, want) {
		t.Errorf("mounts %v, want %v", binds, want)
	}
}

// TestBuildUserNSOnce: in a user namespace a moved node that two devices
// of a request name is bound once, and listed once in the record, as a
// device node is given once; a node of another path from the same host
// node is bound at its own path.
func TestBuildUserNSOnce(t *testing.T) {
	const spec = `
cdiVersion: "0.6.0"
kind: example.com/twice
devices:
  - name: "0"
    containerEdits:
      deviceNodes: [{path: /dev/example0, hostPath: /dev/null}]
  - name: all
    containerEdits:
      deviceNodes: [{path: /dev/example0, hostPath: /dev/null}, {path: /dev/example-alias, hostPath: /dev/null}]
`
	res, err := build(t, map[string]string{"twice.yaml": spec}, adjust.Options{Runtime: adjust.RuntimeOf("containerd", "v2.3.7", "v0.12.5"), UserNS: true},
		"example.com/twice=0", "example.com/twice=all")
	if err != nil {
		t.Fatal(err)
	}
	var binds []string
	for _, m := range res.Adjustment.GetMounts() {
		binds = append(binds, m.Source+":"+m.Destination)
	}
	if want := []string{"/dev/null:/dev/example0", "/dev/null:/dev/example-alias"}; !slices.Equal(binds, want) {
		t.Errorf("binds %v, want %v", binds, want)
	}
	var nodes []string
	for _, n := range res.Given.DeviceNodes {
		nodes = append(nodes, n.Path)
	}
	if want := []string{"/dev/example0", "/dev/example-alias"}; !slices.Equal(nodes, want) || len(res.Given.Mounts) != 0 {
		t.Errorf("record: nodes %v, mounts %v; want %v and no mount", nodes, res.Given.Mounts, want)
	}
}

// TestBuildUserUnknownKeepsTheGroup: where the runtime reports no process
// user (containerd 1.7), a node for a group (host mode gives the group
// access others lack) that the spec's additionalGids name keeps its host
// node's group, so that a process of that group can use it; a node open
// to all, one of root's group or of a group the spec does not name, one
// whose spec names a group, and any node of a known user are as CDI
// makes them.
func TestBuildUserUnknownKeepsTheGroup(t *testing.T) {
	dir := t.TempDir()
	group := mknod(t, filepath.Join(dir, "group"), 0o660, 44)
	readers := mknod(t, filepath.Join(dir, "readers"), 0o640, 45)
	open := mknod(t, filepath.Join(dir, "open"), 0o666, 44)
	root := mknod(t, filepath.Join(dir, "root"), 0o660, 0)
	named := mknod(t, filepath.Join(dir, "named"), 0o660, 44)
	writers := mknod(t, filepath.Join(dir, "writers"), 0o620, 5) // as a tty's
	exec := mknod(t, filepath.Join(dir, "exec"), 0o610, 44)      // no access: a device is not run
	other := mknod(t, filepath.Join(dir, "other"), 0o660, 46)    // not in additionalGids
	spec := fmt.Sprintf(`
cdiVersion: "0.7.0"
kind: example.com/jetson
devices:
  - name: "0"
    containerEdits:
      deviceNodes: [{path: /dev/group, hostPath: %s}, {path: /dev/readers, hostPath: %s}, {path: /dev/open, hostPath: %s}, {path: /dev/root, hostPath: %s}, {path: /dev/named, hostPath: %s, gid: 7}, {path: /dev/writers, hostPath: %s}, {path: /dev/exec, hostPath: %s}, {path: /dev/other, hostPath: %s}]
      additionalGids: [44, 45, 5]
`, group, readers, open, root, named, writers, exec, other)
	for _, tc := range []struct {
		name string
		opts adjust.Options
		want map[string]string
	}{
		{"user unknown", adjust.Options{UserUnknown: true}, map[string]string{
			"/dev/group": "-:44", "/dev/readers": "-:45", "/dev/open": "-:-", "/dev/root": "-:-", "/dev/named": "-:7", "/dev/writers": "-:5", "/dev/exec": "-:-", "/dev/other": "-:-"}},
		{"root", adjust.Options{}, map[string]string{
			"/dev/group": "-:-", "/dev/readers": "-:-", "/dev/open": "-:-", "/dev/root": "-:-", "/dev/named": "-:7", "/dev/writers": "-:-", "/dev/exec": "-:-", "/dev/other": "-:-"}},
		{"uid 1000", adjust.Options{UID: 1000, GID: 1000, AdditionalGIDs: []uint32{44, 45, 5}}, map[string]string{
			"/dev/group": "1000:1000", "/dev/readers": "1000:1000", "/dev/open": "1000:1000", "/dev/root": "1000:1000", "/dev/named": "1000:7", "/dev/writers": "1000:1000", "/dev/exec": "1000:1000", "/dev/other": "1000:1000"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := build(t, map[string]string{"j.yaml": spec}, tc.opts, "example.com/jetson=0")
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			for _, d := range res.Adjustment.GetLinux().GetDevices() {
				owner := func(v *api.OptionalUInt32) string {
					if v == nil {
						return "-"
					}
					return fmt.Sprint(v.GetValue())
				}
				got[d.Path] = owner(d.GetUid()) + ":" + owner(d.GetGid())
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("owners (-want +got):\n%s", diff)
			}
		})
	}
}

// mknod makes a char device node with /dev/null's numbers (it opens) at
// path, of that mode (past the umask), owned by root and group gid.
func mknod(t *testing.T, path string, mode uint32, gid int) string {
	t.Helper()
	if err := unix.Mknod(path, unix.S_IFCHR|mode, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatalf("mknod (the tests run as root): %v", err)
	}
	if err := os.Chmod(path, os.FileMode(mode)); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(path, 0, gid); err != nil {
		t.Fatal(err)
	}
	return path
}
