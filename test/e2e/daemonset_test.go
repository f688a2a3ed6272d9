package e2e

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/test/harness"
)

// ImageEnv names the image tar `make image` writes.
const ImageEnv = "NRI_GPU_IMAGE"

// daemonSetPod returns the pod of config/kubernetes/daemonset.yaml (its
// template: image, args, mounts, securityContext, probes) as a static pod,
// and the data of its ConfigMap. host maps each hostPath volume's path to
// the test's directory standing in for it; the ConfigMap volume becomes
// a hostPath of dir holding its data.
func daemonSetPod(t *testing.T, host map[string]string, dir string) map[string]any {
	t.Helper()
	data, err := os.ReadFile("../../config/kubernetes/daemonset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var pod map[string]any
	for _, doc := range strings.Split(string(data), "\n---\n") {
		var obj map[string]any
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			t.Fatal(err)
		}
		switch obj["kind"] {
		case "ConfigMap":
			for name, content := range obj["data"].(map[string]any) {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(content.(string)), 0o644); err != nil {
					t.Fatal(err)
				}
			}
		case "DaemonSet":
			tmpl := obj["spec"].(map[string]any)["template"].(map[string]any)
			meta := tmpl["metadata"].(map[string]any)
			meta["name"], meta["namespace"] = "nri-gpu", obj["metadata"].(map[string]any)["namespace"]
			pod = map[string]any{"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": tmpl["spec"]}
		}
	}
	if pod == nil {
		t.Fatal("daemonset.yaml has no DaemonSet")
	}
	spec := pod["spec"].(map[string]any)
	// The test's containerd has no CNI: the pod shares the node's network.
	spec["hostNetwork"] = true
	// A static pod may not name a service account, nor mount its token
	// (the API server mounts it, for the events); the test's pod has no
	// API server to post to.
	delete(spec, "serviceAccountName")
	delete(spec, "automountServiceAccountToken")
	for _, v := range spec["volumes"].([]any) {
		vol := v.(map[string]any)
		switch {
		case vol["configMap"] != nil:
			delete(vol, "configMap")
			vol["hostPath"] = map[string]any{"path": dir, "type": "Directory"}
		case vol["hostPath"] != nil:
			hp := vol["hostPath"].(map[string]any)
			p, ok := host[hp["path"].(string)]
			if !ok {
				t.Fatalf("the DaemonSet mounts host path %s, which the test does not stand in for", hp["path"])
			}
			hp["path"] = p
		}
	}
	return pod
}

// TestDaemonSet runs nri-gpu as the shipped DaemonSet runs it: the image
// `make image` builds, imported into the suite's containerd, and the
// DaemonSet's pod (same image, args, mounts, securityContext, probes, the
// ConfigMap's configuration) as a static pod of a real kubelet. nri-gpu
// inside it registers with containerd over the mounted NRI socket, says it
// is ready, and a GPU pod then gets its device.
func TestDaemonSet(t *testing.T) {
	needEnv(t)
	image := os.Getenv(ImageEnv)
	if image == "" {
		if os.Getenv(RequiredEnv) == "1" {
			t.Fatalf("no image: set %s (make image builds it)", ImageEnv)
		}
		t.Skipf("no image: set %s (make image builds it)", ImageEnv)
	}
	ctd := extraContainerd(t, "daemonset", harness.Options{})
	if out, err := ctd.Ctr("images", "import", image); err != nil {
		t.Fatalf("importing %s: %v: %s", image, err, out)
	}
	// The GPUs the ConfigMap's configuration can inject: a spec with no
	// hook (its policy allows only NVIDIA's), in the pod's /etc/cdi.
	cdi, cfg, state, empty := t.TempDir(), t.TempDir(), t.TempDir(), t.TempDir()
	spec := "cdiVersion: \"0.6.0\"\nkind: nvidia.com/gpu\ndevices:\n"
	for i := 0; i < env.host.GPUs; i++ {
		spec += fmt.Sprintf("  - name: %q\n    containerEdits:\n      deviceNodes: [{path: /dev/nvidia%d, hostPath: %s}]\n", fmt.Sprint(i), i, env.host.Dev(fmt.Sprintf("nvidia%d", i)))
	}
	if err := os.WriteFile(filepath.Join(cdi, "nvidia.yaml"), []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	pod := daemonSetPod(t, map[string]string{
		"/var/run/nri": filepath.Dir(ctd.NRISock),
		"/etc/cdi":     cdi,
		"/var/run/cdi": empty,
		"/dev":         "/dev",
		"/run/nri-gpu": state,
		// The machine's cgroup hierarchy, as on a node (nri-gpu writes
		// none of it here: no container's GPU memory is bounded).
		"/sys/fs/cgroup": "/sys/fs/cgroup",
	}, cfg)
	// The fake GPUs' nodes are under the test's dir, where the spec says.
	spec0 := pod["spec"].(map[string]any)
	// The state directory stands in for /run/nri-gpu, at its own path in
	// the pod as /run/nri-gpu is on a node: the containers' access files
	// (what each was given) are mounted into them from their path there.
	ctr0 := spec0["containers"].([]any)[0].(map[string]any)
	for _, m := range ctr0["volumeMounts"].([]any) {
		if vm := m.(map[string]any); vm["mountPath"] == "/run/nri-gpu" {
			vm["mountPath"] = state
		}
	}
	for i, a := range ctr0["args"].([]any) {
		if rest, ok := strings.CutPrefix(a.(string), "/run/nri-gpu/"); ok {
			ctr0["args"].([]any)[i] = filepath.Join(state, rest)
		}
	}
	spec0["volumes"] = append(spec0["volumes"].([]any), map[string]any{"name": "gpuhost", "hostPath": map[string]any{"path": env.host.Root}})
	ctr := spec0["containers"].([]any)[0].(map[string]any)
	ctr["volumeMounts"] = append(ctr["volumeMounts"].([]any), map[string]any{"name": "gpuhost", "mountPath": env.host.Root, "readOnly": true})

	k := startKubelet(t, ctd)
	if err := k.AddManifest("nri-gpu", pod); err != nil {
		t.Fatal(err)
	}
	if _, err := k.RunningContainer("nri-gpu", podWait); err != nil {
		t.Fatal(err)
	}
	// Ready (registered with containerd) on the DaemonSet's probe port.
	testutil.Within(t, podWait, "nri-gpu's /readyz 200", func() bool {
		resp, err := http.Get("http://127.0.0.1:9464/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	// The runtime writes the container's log as it comes: the line may
	// reach the file after /readyz answers.
	testutil.Within(t, podWait, "nri-gpu's log saying it connected", func() bool {
		return strings.Contains(k.PodLog("nri-gpu", "nri-gpu", "nri-gpu"), "connected to runtime")
	})

	addPod(t, k, harness.StaticPod{Name: "gpu", Annotations: map[string]string{"gpus.nri-gpu.io": "1"}})
	gpu, err := k.RunningContainer("gpu", podWait)
	if err != nil {
		t.Fatal(err)
	}
	out, err := ctd.Exec(gpu, "ls", "/dev")
	if err != nil {
		t.Fatal(err)
	}
	if seen := slices.DeleteFunc(strings.Fields(out), func(n string) bool { return !strings.HasPrefix(n, "nvidia") }); !slices.Equal(seen, []string{"nvidia1"}) {
		t.Errorf("the GPU pod sees %v, want nvidia1", seen)
	}
	// nri-gpu, in its pod, said what it gave.
	testutil.Within(t, 10*time.Second, "nri-gpu's log line for the GPU pod", func() bool {
		out := k.PodLog("nri-gpu", "nri-gpu", "nri-gpu")
		return strings.Contains(out, "injected devices") && strings.Contains(out, k.PodName("gpu"))
	})
}
