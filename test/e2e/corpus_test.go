package e2e

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
	"github.com/nri-gpu/nri-gpu/pkg/specs"
	"github.com/nri-gpu/nri-gpu/test/corpus"
	"github.com/nri-gpu/nri-gpu/test/harness"
)

// ReferenceEnv names the directory of the containerd whose own CDI
// injection the corpus is compared with (2.x; make test sets it).
const ReferenceEnv = "NRI_GPU_REFERENCE_CONTAINERD"

// corpusHook records, for every run, the container id, its status and
// the hook's arguments.
const corpusHook = `#!/bin/sh
state=$(cat)
id=${state#*\"id\":\"}
id=${id%%\"*}
status=${state#*\"status\":\"}
status=${status%%\"*}
echo "$id $status $0 $*" >> %s
`

// TestCorpusParity injects every device of every published spec of the
// corpus (test/corpus) through nri-gpu on this suite's containerd, with
// its own CDI off, and through the reference containerd's own CDI, and
// compares what reaches the container, field by field: the device nodes
// (owner and mode), their effective cgroup access, the spec's mounts in
// order, its env, the hooks per phase and which of them ran, additional
// groups and RDT, and whether the container starts. On containerd 2.x
// the two must be identical but for the hook env nri-gpu always sets; on
// 1.7 each difference must be one adjust allows, asserted as exactly it.
func TestCorpusParity(t *testing.T) {
	needEnv(t)
	refDir := os.Getenv(ReferenceEnv)
	if refDir == "" {
		t.Fatalf("%s is not set (make test sets it)", ReferenceEnv)
	}
	refTools, err := env.tools.WithContainerd(refDir)
	if err != nil {
		t.Fatal(err)
	}
	all, err := corpus.Specs()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(env.dir, "corpus")
	hookLog := filepath.Join(dir, "hooks.log")
	hook := filepath.Join(dir, "recording-hook")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(hook, []byte(fmt.Sprintf(corpusHook, hookLog)), 0o755); err != nil {
		t.Fatal(err)
	}
	for g, group := range groups(all) {
		var dirs []string
		for _, s := range group {
			specDir := filepath.Join(dir, "cdi", s.File)
			if _, err := s.Install(specDir, filepath.Join(dir, "root", s.File), hook); err != nil {
				t.Fatal(err)
			}
			dirs = append(dirs, specDir)
		}
		ref := extraContainerdWith(t, refTools, fmt.Sprintf("corpus-ref-%d", g), harness.Options{EnableCDI: true, CDISpecDirs: dirs})
		ctd := extraContainerd(t, fmt.Sprintf("corpus-nri-%d", g), harness.Options{})
		config := filepath.Join(ctd.Dir, "nri-gpu.yaml")
		cfg := fmt.Sprintf("cdiSpecDirs: [%s]\npolicy:\n  devices: [\"*/*\"]\n  allowAll: true\n  hookPaths: [%s]\n", strings.Join(dirs, ", "), hook)
		if err := os.WriteFile(config, []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := ctd.StartPlugin("--config", config); err != nil {
			t.Fatal(err)
		}
		for _, s := range group {
			for i, name := range s.Devices() {
				t.Run(s.File+"/"+name, func(t *testing.T) {
					edits := []cdispec.ContainerEdits{s.Spec.ContainerEdits, s.Spec.Devices[i].ContainerEdits}
					if netDevices(edits) {
						t.Skip("moves host network interfaces: never done here (TestCorpusParity in pkg/adjust covers it)")
					}
					want, wantErr := corpusContainer(t, ref, nil, map[string]string{"cdi.k8s.io/corpus": name})
					got, gotErr := corpusContainer(t, ctd, map[string]string{"gpus.nri-gpu.io": name}, nil)
					if refused := refusedEdit(env.tools, edits); refused != "" {
						if gotErr == nil || !strings.Contains(gotErr.Error(), refused) {
							t.Fatalf("nri-gpu on containerd %s: %v, want %s refused", env.tools.ContainerdVersion, gotErr, refused)
						}
						t.Logf("outcome: refused by nri-gpu (%s; containerd's own CDI: %s)", refused, startedOrNot(wantErr))
						return
					}
					if wantErr != nil && gotErr == nil && noPermissions(edits) {
						// containerd 2.3.7's CDI library (v1.1.0) rejects
						// permissions "none"; nri-gpu's gives the node
						// and no access to it.
						for _, d := range got.spec.Linux.Devices {
							if slices.ContainsFunc(edits, func(e cdispec.ContainerEdits) bool {
								return slices.ContainsFunc(e.DeviceNodes, func(n *cdispec.DeviceNode) bool { return n.Path == d.Path })
							}) && testutil.DeviceAccess(got.spec, d) != "" {
								t.Errorf("device %s: access %q, want none", d.Path, testutil.DeviceAccess(got.spec, d))
							}
						}
						testutil.ErrorSays(t, wantErr, "unresolvable CDI devices")
						t.Log("outcome: containerd's CDI library rejects the spec; nri-gpu's container starts with no access to the node")
						return
					}
					if (wantErr == nil) != (gotErr == nil) {
						t.Fatalf("containerd's own CDI: %v; nri-gpu: %v", wantErr, gotErr)
					}
					if wantErr != nil {
						t.Logf("outcome: neither starts; containerd's own CDI: %v; nri-gpu: %v", wantErr, gotErr)
						return
					}
					compareCorpus(t, want, got, edits, hookLog)
				})
			}
		}
	}
}

// groups splits the corpus into groups in which no device name repeats
// (two publishers' tests may both define vendor1.com/device=foo).
func groups(all []corpus.Spec) [][]corpus.Spec {
	var out [][]corpus.Spec
	for _, s := range all {
		placed := false
		for i, g := range out {
			if !slices.ContainsFunc(g, func(o corpus.Spec) bool {
				return slices.ContainsFunc(o.Devices(), func(n string) bool { return slices.Contains(s.Devices(), n) })
			}) {
				out[i] = append(g, s)
				placed = true
				break
			}
		}
		if !placed {
			out = append(out, []corpus.Spec{s})
		}
	}
	return out
}

// corpusContainer runs a container asking for a device; it returns the
// container's id and spec, or why it did not start.
type corpusRun struct {
	id   string
	spec *oci.Spec
}

func corpusContainer(t *testing.T, ctd *harness.Containerd, podAnn, ctrAnn map[string]string) (corpusRun, error) {
	t.Helper()
	podID, pod := newPod(t, ctd, podAnn)
	id, err := ctd.CreateContainer(podID, pod, harness.Container{Name: "c", Annotations: ctrAnn})
	if err != nil {
		return corpusRun{}, err
	}
	if err := ctd.StartContainer(id); err != nil {
		return corpusRun{}, err
	}
	spec, err := ctd.ContainerSpec(id)
	if err != nil {
		t.Fatal(err)
	}
	return corpusRun{id: id, spec: spec}, nil
}

func startedOrNot(err error) string {
	if err != nil {
		return "does not start either"
	}
	return "starts"
}

func noPermissions(edits []cdispec.ContainerEdits) bool {
	return slices.ContainsFunc(edits, func(e cdispec.ContainerEdits) bool {
		return slices.ContainsFunc(e.DeviceNodes, func(n *cdispec.DeviceNode) bool { return n.Permissions == "none" })
	})
}

func netDevices(edits []cdispec.ContainerEdits) bool {
	return slices.ContainsFunc(edits, func(e cdispec.ContainerEdits) bool { return len(e.NetDevices) > 0 })
}

// refusedEdit names the edit nri-gpu refuses on this suite's containerd,
// or returns "": an L3 cache or memory bandwidth schema, which no NRI
// can express; on 1.7 any RDT, and device permissions narrower than rw.
func refusedEdit(tools harness.Tools, edits []cdispec.ContainerEdits) string {
	for _, e := range edits {
		if r := e.IntelRdt; r != nil && (!tools.Containerd2() || r.L3CacheSchema != "" || r.MemBwSchema != "") {
			return "intelRdt"
		}
		if tools.Containerd2() {
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

// compareCorpus compares the parts of two containers that a spec's edits
// make.
func compareCorpus(t *testing.T, want, got corpusRun, edits []cdispec.ContainerEdits, hookLog string) {
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
	devices := func(s *oci.Spec) []oci.LinuxDevice {
		return slices.DeleteFunc(slices.Clone(s.Linux.Devices), func(d oci.LinuxDevice) bool { return !slices.Contains(paths, d.Path) })
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
	var allowed []string
	defer func() {
		if !t.Failed() {
			t.Logf("outcome: identical%s", strings.Join(allowed, ""))
		}
	}()
	wantDevices, gotDevices := devices(want.spec), devices(got.spec)
	if diff := gocmp.Diff(wantDevices, gotDevices); diff != "" {
		t.Errorf("device nodes (-containerd CDI +nri-gpu):\n%s", diff)
	}
	for _, d := range wantDevices {
		w, g := testutil.DeviceAccess(want.spec, d), testutil.DeviceAccess(got.spec, d)
		if !env.tools.Containerd2() && d.Type == "c" && w == "rwm" {
			w = "rw" // NRI v0.8 and earlier: only its own rule per device
			if !slices.Contains(allowed, "; access rw, not rwm") {
				allowed = append(allowed, "; access rw, not rwm")
			}
		}
		if w != g {
			t.Errorf("device %s: access %q through nri-gpu, %q through containerd's CDI", d.Path, g, w)
		}
	}
	if diff := gocmp.Diff(mounts(want.spec), mounts(got.spec)); diff != "" {
		t.Errorf("mounts (-containerd CDI +nri-gpu):\n%s", diff)
	}
	if diff := gocmp.Diff(envs(want.spec), envs(got.spec)); diff != "" {
		t.Errorf("env (-containerd CDI +nri-gpu):\n%s", diff)
	}
	wantHooks := want.spec.Hooks
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
	if diff := gocmp.Diff(wantHooks, got.spec.Hooks); diff != "" {
		t.Errorf("hooks (-containerd CDI +nri-gpu):\n%s", diff)
	}
	if w, g := runs(t, hookLog, want.id), runs(t, hookLog, got.id); !slices.Equal(w, g) {
		t.Errorf("hooks ran: %q through nri-gpu, %q through containerd's CDI", g, w)
	}
	// Additional groups: nri-gpu leaves the spec's out for a root process,
	// which they give nothing, as no NRI can add them.
	var specGids []uint32
	for _, e := range edits {
		specGids = append(specGids, e.AdditionalGIDs...)
	}
	w, g := want.spec.Process.User.AdditionalGids, got.spec.Process.User.AdditionalGids
	if base := slices.DeleteFunc(slices.Clone(w), func(gid uint32) bool { return gid != 0 && slices.Contains(specGids, gid) }); !slices.Equal(base, g) {
		t.Errorf("additional groups %v through nri-gpu, %v through containerd's CDI", g, w)
	} else if !slices.Equal(w, g) {
		allowed = append(allowed, fmt.Sprintf("; the spec's groups %v left out (root process)", specGids))
	}
	if diff := gocmp.Diff(want.spec.Linux.IntelRdt, got.spec.Linux.IntelRdt); diff != "" {
		t.Errorf("RDT (-containerd CDI +nri-gpu):\n%s", diff)
	}
}

// runs returns the hook runs recorded for a container, sorted, without
// its id.
func runs(t *testing.T, log, id string) []string {
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
