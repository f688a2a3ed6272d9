package e2e

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	oci "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/test/harness"
)

// createFails creates a container that must be refused, and checks that
// the error says every wanted string.
func createFails(t *testing.T, podID string, pod harness.Pod, want ...string) {
	t.Helper()
	createFailsWith(t, podID, pod, harness.Container{Name: "c"}, want...)
}

// createFailsWith is createFails for the container ctr.
func createFailsWith(t *testing.T, podID string, pod harness.Pod, ctr harness.Container, want ...string) {
	t.Helper()
	createFailsOn(t, env.ctd, podID, pod, ctr, want...)
}

// createFailsOn is createFailsWith on another containerd.
func createFailsOn(t *testing.T, ctd *harness.Containerd, podID string, pod harness.Pod, ctr harness.Container, want ...string) {
	t.Helper()
	id, err := ctd.CreateContainer(podID, pod, ctr)
	if err == nil {
		t.Fatalf("container %s was created, want creation to fail", id)
	}
	msg := strings.ReplaceAll(err.Error(), `\"`, `"`)
	for _, w := range want {
		if !strings.Contains(msg, w) {
			t.Errorf("error does not say %q:\n%s", w, msg)
		}
	}
}

// gpuNodes returns the /dev/nvidiaN nodes of a spec (not ctl or uvm).
func gpuNodes(s *oci.Spec) []string {
	return slices.DeleteFunc(devicePaths(s), func(p string) bool {
		return p == "/dev/nvidiactl" || p == "/dev/nvidia-uvm"
	})
}

func removePod(t *testing.T, podID string) {
	t.Helper()
	if out, err := env.ctd.Crictl("rmp", "--force", podID); err != nil {
		t.Fatalf("removing pod: %v: %s", err, out)
	}
}

func TestPolicyDenials(t *testing.T) {
	needEnv(t)
	tests := []struct {
		name      string
		namespace string
		ann       map[string]string
		ctrAnn    map[string]string
		want      []string
	}{
		{
			name:      "namespace not in policy.namespaces",
			namespace: "default",
			ann:       map[string]string{"gpus.nri-gpu.io": "0"},
			want:      []string{"denied by policy", `pods of namespace "default" may not request devices`, "policy.namespaces [e2e, tenant-*]"},
		},
		{
			name:      "cdi.k8s.io request from a namespace not in policy.namespaces",
			namespace: "default",
			ctrAnn:    map[string]string{"cdi.k8s.io/forged": "nvidia.com/gpu=0"},
			want:      []string{"denied by policy", `container annotation "cdi.k8s.io/forged"`, `pods of namespace "default" may not request devices`},
		},
		{
			name:   "all through cdi.k8s.io without allowAll",
			ctrAnn: map[string]string{"cdi.k8s.io/forged": "nvidia.com/gpu=all"},
			want:   []string{"denied by policy", `"nvidia.com/gpu=all" gives every device of its kind`, "policy.allowAll: true"},
		},
		{
			name: "more than maxDevicesPerPod",
			ann:  map[string]string{"gpus.nri-gpu.io": "0,1,2,3"},
			want: []string{"denied by policy", "would hold 4 devices, more than policy.maxDevicesPerPod (3)"},
		},
		{
			name:   "more than maxDevicesPerPod through cdi.k8s.io",
			ctrAnn: map[string]string{"cdi.k8s.io/forged": "nvidia.com/gpu=0,nvidia.com/gpu=1,nvidia.com/gpu=2,nvidia.com/gpu=3"},
			want:   []string{"denied by policy", "would hold 4 devices, more than policy.maxDevicesPerPod (3)"},
		},
		{
			name: "hook outside hookPaths",
			ann:  map[string]string{"gpus.nri-gpu.io": harness.BadHookKind + "=0"},
			want: []string{"denied by policy", `injects the hook "` + harness.BadHookPath + `", which is not in policy.hookPaths`},
		},
		{
			name: "world-writable spec",
			ann:  map[string]string{"gpus.nri-gpu.io": harness.UntrustedKind + "=0"},
			want: []string{`device "` + harness.UntrustedKind + `=0"`, "CDI spec not trusted", "untrusted.yaml is writable by group or others (mode 0666)"},
		},
		{
			name: "count and named devices together",
			ann:  map[string]string{"gpus.nri-gpu.io": "0", "gpu-count.nri-gpu.io": "1"},
			want: []string{"not both"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pod := harness.Pod{Name: "deny-" + strings.ReplaceAll(tc.name, " ", "-"), Namespace: cmpOr(tc.namespace, "e2e"), Annotations: tc.ann}
			podID, err := env.ctd.RunPod(pod)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { removePod(t, podID) })
			createFailsWith(t, podID, pod, harness.Container{Name: "c", Annotations: tc.ctrAnn}, tc.want...)
		})
	}
	if !strings.Contains(env.nri.Log(), "untrusted.yaml") {
		t.Error("nri-gpu did not log the untrusted spec")
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func TestExclusiveUntilTheHolderIsRemoved(t *testing.T) {
	needEnv(t)
	holderID, holder := newPod(t, env.ctd, map[string]string{"gpus.nri-gpu.io": "2"})
	runContainer(t, env.ctd, holderID, holder, harness.Container{Name: "a"})
	// Another container of the holder pod shares the device.
	runContainer(t, env.ctd, holderID, holder, harness.Container{Name: "b"})

	otherID, other := newPod(t, env.ctd, map[string]string{"gpus.nri-gpu.io": harness.UUID(2)})
	createFails(t, otherID, other, "denied by policy", `device "nvidia.com/gpu=`+harness.UUID(2)+`" is held by pod e2e/`+holder.Name, "policy.exclusive")

	removePod(t, holderID)
	_, spec := runContainer(t, env.ctd, otherID, other, harness.Container{Name: "c"})
	if got := gpuNodes(spec); !slices.Equal(got, []string{"/dev/nvidia2"}) {
		t.Errorf("after the holder was removed, got %v, want /dev/nvidia2", got)
	}
}

func TestCountRequests(t *testing.T) {
	needEnv(t)
	count := func(n string) map[string]string { return map[string]string{"gpu-count.nri-gpu.io": n} }
	aID, a := newPod(t, env.ctd, count("2"))
	_, aSpec := runContainer(t, env.ctd, aID, a, harness.Container{Name: "first"})
	bID, b := newPod(t, env.ctd, count("2"))
	_, bSpec := runContainer(t, env.ctd, bID, b, harness.Container{Name: "main"})
	aGPUs, bGPUs := gpuNodes(aSpec), gpuNodes(bSpec)
	if len(aGPUs) != 2 || len(bGPUs) != 2 || slices.ContainsFunc(aGPUs, func(n string) bool { return slices.Contains(bGPUs, n) }) {
		t.Fatalf("pods got %v and %v, want two distinct GPUs each", aGPUs, bGPUs)
	}

	cID, c := newPod(t, env.ctd, count("1"))
	createFails(t, cID, c, "denied by policy", "asks for 1 nvidia.com/gpu devices, but 0 are free and 4 held by other pods")

	// SIGKILL the plugin and start it again: it rebuilds what pods hold
	// from the runtime, and hands out nothing twice.
	env.nri.Kill()
	var err error
	if env.nri, err = env.ctd.StartPlugin(suiteArgs()...); err != nil {
		t.Fatal(err)
	}
	_, again := runContainer(t, env.ctd, aID, a, harness.Container{Name: "second"})
	if got := gpuNodes(again); !slices.Equal(got, aGPUs) {
		t.Errorf("after the plugin restarted, a second container of pod a got %v, want the pod's %v", got, aGPUs)
	}
	createFails(t, cID, c, "0 are free and 4 held")

	removePod(t, aID)
	_, cSpec := runContainer(t, env.ctd, cID, c, harness.Container{Name: "c"})
	if got := gpuNodes(cSpec); len(got) != 1 || !slices.Contains(aGPUs, got[0]) {
		t.Errorf("after pod a was removed, pod c got %v, want one of a's %v", got, aGPUs)
	}
}

// TestForgedHoldings: tenants write nri-gpu's own annotations on their
// containers, to claim another pod's GPU and to lock the free ones.
// containerd reports a container's CRI annotations over NRI whatever a
// plugin removed from its spec, so the restarted plugin ignores them: it
// knows who holds what from its state file and the containers' device
// nodes.
func TestForgedHoldings(t *testing.T) {
	needEnv(t)
	aID, a := newPod(t, env.ctd, map[string]string{"gpu-count.nri-gpu.io": "1"})
	_, aSpec := runContainer(t, env.ctd, aID, a, harness.Container{Name: "main"})
	aGPU := gpuNodes(aSpec)
	if len(aGPU) != 1 {
		t.Fatalf("pod a got %v, want one GPU", aGPU)
	}
	aName := "nvidia.com/gpu=" + strings.TrimPrefix(aGPU[0], "/dev/nvidia")
	all := "nvidia.com/gpu=0,nvidia.com/gpu=1,nvidia.com/gpu=2,nvidia.com/gpu=3"
	forged := func(devices, counted string) harness.Container {
		return harness.Container{Name: "forger", Annotations: map[string]string{"nri-gpu.io/devices": devices, "nri-gpu.io/counted": counted}}
	}

	// Forgers, created while no nri-gpu runs: pod f claims a's GPU as
	// counted for itself, pod l locks every GPU by name.
	env.nri.Kill()
	restarted := false
	restart := func() {
		if restarted {
			return
		}
		restarted = true
		var err error
		if env.nri, err = env.ctd.StartPlugin(suiteArgs()...); err != nil {
			t.Fatal(err)
		}
	}
	defer restart()
	fID, f := newPod(t, env.ctd, map[string]string{"gpu-count.nri-gpu.io": "1"})
	runContainer(t, env.ctd, fID, f, forged(aName, aName))
	lID, l := newPod(t, env.ctd, nil)
	runContainer(t, env.ctd, lID, l, forged(all, ""))
	restart()

	_, fSpec := runContainer(t, env.ctd, fID, f, harness.Container{Name: "main"})
	if got := gpuNodes(fSpec); len(got) != 1 || got[0] == aGPU[0] {
		t.Errorf("pod f, which forged a claim on pod a's %s, got %v; want another GPU", aGPU[0], got)
	}
	cID, c := newPod(t, env.ctd, map[string]string{"gpus.nri-gpu.io": strings.TrimPrefix(aName, "nvidia.com/gpu=")})
	createFails(t, cID, c, "held by pod e2e/"+a.Name)
	dID, d := newPod(t, env.ctd, map[string]string{"gpu-count.nri-gpu.io": "2"})
	if _, err := env.ctd.CreateContainer(dID, d, harness.Container{Name: "main"}); err != nil {
		t.Errorf("two GPUs are free but pod l's forged lock kept pod d from them: %v", err)
	}
}

func TestHooksGetAnExplicitEnvironment(t *testing.T) {
	needEnv(t)
	podID, pod := newPod(t, env.ctd, map[string]string{"gpus.nri-gpu.io": "3"})
	id, spec := runContainer(t, env.ctd, podID, pod, harness.Container{
		Name: "c", Env: map[string]string{"LD_PRELOAD": "/tmp/evil.so"},
	})
	for _, h := range append(slices.Clone(spec.Hooks.CreateContainer), spec.Hooks.Poststart...) {
		if len(h.Env) == 0 || slices.ContainsFunc(h.Env, func(e string) bool { return strings.HasPrefix(e, "LD_PRELOAD") }) {
			t.Errorf("hook %v has env %v, want an explicit one without LD_PRELOAD", h.Args, h.Env)
		}
	}
	runs, err := env.host.HookRuns()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range runs {
		if strings.HasPrefix(r, "LD_PRELOAD-LEAK") && strings.HasSuffix(r, id) {
			t.Errorf("a hook saw the container's LD_PRELOAD: %s", r)
		}
	}
	if !slices.Contains(runs, "poststart "+id) {
		t.Errorf("the poststart hook did not run: %v", runs)
	}
}

// TestNVIDIAAnnotations: a pod annotated exactly as for NVIDIA's NRI plugin
// (nvidia.cdi.k8s.io/container.<name>) gets its device through nri-gpu when
// the configuration lists that key, on a containerd whose own CDI is off.
func TestNVIDIAAnnotations(t *testing.T) {
	needEnv(t)
	ctd := extraContainerd(t, "nvidia-keys", harness.Options{})
	config := filepath.Join(ctd.Dir, "nri-gpu.yaml")
	if err := os.WriteFile(config, []byte(env.host.PluginConfig(nil, "exclusive: true")+"annotationKeys: [gpus.nri-gpu.io, nvidia.cdi.k8s.io]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ctd.StartPlugin("--config", config); err != nil {
		t.Fatal(err)
	}
	podID, pod := newPod(t, ctd, map[string]string{"nvidia.cdi.k8s.io/container.worker": "nvidia.com/gpu=" + harness.UUID(1)})
	_, spec := runContainer(t, ctd, podID, pod, harness.Container{Name: "worker"})
	if got := gpuNodes(spec); !slices.Equal(got, []string{"/dev/nvidia1"}) {
		t.Errorf("the worker got %v, want /dev/nvidia1", got)
	}
	// Another container of the pod is not named: it gets nothing.
	_, spec = runContainer(t, ctd, podID, pod, harness.Container{Name: "sidecar"})
	if got := gpuNodes(spec); len(got) > 0 {
		t.Errorf("the sidecar got %v, want nothing", got)
	}
}

// TestConfigReload: a change of the configuration file applies to the
// next container without a restart; an invalid one is refused with its
// line and the one in force stays.
func TestConfigReload(t *testing.T) {
	needEnv(t)
	ctd := extraContainerd(t, "reload", harness.Options{})
	config := filepath.Join(ctd.Dir, "nri-gpu.yaml")
	write := func(policy ...string) { replaceFile(t, config, env.host.PluginConfig(nil, policy...)) }
	write("namespaces: [elsewhere]")
	plugin, err := ctd.StartPlugin("--config", config)
	if err != nil {
		t.Fatal(err)
	}
	podID, pod := newPod(t, ctd, map[string]string{"gpus.nri-gpu.io": "1"})
	if _, err := ctd.CreateContainer(podID, pod, harness.Container{Name: "before"}); err == nil || !strings.Contains(err.Error(), "policy.namespaces") {
		t.Fatalf("before the change: %v, want a denial by policy.namespaces", err)
	}
	write("namesapces: [e2e]") // misspelt: refused, the old one stays
	testutil.Within(t, 15*time.Second, "the invalid change refused", func() bool {
		return strings.Contains(plugin.Log(), "configuration not reloaded") && strings.Contains(plugin.Log(), "line")
	})
	write("namespaces: [e2e]")
	testutil.Within(t, 15*time.Second, "the change reloaded", func() bool { return strings.Contains(plugin.Log(), "configuration reloaded") })
	_, spec := runContainer(t, ctd, podID, pod, harness.Container{Name: "after"})
	if got := gpuNodes(spec); !slices.Equal(got, []string{"/dev/nvidia1"}) {
		t.Errorf("after the change, got %v", got)
	}
}

// replaceFile replaces the file at path with data at once (a new file
// renamed over it), as an operator's tools write a configuration.
func replaceFile(t *testing.T, path, data string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}
