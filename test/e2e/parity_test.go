package e2e

import (
	"cmp"
	"os"
	"slices"
	"strings"
	"testing"

	gocmp "github.com/google/go-cmp/cmp"
	oci "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/nri-gpu/nri-gpu/pkg/access"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
	"github.com/nri-gpu/nri-gpu/test/harness"
)

// TestParityWithContainerdCDI runs the same device through containerd's own
// CDI support (enable_cdi on, a cdi.k8s.io annotation, no nri-gpu) and
// through nri-gpu (enable_cdi off, a pod annotation), and compares the
// final specs.
func TestParityWithContainerdCDI(t *testing.T) {
	needEnv(t)
	cdiCtd := extraContainerd(t, "ctd-cdi", harness.Options{EnableCDI: true, CDISpecDirs: []string{env.host.SpecDir}})

	podID, pod := newPod(t, cdiCtd, nil)
	wantID, want := runContainer(t, cdiCtd, podID, pod, harness.Container{
		Name: "c", Annotations: map[string]string{"cdi.k8s.io/parity": "nvidia.com/gpu=0,nvidia.com/gpu=1"},
	})
	podID, pod = newPod(t, env.ctd, map[string]string{"gpus.nri-gpu.io": "0,1"})
	gotID, got := runContainer(t, env.ctd, podID, pod, harness.Container{Name: "c"})

	if diff := gocmp.Diff(effective(want.Linux.Devices), effective(got.Linux.Devices)); diff != "" {
		t.Errorf("device nodes (-containerd CDI +nri-gpu):\n%s", diff)
	}
	// nri-gpu adds the access file of what the container was given (its
	// variable and read-only mount): the one addition of its own.
	gotEnv := slices.DeleteFunc(slices.Clone(got.Process.Env), func(kv string) bool { return kv == access.EnvVar+"="+access.Path })
	if len(gotEnv) == len(got.Process.Env) || !slices.ContainsFunc(got.Mounts, func(m oci.Mount) bool { return m.Destination == access.Path }) {
		t.Errorf("nri-gpu's container has no access file of what it was given: env %v", got.Process.Env)
	}
	if diff := gocmp.Diff(want.Process.Env, gotEnv); diff != "" {
		t.Errorf("env (-containerd CDI +nri-gpu):\n%s", diff)
	}
	// nri-gpu gives a hook without an environment a minimal one; that is
	// the only difference allowed.
	for _, h := range [][]oci.Hook{want.Hooks.CreateContainer, want.Hooks.Poststart} {
		for i := range h {
			if len(h[i].Env) == 0 {
				h[i].Env = []string{specs.HookEnv}
			}
		}
	}
	if diff := gocmp.Diff(want.Hooks, got.Hooks); diff != "" {
		t.Errorf("hooks (-containerd CDI +nri-gpu):\n%s", diff)
	}
	if diff := gocmp.Diff(specMounts(want), specMounts(got)); diff != "" {
		t.Errorf("mounts from the spec (-containerd CDI +nri-gpu):\n%s", diff)
	}
	// NRI derives an "rw" rule from each device it adds. On containerd 1.7
	// (NRI v0.8) those are the only rules, as it ignores cgroup rules in
	// adjustments; CDI's default is "rwm": the rules must cover the same
	// devices, in the same order, and differ in nothing but the "m". On
	// 2.x nri-gpu's copy of CDI's rules applies too: apart from NRI's "rw"
	// duplicates they must be CDI's exactly.
	rules, compare := got.Linux.Resources.Devices, gocmp.Comparer(sameRuleBut("m"))
	if env.tools.Containerd2() {
		rules, compare = withoutNRIDuplicates(rules), gocmp.Comparer(sameRuleBut(""))
	}
	if diff := gocmp.Diff(want.Linux.Resources.Devices, rules, compare); diff != "" {
		t.Errorf("cgroup device rules (-containerd CDI +nri-gpu):\n%s", diff)
	}

	// And as the containers see them.
	stat := []string{"stat", "-c", "%n %F %a %u:%g %t:%T", "/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm"}
	wantOut, err := cdiCtd.Exec(wantID, stat...)
	if err != nil {
		t.Fatal(err)
	}
	if gotOut := inContainer(t, gotID, stat...); gotOut != wantOut {
		t.Errorf("device nodes in the container:\n%s\nwith containerd's CDI:\n%s", gotOut, wantOut)
	}
}

// effective fills in the mode a runtime (runc) uses for a node with none:
// 0666. containerd 1.7 vendors CDI v0.8, which leaves it unset; nri-gpu
// sets the host node's, as newer CDI versions do. Owners are compared as
// they are: neither sets one the spec does not give.
func effective(devs []oci.LinuxDevice) []oci.LinuxDevice {
	out := slices.Clone(devs)
	for i := range out {
		mode := os.FileMode(0o666)
		out[i].FileMode = cmp.Or(out[i].FileMode, &mode)
	}
	return out
}

// specMounts returns the mounts that come from the CDI spec.
func specMounts(s *oci.Spec) []oci.Mount {
	var out []oci.Mount
	for _, m := range s.Mounts {
		if strings.HasPrefix(m.Source, env.host.Root) {
			out = append(out, m)
		}
	}
	return out
}

// withoutNRIDuplicates drops the "rw" rules NRI adds for its devices
// where another rule for the same device follows.
func withoutNRIDuplicates(rules []oci.LinuxDeviceCgroup) []oci.LinuxDeviceCgroup {
	same := func(a, b oci.LinuxDeviceCgroup) bool {
		return a.Type == b.Type && gocmp.Equal(a.Major, b.Major) && gocmp.Equal(a.Minor, b.Minor)
	}
	var out []oci.LinuxDeviceCgroup
	for i, r := range rules {
		if r.Allow && r.Access == "rw" && slices.ContainsFunc(rules[i+1:], func(o oci.LinuxDeviceCgroup) bool { return same(r, o) }) {
			continue
		}
		out = append(out, r)
	}
	return out
}

// sameRuleBut compares cgroup rules, ignoring the given access letters.
func sameRuleBut(letters string) func(a, b oci.LinuxDeviceCgroup) bool {
	strip := func(s string) string {
		return strings.Map(func(r rune) rune {
			if strings.ContainsRune(letters, r) {
				return -1
			}
			return r
		}, s)
	}
	return func(a, b oci.LinuxDeviceCgroup) bool {
		a.Access, b.Access = strip(a.Access), strip(b.Access)
		return gocmp.Equal(a, b)
	}
}
