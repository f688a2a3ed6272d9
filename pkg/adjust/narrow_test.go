package adjust_test

import (
	"strings"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/adjust"
)

// permsSpec has devices that name one host node (/dev/zero, as
// /dev/shared) with the permissions of their names.
const permsSpec = `
cdiVersion: "0.6.0"
kind: example.com/perm
devices:
  - {name: rw, containerEdits: {deviceNodes: [{path: /dev/shared, hostPath: /dev/zero, permissions: rw}]}}
  - {name: r, containerEdits: {deviceNodes: [{path: /dev/shared, hostPath: /dev/zero, permissions: r}]}}
  - {name: r2, containerEdits: {deviceNodes: [{path: /dev/shared, hostPath: /dev/zero, permissions: r}]}}
  - {name: w, containerEdits: {deviceNodes: [{path: /dev/shared, hostPath: /dev/zero, permissions: w}]}}
  - {name: other, containerEdits: {deviceNodes: [{path: /dev/other, hostPath: /dev/null, permissions: r}]}}
`

// TestEffectiveAccessAsCDI: devices of one request that name one node
// with different permissions leave the container the union of them, as
// containerd's own CDI does (its rules add up), on a runtime that applies
// nri-gpu's cgroup rules (containerd 2.x), and never the narrower one's
// alone; a node that every device narrows stays narrowed.
func TestEffectiveAccessAsCDI(t *testing.T) {
	for _, tc := range []struct {
		names []string
		want  string
	}{
		{[]string{"example.com/perm=rw", "example.com/perm=r"}, "rw"},
		{[]string{"example.com/perm=r", "example.com/perm=rw"}, "rw"},
		{[]string{"example.com/perm=r", "example.com/perm=w"}, "rw"},
		{[]string{"example.com/perm=r", "example.com/perm=r2"}, "r"},
		{[]string{"example.com/perm=r"}, "r"},
		// Another node's rules are not this one's.
		{[]string{"example.com/perm=r", "example.com/perm=other"}, "r"},
		{[]string{"example.com/perm=rw", "example.com/perm=other"}, "rw"},
	} {
		t.Run(strings.Join(tc.names, "+"), func(t *testing.T) {
			devs, snap := load(t, map[string]string{"perm.yaml": permsSpec}, tc.names...)
			viaCDI := injectedByCDI(t, snap, devs, tc.names)
			res, err := adjust.Build(devs, snap.HostNodes, adjust.Options{Runtime: adjust.Runtime{CgroupRules: true}})
			if err != nil {
				t.Fatal(err)
			}
			viaNRI := adjustedByNRI(t, res.Adjustment)
			for host, want := range map[string]string{"/dev/zero": tc.want, "/dev/null": "r"} {
				node := snap.HostNodes[host]
				dev := oci.LinuxDevice{Type: "c", Major: node.Major, Minor: node.Minor}
				cdi, nri := testutil.DeviceAccess(viaCDI, dev), testutil.DeviceAccess(viaNRI, dev)
				if cdi != nri || (cdi != want && cdi != "") {
					t.Errorf("access to %s: containerd's CDI %q, nri-gpu %q; want both %q", host, cdi, nri, want)
				}
			}
		})
	}
}

// TestNarrowingOnRuntimesWithoutRules: where the runtime applies no cgroup
// rule of a plugin (containerd 1.7), a node whose access over all the
// request's devices is "rw" is injected; one the request narrows is
// refused, saying what the operator can do.
func TestNarrowingOnRuntimesWithoutRules(t *testing.T) {
	rt := adjust.Runtime{Name: "containerd", Version: "v1.7.35"}
	devs, snap := load(t, map[string]string{"perm.yaml": permsSpec}, "example.com/perm=r", "example.com/perm=rw")
	if _, err := adjust.Build(devs, snap.HostNodes, adjust.Options{Runtime: rt}); err != nil {
		t.Errorf("r and rw on one node, rw in all: %v", err)
	}
	devs, snap = load(t, map[string]string{"perm.yaml": permsSpec}, "example.com/perm=r", "example.com/perm=r2")
	_, err := adjust.Build(devs, snap.HostNodes, adjust.Options{Runtime: rt})
	testutil.ErrorSays(t, err, `device "example.com/perm=r"`, `device "example.com/perm=r2"`, `permissions "r"`, "containerd v1.7.35", "containerd 2.x", `give the node "rw"`)

	// A spec's own edits are named as the spec's.
	const specLevel = "cdiVersion: \"0.6.0\"\nkind: example.com/level\ncontainerEdits: {deviceNodes: [{path: /dev/ctl, hostPath: /dev/zero, permissions: r}]}\ndevices: [{name: a, containerEdits: {env: [A=1]}}]\n"
	devs, snap = load(t, map[string]string{"level.yaml": specLevel}, "example.com/level=a")
	_, err = adjust.Build(devs, snap.HostNodes, adjust.Options{Runtime: rt})
	testutil.ErrorSays(t, err, `device "example.com/level=a" (spec-level edits of `)
}
