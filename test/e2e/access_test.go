package e2e

import (
	"os"
	"path/filepath"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/test/harness"
)

// accessSpec has devices naming one host node (/dev/zero, c 1:5, as
// /dev/shared): one read-write, two read-only.
const accessSpec = `cdiVersion: "0.6.0"
kind: example.com/perm
devices:
  - {name: rw, containerEdits: {deviceNodes: [{path: /dev/shared, hostPath: /dev/zero, permissions: rw}]}}
  - {name: r, containerEdits: {deviceNodes: [{path: /dev/shared, hostPath: /dev/zero, permissions: r}]}}
  - {name: r2, containerEdits: {deviceNodes: [{path: /dev/shared, hostPath: /dev/zero, permissions: r}]}}
`

// TestEffectiveAccess: the access to a node that devices of one request
// name with different permissions is, in the final spec's cgroup rules
// as runc applies them, the same with nri-gpu as with containerd's own
// CDI: the union (rw and r give rw; on 2.3.7 nri-gpu once left r); a node
// every device narrows stays narrowed where the runtime applies nri-gpu's
// rules (2.x) and is refused on 1.7, saying what to do. (These machines
// do not enforce a device cgroup's access modes inside containers, for
// containerd's CDI as for nri-gpu: the rules are what is compared.)
func TestEffectiveAccess(t *testing.T) {
	needEnv(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "perm.yaml"), []byte(accessSpec), 0o644); err != nil {
		t.Fatal(err)
	}
	cdiCtd := extraContainerd(t, "ctd-access-cdi", harness.Options{EnableCDI: true, CDISpecDirs: []string{dir}})
	nriCtd := extraContainerd(t, "ctd-access-nri", harness.Options{})
	config := filepath.Join(nriCtd.Dir, "nri-gpu.yaml")
	if err := os.WriteFile(config, []byte(env.host.PluginConfig([]string{dir}, "devices: [\"example.com/*\"]")), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := nriCtd.StartPlugin("--config", config); err != nil {
		t.Fatal(err)
	}
	zero := oci.LinuxDevice{Type: "c", Major: 1, Minor: 5}
	for _, tc := range []struct {
		devices string
		want    string
	}{
		{"example.com/perm=rw,example.com/perm=r", "rw"},
		{"example.com/perm=r,example.com/perm=rw", "rw"},
		{"example.com/perm=r,example.com/perm=r2", "r"},
	} {
		podID, pod := newPod(t, cdiCtd, nil)
		_, viaCDI := runContainer(t, cdiCtd, podID, pod, harness.Container{Name: "c", Annotations: map[string]string{"cdi.k8s.io/access": tc.devices}})
		cdi := testutil.DeviceAccess(viaCDI, zero)
		if cdi != tc.want {
			t.Fatalf("%s: containerd's CDI gives %q, want %q", tc.devices, cdi, tc.want)
		}
		podID, pod = newPod(t, nriCtd, map[string]string{"gpus.nri-gpu.io": tc.devices})
		if tc.want != "rw" && !env.tools.Containerd2() {
			createFailsOn(t, nriCtd, podID, pod, harness.Container{Name: "c"}, `permissions "r"`, "containerd 2.x", `give the node "rw"`)
			continue
		}
		_, viaNRI := runContainer(t, nriCtd, podID, pod, harness.Container{Name: "c"})
		if got := testutil.DeviceAccess(viaNRI, zero); got != cdi {
			t.Errorf("%s: nri-gpu gives %q, containerd's CDI %q (rules %+v)", tc.devices, got, cdi, viaNRI.Linux.Resources.Devices)
		}
	}
}
