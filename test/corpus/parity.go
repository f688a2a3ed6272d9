package corpus

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	gocmp "github.com/google/go-cmp/cmp"
	oci "github.com/opencontainers/runtime-spec/specs-go"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/adjust"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// What the corpus's parity tests share (test/e2e on containerd, test/crio
// on CRI-O): each device of each spec given to one container by the
// runtime's own CDI and to another by nri-gpu, and the two compared.

// HookScript, given the file to append to, is a hook that records, for every run, the container id, its status and
// the hook's arguments.
const HookScript = `#!/bin/sh
state=$(cat)
id=${state#*\"id\":\"}
id=${id%%\"*}
status=${state#*\"status\":\"}
status=${status%%\"*}
echo "$id $status $0 $*" >> %s
`

// Run is a container of a comparison: its ID and final OCI spec.
type Run struct {
	ID   string
	Spec *oci.Spec
}

// Groups splits the corpus into groups in which no device name repeats
// (two publishers' tests may both define vendor1.com/device=foo).
func Groups(all []Spec) [][]Spec {
	var out [][]Spec
	for _, s := range all {
		placed := false
		for i, g := range out {
			if !slices.ContainsFunc(g, func(o Spec) bool {
				return slices.ContainsFunc(o.Devices(), func(n string) bool { return slices.Contains(s.Devices(), n) })
			}) {
				out[i] = append(g, s)
				placed = true
				break
			}
		}
		if !placed {
			out = append(out, []Spec{s})
		}
	}
	return out
}

// NoPermissions reports whether a node of the edits has permissions
// "none".
func NoPermissions(edits []cdispec.ContainerEdits) bool {
	return slices.ContainsFunc(edits, func(e cdispec.ContainerEdits) bool {
		return slices.ContainsFunc(e.DeviceNodes, func(n *cdispec.DeviceNode) bool { return n.Permissions == "none" })
	})
}

// NetDevices reports whether the edits move host network interfaces.
func NetDevices(edits []cdispec.ContainerEdits) bool {
	return slices.ContainsFunc(edits, func(e cdispec.ContainerEdits) bool { return len(e.NetDevices) > 0 })
}

// Refused names the edit nri-gpu refuses on a runtime that applies what
// rt says, or returns "": an L3 cache or memory bandwidth schema, which
// no NRI can express; any RDT where the runtime applies none; device
// permissions narrower than rw where it applies no cgroup rule.
func Refused(rt adjust.Runtime, edits []cdispec.ContainerEdits) string {
	for _, e := range edits {
		if r := e.IntelRdt; r != nil && (!rt.RDT || r.L3CacheSchema != "" || r.MemBwSchema != "") {
			return "intelRdt"
		}
		if rt.CgroupRules {
			continue
		}
		for _, n := range e.DeviceNodes {
			if p := n.Permissions; p != "" && !(strings.Contains(p, "r") && strings.Contains(p, "w")) {
				return "cgroup permissions"
			}
		}
	}
	return ""
}

// Compare compares the parts of two containers that a spec's edits make:
// want given the spec's devices by the runtime's own CDI, got by nri-gpu
// on a runtime that applies what rt says. They must be identical but for
// the hook env nri-gpu always sets, the access of a node where the
// runtime applies no cgroup rule of a plugin (NRI's own "rw", not CDI's
// "rwm"), and the spec's additional groups left out for a root process,
// each said in the outcome logged.
func Compare(t *testing.T, rt adjust.Runtime, want, got Run, edits []cdispec.ContainerEdits, hookLog string) {
	t.Helper()
	var paths, dests, keys []string
	for _, e := range edits {
		for _, n := range e.DeviceNodes {
			paths = append(paths, n.Path)
		}
		for _, m := range e.Mounts {
			dests = append(dests, m.ContainerPath)
		}
		for _, kv := range e.Env {
			k, _, _ := strings.Cut(kv, "=")
			keys = append(keys, k)
		}
	}
	mounts := func(s *oci.Spec) []oci.Mount {
		return slices.DeleteFunc(slices.Clone(s.Mounts), func(m oci.Mount) bool { return !slices.Contains(dests, m.Destination) })
	}
	envs := func(s *oci.Spec) []string {
		return slices.DeleteFunc(slices.Clone(s.Process.Env), func(kv string) bool {
			k, _, _ := strings.Cut(kv, "=")
			return !slices.Contains(keys, k)
		})
	}
	var allowed allowances
	defer func() {
		if !t.Failed() {
			t.Logf("outcome: identical%s", strings.Join(allowed, ""))
		}
	}()
	compareDevices(t, rt, want.Spec, got.Spec, paths, &allowed)
	if diff := gocmp.Diff(mounts(want.Spec), mounts(got.Spec)); diff != "" {
		t.Errorf("mounts (-runtime's CDI +nri-gpu):\n%s", diff)
	}
	if diff := gocmp.Diff(envs(want.Spec), envs(got.Spec)); diff != "" {
		t.Errorf("env (-runtime's CDI +nri-gpu):\n%s", diff)
	}
	compareHooks(t, want, got, hookLog)
	compareGroups(t, want.Spec, got.Spec, edits, &allowed)
	if diff := gocmp.Diff(want.Spec.Linux.IntelRdt, got.Spec.Linux.IntelRdt); diff != "" {
		t.Errorf("RDT (-runtime's CDI +nri-gpu):\n%s", diff)
	}
}

// allowances are the differences a comparison allowed, each said once.
type allowances []string

func (a *allowances) add(why string) {
	if !slices.Contains(*a, why) {
		*a = append(*a, why)
	}
}

// compareDevices compares the device nodes at paths and their effective
// cgroup access.
func compareDevices(t *testing.T, rt adjust.Runtime, want, got *oci.Spec, paths []string, allowed *allowances) {
	t.Helper()
	devices := func(s *oci.Spec) []oci.LinuxDevice {
		return slices.DeleteFunc(slices.Clone(s.Linux.Devices), func(d oci.LinuxDevice) bool { return !slices.Contains(paths, d.Path) })
	}
	wantDevices, gotDevices := devices(want), devices(got)
	for i, d := range wantDevices {
		if d.FileMode == nil {
			wantDevices[i].FileMode = runcMode(d, gotDevices, allowed)
		}
	}
	if diff := gocmp.Diff(wantDevices, gotDevices); diff != "" {
		t.Errorf("device nodes (-runtime's CDI +nri-gpu):\n%s", diff)
	}
	for _, d := range wantDevices {
		w, g := testutil.DeviceAccess(want, d), testutil.DeviceAccess(got, d)
		if !rt.CgroupRules && d.Type == "c" && w == "rwm" {
			w = "rw" // a runtime that applies no plugin's rule: NRI's own per device
			allowed.add("; access rw, not rwm")
		}
		if w != g {
			t.Errorf("device %s: access %q through nri-gpu, %q through the runtime's CDI", d.Path, g, w)
		}
	}
}

// runcMode is the mode of node d in a container whose runtime's CDI left
// it out (CRI-O 1.34's): runc makes it 0666. nri-gpu gives the host
// node's mode, as the CDI library does: the same, or narrower (0660 of a
// render node), never wider, which is allowed and said.
func runcMode(d oci.LinuxDevice, got []oci.LinuxDevice, allowed *allowances) *os.FileMode {
	mode := os.FileMode(0o666)
	if j := slices.IndexFunc(got, func(g oci.LinuxDevice) bool { return g.Path == d.Path }); j >= 0 && got[j].FileMode != nil &&
		*got[j].FileMode != mode && *got[j].FileMode&^mode == 0 {
		host := *got[j].FileMode
		allowed.add(fmt.Sprintf("; %s %v, the host node's, where the runtime's CDI leaves it to runc's 0666", d.Path, host))
		return &host
	}
	allowed.add("; the node's mode runc's 0666 where the runtime's CDI leaves it out")
	return &mode
}

// compareHooks compares the hooks per phase (nri-gpu sets its own env
// where the spec gives none) and which of them ran.
func compareHooks(t *testing.T, want, got Run, hookLog string) {
	t.Helper()
	wantHooks := want.Spec.Hooks
	if wantHooks != nil {
		for _, point := range [][]oci.Hook{wantHooks.Prestart, wantHooks.CreateRuntime, wantHooks.CreateContainer, //nolint:staticcheck // CDI specs may use prestart
			wantHooks.StartContainer, wantHooks.Poststart, wantHooks.Poststop} {
			for i := range point {
				if len(point[i].Env) == 0 {
					point[i].Env = []string{specs.HookEnv} // nri-gpu's, where the spec gives none
				}
			}
		}
	}
	if diff := gocmp.Diff(wantHooks, got.Spec.Hooks); diff != "" {
		t.Errorf("hooks (-runtime's CDI +nri-gpu):\n%s", diff)
	}
	if w, g := hookRuns(t, hookLog, want.ID), hookRuns(t, hookLog, got.ID); !slices.Equal(w, g) {
		t.Errorf("hooks ran: %q through nri-gpu, %q through the runtime's CDI", g, w)
	}
}

// compareGroups compares the additional groups: nri-gpu leaves the
// spec's out for a root process, which they give nothing, as no NRI can
// add them.
func compareGroups(t *testing.T, want, got *oci.Spec, edits []cdispec.ContainerEdits, allowed *allowances) {
	t.Helper()
	var specGids []uint32
	for _, e := range edits {
		specGids = append(specGids, e.AdditionalGIDs...)
	}
	w, g := want.Process.User.AdditionalGids, got.Process.User.AdditionalGids
	if base := slices.DeleteFunc(slices.Clone(w), func(gid uint32) bool { return gid != 0 && slices.Contains(specGids, gid) }); !slices.Equal(base, g) {
		t.Errorf("additional groups %v through nri-gpu, %v through the runtime's CDI", g, w)
	} else if !slices.Equal(w, g) {
		allowed.add(fmt.Sprintf("; the spec's groups %v left out (root process)", specGids))
	}
}

// hookRuns returns the hook runs recorded for a container, sorted, without
// its id.
func hookRuns(t *testing.T, log, id string) []string {
	t.Helper()
	data, err := os.ReadFile(log)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, id+" "); ok {
			out = append(out, rest)
		}
	}
	slices.Sort(out)
	return out
}

// Pair is one group's two runtimes of a comparison: Ref's own CDI reads
// the group's spec directories; NRI runs nri-gpu, reading them instead.
// Each runs a container in a pod of its own, asking a device by the
// annotations given, and returns it or why it did not start.
type Pair struct {
	Ref, NRI func(t *testing.T, podAnn, ctrAnn map[string]string) (Run, error)
}

// Parity runs the comparison of every device of every spec of the corpus
// on a runtime (named runtime, applying what rt says of an adjustment),
// in dir: start starts a group's Pair on its spec directories, with
// nri-gpu's configuration (PluginConfig). A device is given by the
// runtime's own CDI through the container annotation cdi.k8s.io/corpus,
// and by nri-gpu through the pod annotation gpus.nri-gpu.io; what nri-gpu
// refuses on the runtime (Refused) must be refused naming the edit, a
// spec both reject neither starts, and the rest is compared (Compare).
func Parity(t *testing.T, runtime string, rt adjust.Runtime, dir string, start func(t *testing.T, group int, dirs []string, config string) Pair) {
	t.Helper()
	all, err := Specs()
	if err != nil {
		t.Fatal(err)
	}
	hookLog, hook := filepath.Join(dir, "hooks.log"), filepath.Join(dir, "recording-hook")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(hook, fmt.Appendf(nil, HookScript, hookLog), 0o755); err != nil {
		t.Fatal(err)
	}
	for g, group := range Groups(all) {
		var dirs []string
		for _, s := range group {
			specDir := filepath.Join(dir, "cdi", s.File)
			if _, err := s.Install(specDir, filepath.Join(dir, "root", s.File), hook); err != nil {
				t.Fatal(err)
			}
			dirs = append(dirs, specDir)
		}
		pair := start(t, g, dirs, fmt.Sprintf("cdiSpecDirs: [%s]\npolicy:\n  devices: [\"*/*\"]\n  allowAll: true\n  hookPaths: [%s]\n", strings.Join(dirs, ", "), hook))
		for _, s := range group {
			for i, name := range s.Devices() {
				t.Run(s.File+"/"+name, func(t *testing.T) {
					edits := []cdispec.ContainerEdits{s.Spec.ContainerEdits, s.Spec.Devices[i].ContainerEdits}
					if NetDevices(edits) {
						t.Skip("moves host network interfaces: never done here (TestCorpusParity in pkg/adjust covers it)")
					}
					want, wantErr := pair.Ref(t, nil, map[string]string{"cdi.k8s.io/corpus": name})
					got, gotErr := pair.NRI(t, map[string]string{"gpus.nri-gpu.io": name}, nil)
					judge(t, runtime, rt, edits, hookLog, want, got, wantErr, gotErr)
				})
			}
		}
	}
}

// judge decides one device's comparison.
func judge(t *testing.T, runtime string, rt adjust.Runtime, edits []cdispec.ContainerEdits, hookLog string, want, got Run, wantErr, gotErr error) {
	t.Helper()
	if refused := Refused(rt, edits); refused != "" {
		if gotErr == nil || !strings.Contains(gotErr.Error(), refused) {
			t.Fatalf("nri-gpu on %s: %v, want %s refused", runtime, gotErr, refused)
		}
		t.Logf("outcome: refused by nri-gpu (%s; %s's own CDI: started %v)", refused, runtime, wantErr == nil)
		return
	}
	if wantErr != nil && gotErr == nil && NoPermissions(edits) {
		// The CDI library of containerd 2.3.7 (v1.1.0) rejects
		// permissions "none"; nri-gpu's gives the node and no access to
		// it.
		for _, d := range got.Spec.Linux.Devices {
			if slices.ContainsFunc(edits, func(e cdispec.ContainerEdits) bool {
				return slices.ContainsFunc(e.DeviceNodes, func(n *cdispec.DeviceNode) bool { return n.Path == d.Path })
			}) && testutil.DeviceAccess(got.Spec, d) != "" {
				t.Errorf("device %s: access %q, want none", d.Path, testutil.DeviceAccess(got.Spec, d))
			}
		}
		testutil.ErrorSays(t, wantErr, "unresolvable CDI devices")
		t.Logf("outcome: %s's CDI library rejects the spec; nri-gpu's container starts with no access to the node", runtime)
		return
	}
	if (wantErr == nil) != (gotErr == nil) {
		t.Fatalf("%s's own CDI: %v; nri-gpu: %v", runtime, wantErr, gotErr)
	}
	if wantErr != nil {
		t.Logf("outcome: neither starts; %s's own CDI: %v; nri-gpu: %v", runtime, wantErr, gotErr)
		return
	}
	Compare(t, rt, want, got, edits, hookLog)
}
