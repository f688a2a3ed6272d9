package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nri-gpu/nri-gpu/test/harness"
)

// nriGPU runs an nri-gpu command and returns its output and exit code.
func nriGPU(t *testing.T, args ...string) (string, int) {
	t.Helper()
	out, err := exec.Command(env.tools.Path("nri-gpu"), args...).CombinedOutput()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errorsAs(err, &exit):
		return string(out), exit.ExitCode()
	}
	t.Fatalf("nri-gpu %v: %v", args, err)
	return "", -1
}

func errorsAs(err error, target **exec.ExitError) bool {
	e, ok := err.(*exec.ExitError)
	*target = e
	return ok
}

// healthySpecDir holds only the fake host's GPU spec.
func healthySpecDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(env.dir, "cdi-healthy")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "nvidia.yaml"), []byte(env.host.Spec()), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestCheck(t *testing.T) {
	needEnv(t)
	dir := healthySpecDir(t)
	base := []string{"check", "--config", env.config, "--containerd-config", env.ctd.ConfigPath(), "--cdi-spec-dirs", dir,
		"--state-file", harness.StateFile(env.ctd.Dir, "nri-gpu")}

	out, code := nriGPU(t, append(base, "--socket-path", env.ctd.NRISock)...)
	if code != 0 || strings.Contains(out, "FAIL") {
		t.Errorf("healthy node: exit %d:\n%s", code, out)
	}
	for _, want := range []string{"OK    NRI socket", "NRI is on", "enable_cdi is off", "devices can be injected", "exists and is allowed", "OK    state file"} {
		if !strings.Contains(out, want) {
			t.Errorf("healthy node: output lacks %q:\n%s", want, out)
		}
	}

	out, code = nriGPU(t, append(base, "--socket-path", filepath.Join(env.dir, "no-nri.sock"))...)
	if code != 1 || !strings.Contains(out, "FAIL  NRI socket") || !strings.Contains(out, "fix: enable NRI") {
		t.Errorf("NRI unreachable: exit %d:\n%s", code, out)
	}

	// A record cut short fails; one rebuilt from the containers, with
	// the damaged one set aside, warns and names the pods.
	records := t.TempDir()
	cut := filepath.Join(records, "cut.json")
	if err := os.WriteFile(cut, []byte(`{"version":1,"pods":[{"id":`), 0o600); err != nil {
		t.Fatal(err)
	}
	out, code = nriGPU(t, "check", "--config", env.config, "--containerd-config", "", "--cdi-spec-dirs", dir, "--socket-path", env.ctd.NRISock, "--state-file", cut)
	if code != 1 || !strings.Contains(out, "FAIL  state file") || !strings.Contains(out, "unexpected end of JSON input") {
		t.Errorf("a record cut short: exit %d:\n%s", code, out)
	}
	rebuilt := filepath.Join(records, "allocations.json")
	if err := os.WriteFile(rebuilt, []byte(`{"version":1,"pods":[{"id":"x","namespace":"e2e","name":"a","named":[{"name":"nvidia.com/gpu=0"}],"sole":["nvidia.com/gpu=0"]}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(rebuilt+".damaged-20261201T000000Z", nil, 0o600); err != nil {
		t.Fatal(err)
	}
	out, code = nriGPU(t, "check", "--config", env.config, "--containerd-config", "", "--cdi-spec-dirs", dir, "--socket-path", env.ctd.NRISock, "--state-file", rebuilt)
	for _, want := range []string{"WARN  state file", "runs on a rebuilt record: 1 pods", "e2e/a", "unusable records set aside: " + rebuilt + ".damaged-"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("a rebuilt record: exit %d, output lacks %q:\n%s", code, want, out)
		}
	}

	// The suite's own spec dir holds a world-writable spec and a hook
	// nobody allowed: both fail, with a fix.
	out, code = nriGPU(t, "check", "--config", env.config, "--containerd-config", env.ctd.ConfigPath(), "--socket-path", env.ctd.NRISock)
	if code != 1 || !strings.Contains(out, "untrusted.yaml") || !strings.Contains(out, harness.BadHookPath) || !strings.Contains(out, "chmod go-w") {
		t.Errorf("suite spec dir: exit %d:\n%s", code, out)
	}
}

func TestExplainAndAccess(t *testing.T) {
	needEnv(t)
	out, code := nriGPU(t, "explain", "--config", env.config, "--namespace", "e2e", "--annotation", "gpus.nri-gpu.io=1")
	if code != 0 {
		t.Fatalf("explain: exit %d:\n%s", code, out)
	}
	for _, want := range []string{"device   /dev/nvidia1  c 195:1", "device   /dev/nvidiactl  c 195:255", "cgroup   allow c 195:1 rw",
		"mount    " + env.host.Root + "/lib/libcuda.so.1 -> /usr/lib/libcuda.so.1", "env      FAKE_GPU_1=" + harness.UUID(1),
		"hook     createContainer " + env.host.HookPath(), "hook     poststart " + env.host.HookPath()} {
		if !strings.Contains(out, want) {
			t.Errorf("explain lacks %q:\n%s", want, out)
		}
	}
	out, code = nriGPU(t, "explain", "--config", env.config, "--namespace", "default", "--annotation", "gpus.nri-gpu.io=1")
	if code != 1 || !strings.Contains(out, `denied: `) || !strings.Contains(out, `namespace "default"`) {
		t.Errorf("explain of a denied pod: exit %d:\n%s", code, out)
	}

	out, code = nriGPU(t, "access", "--config", env.config, "1")
	if code != 0 {
		t.Fatalf("access: exit %d:\n%s", code, out)
	}
	var rec cdispec.Spec
	if err := json.Unmarshal([]byte(out), &rec); err != nil || len(rec.Devices) != 1 {
		t.Fatalf("access output is not a record: %v\n%s", err, out)
	}
	access := rec.Devices[0].ContainerEdits
	if len(access.DeviceNodes) != 3 || len(access.Mounts) != 1 || !slices.Contains(access.Mounts[0].Options, "ro") || len(access.Hooks) != 2 || access.Hooks[0].Path != env.host.HookPath() {
		t.Errorf("access: %+v", access)
	}
}

// TestSmokeScript runs test/smoke/smoke.sh, the operator's check after an
// install, against the suite's containerd.
func TestSmokeScript(t *testing.T) {
	needEnv(t)
	smoke := func(device string) (string, error) {
		cmd := exec.Command("../smoke/smoke.sh")
		cmd.Env = append(os.Environ(),
			"IMAGE="+harness.ImageRef, "DEVICE="+device, "NAMESPACE=e2e", "ADDRESS="+env.ctd.Address,
			"CRICTL="+env.tools.Path("crictl"), "CTR="+env.tools.Path("ctr"))
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := smoke("2")
	if err != nil || !strings.Contains(out, "SMOKE OK") || !strings.Contains(out, "/dev/nvidia2") {
		t.Errorf("smoke.sh: %v\n%s", err, out)
	}
	// And it says why when the device cannot be had.
	out, err = smoke("9")
	if err == nil || !strings.Contains(out, "SMOKE FAIL: the container was not created") {
		t.Errorf("smoke.sh with an unknown device: %v\n%s", err, out)
	}
}

// TestMetrics scrapes the suite's nri-gpu after an injection and a denial.
func TestMetrics(t *testing.T) {
	needEnv(t)
	podID, pod := newPod(t, env.ctd, map[string]string{"gpus.nri-gpu.io": "1"})
	runContainer(t, env.ctd, podID, pod, harness.Container{Name: "c"})
	deniedID, denied := newPod(t, env.ctd, map[string]string{"gpus.nri-gpu.io": "all"})
	createFails(t, deniedID, denied, "policy.allowAll")

	resp, err := http.Get(served(t, env.nri) + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`nri_gpu_requests_total\{result="injected"\} [1-9]`),
		regexp.MustCompile(`nri_gpu_denials_total\{rule="allowAll"\} [1-9]`),
		regexp.MustCompile(`nri_gpu_request_duration_seconds_count [1-9]`),
		regexp.MustCompile(`nri_gpu_devices_held [1-9]`),
		regexp.MustCompile(`nri_gpu_spec_errors [1-9]`), // the untrusted spec
	} {
		if !want.Match(body) {
			t.Errorf("metrics do not match %s:\n%s", want, body)
		}
	}
}

// served returns where a plugin serves its metrics and probes, as it
// logged it: http://ADDRESS.
func served(t *testing.T, p *harness.Plugin) string {
	t.Helper()
	m := regexp.MustCompile(`serving metrics at (http://\S+)/metrics`).FindStringSubmatch(p.Log())
	if m == nil {
		t.Fatalf("nri-gpu did not log its metrics address:\n%s", p.Log())
	}
	return m[1]
}

// readiness returns the status code of a probe of the plugin's.
func readiness(t *testing.T, base, path string) int {
	t.Helper()
	resp, err := http.Get(base + path)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}
