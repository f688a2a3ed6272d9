package main

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/record"
	"github.com/nri-gpu/nri-gpu/pkg/specs/nvidia"
)

func TestRunRejectsBadInput(t *testing.T) {
	dir := testutil.ShortDir(t)
	badConfig := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(badConfig, []byte("policy:\n  alowAll: true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		want []string
	}{
		{name: "unknown flag", args: []string{"--gpus", "1"}, want: []string{"flag provided but not defined: -gpus"}},
		{name: "unknown command", args: []string{"serve"}, want: []string{`unknown command "serve"`}},
		{name: "bad log level", args: []string{"--log-level", "loud"}, want: []string{"--log-level", "loud"}},
		{name: "config key misspelt", args: []string{"--config", badConfig}, want: []string{badConfig, "line 2", "alowAll"}},
		{name: "config file missing", args: []string{"--config", filepath.Join(dir, "none.yaml")}, want: []string{"none.yaml", "no such file"}},
		{name: "relative spec dir", args: []string{"--cdi-spec-dirs", "cdi"}, want: []string{`"cdi" is not an absolute path`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			// Never the host's NRI socket or state dir, should a case get that far.
			args := append([]string{"--socket-path", filepath.Join(dir, "nri.sock"), "--state-file", filepath.Join(dir, "state.json")}, tc.args...)
			if code := run(args, io.Discard, &stderr); code != exitUsage {
				t.Errorf("exit code %d, want %d; stderr:\n%s", code, exitUsage, stderr.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("stderr does not say %q:\n%s", w, stderr.String())
				}
			}
		})
	}
}

func TestGenerateWithoutDriver(t *testing.T) {
	out := filepath.Join(testutil.ShortDir(t), "nvidia.com-gpu.yaml")
	var stdout, stderr bytes.Buffer
	code := run([]string{"generate", "--output", out}, &stdout, &stderr)
	if _, err := os.Stat(out); code == exitOK {
		// A machine with an NVIDIA driver: the spec must be there.
		if err != nil {
			t.Errorf("exit 0 but no spec: %v", err)
		}
		return
	} else if err == nil {
		t.Errorf("exit %d but a spec was written", code)
	}
	if code != exitError || !strings.Contains(stderr.String(), "NVML is not available") || !strings.Contains(stderr.String(), "NVIDIA driver") {
		t.Errorf("exit %d, stderr %q; want 1 and a message naming NVML and the driver", code, stderr.String())
	}
}

func TestGenerateRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"generate", "--format", "toml"},
		{"generate", "--device-name-strategy", "serial", "--output", "-"},
		{"generate", "extra"},
	} {
		var stderr bytes.Buffer
		code := run(args, io.Discard, &stderr)
		if code != exitUsage {
			t.Errorf("%v: exit %d, want %d; stderr %s", args, code, exitUsage, stderr.String())
		}
	}
}

func TestDevices(t *testing.T) {
	dir := testutil.ShortDir(t)
	spec := "cdiVersion: \"0.6.0\"\nkind: example.com/nic\ndevices:\n  - name: \"0\"\n    containerEdits: {env: [A=1]}\n"
	if err := os.WriteFile(filepath.Join(dir, "nic.yaml"), []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"devices", "--cdi-spec-dirs", dir}, &stdout, &stderr); code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	for _, want := range []string{"DEVICE", "example.com/nic=0", filepath.Join(dir, "nic.yaml"), "GPUs"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, stdout.String())
		}
	}
}

func TestValidate(t *testing.T) {
	dir := testutil.ShortDir(t)
	good, bad := filepath.Join(dir, "good.yaml"), filepath.Join(dir, "bad.conf")
	if err := os.WriteFile(good, []byte("policy:\n  exclusive: true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte("policy:\n  exclusive: true\n  maxDevicesPerPod: -1\n  alowAll: true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"validate", good}, &stdout, &stderr); code != exitOK || !strings.Contains(stdout.String(), good+": ok") {
		t.Errorf("good file: exit %d, %s%s", code, stdout.String(), stderr.String())
	}
	stdout.Reset()
	code := run([]string{"validate", good, bad}, &stdout, &stderr)
	if code != exitError || !strings.Contains(stderr.String(), bad+":4: field alowAll not found") {
		t.Errorf("bad file: exit %d, stderr %s", code, stderr.String())
	}
	stderr.Reset()
	if err := os.WriteFile(bad, []byte("policy:\n  maxDevicesPerPod: -1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code := run([]string{"validate", bad}, &stdout, &stderr); code != exitError || !strings.Contains(stderr.String(), bad+":2: policy.maxDevicesPerPod: -1 is negative") {
		t.Errorf("semantic problem: exit %d, stderr %s", code, stderr.String())
	}
}

// TestMetricsAddressInUse: a metrics address nri-gpu cannot listen on
// stops it with status 1 and a message naming the flag, before it serves.
func TestMetricsAddressInUse(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	dir := testutil.ShortDir(t)
	var stderr bytes.Buffer
	code := run([]string{"--socket-path", filepath.Join(dir, "nri.sock"), "--state-file", filepath.Join(dir, "state.json"), "--cdi-spec-dirs", dir,
		"--metrics-address", l.Addr().String()}, io.Discard, &stderr)
	if code != exitError || !strings.Contains(stderr.String(), "--metrics-address") || !strings.Contains(stderr.String(), "address already in use") {
		t.Errorf("exit %d, stderr %q; want 1 and a message naming --metrics-address and why", code, stderr.String())
	}
}

// TestHelpExitsZero: --help on the plugin and on every subcommand prints
// its usage and exits 0.
func TestHelpExitsZero(t *testing.T) {
	for _, cmd := range []string{"", "generate", "devices", "explain", "access", "check", "validate", "hook"} {
		t.Run("help "+cmd, func(t *testing.T) {
			args := strings.Fields(cmd + " --help")
			var stdout, stderr bytes.Buffer
			if code := run(args, &stdout, &stderr); code != exitOK {
				t.Errorf("exit %d, want 0; stderr:\n%s", code, stderr.String())
			}
			if stdout.Len()+stderr.Len() == 0 {
				t.Error("printed no usage")
			}
		})
	}
}

func TestVersion(t *testing.T) {
	for _, arg := range []string{"version", "--version"} {
		var stdout bytes.Buffer
		if code := run([]string{arg}, &stdout, io.Discard); code != exitOK {
			t.Errorf("%s: exit %d", arg, code)
		}
		for _, w := range []string{"nri-gpu ", "commit: ", "go: go1.", "nri: ", "cdi: "} {
			if !strings.Contains(stdout.String(), w) {
				t.Errorf("%s does not say %q:\n%s", arg, w, stdout.String())
			}
		}
	}
}

// TestFlagsFromEnvironment: every flag can come from NRI_GPU_<FLAG>; the
// command line beats it.
func TestFlagsFromEnvironment(t *testing.T) {
	dir := testutil.ShortDir(t)
	base := []string{"--socket-path", filepath.Join(dir, "nri.sock"), "--state-file", filepath.Join(dir, "state.json")}
	tests := []struct {
		name string
		env  map[string]string
		args []string
		want []string
	}{
		{name: "a bad value from the environment", env: map[string]string{"NRI_GPU_LOG_LEVEL": "loud"}, want: []string{"--log-level", `"loud"`}},
		{name: "a flag that takes no value", env: map[string]string{"NRI_GPU_GENERATE_SPECS": "maybe"}, want: []string{`NRI_GPU_GENERATE_SPECS="maybe"`}},
		{name: "the command line wins", env: map[string]string{"NRI_GPU_LOG_FORMAT": "json"}, args: []string{"--log-format", "yaml"}, want: []string{"--log-format", `"yaml"`}},
		{name: "the environment over the config file", env: map[string]string{"NRI_GPU_CDI_SPEC_DIRS": "relative"}, want: []string{`"relative" is not an absolute path`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			var stderr bytes.Buffer
			if code := run(append(slices.Clone(base), tc.args...), io.Discard, &stderr); code != exitUsage {
				t.Errorf("exit %d, want %d; stderr:\n%s", code, exitUsage, stderr.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("stderr does not say %q:\n%s", w, stderr.String())
				}
			}
		})
	}
}

// TestExplainCount: explain shows what a count request chose and what it
// passed over, and why.
func TestExplainCount(t *testing.T) {
	specDir := threeGPUs(t)
	var stdout, stderr bytes.Buffer
	code := run([]string{"explain", "--cdi-spec-dirs", specDir, "--annotation", "gpu-count.nri-gpu.io=1"}, &stdout, &stderr)
	if code != exitOK {
		t.Fatalf("exit %d; stdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
	for _, want := range []string{"count    chose nvidia.com/gpu=1 (", `count    passed over nvidia.com/gpu=0:`, `"/bin/evil"`} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("explain does not say %q:\n%s", want, stdout.String())
		}
	}
}

// threeGPUs writes a spec of GPUs 0-2, GPU 0 injecting a hook outside
// policy.hookPaths, and returns its directory.
func threeGPUs(t *testing.T) string {
	t.Helper()
	dir := testutil.ShortDir(t)
	spec := "cdiVersion: \"0.6.0\"\nkind: nvidia.com/gpu\ndevices:\n"
	for i := 0; i < 3; i++ {
		node := filepath.Join(dir, fmt.Sprintf("nvidia%d", i))
		if err := os.WriteFile(node, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		hook := ""
		if i == 0 {
			hook = "      hooks: [{hookName: createContainer, path: /bin/evil}]\n"
		}
		spec += fmt.Sprintf("  - name: %q\n    containerEdits:\n      deviceNodes: [{path: /dev/nvidia%d, hostPath: %s, type: c, major: 195, minor: %d}]\n%s", fmt.Sprint(i), i, node, i, hook)
	}
	specDir := filepath.Join(dir, "cdi")
	if err := os.MkdirAll(specDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(specDir, "gpu.yaml"), []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	return specDir
}

// TestExplainWithRecord: given the running plugin's state file, explain
// sees what pods and DRA claims hold: a request for a claim's GPU is
// denied naming the claim, one for a pod's naming the pod, a count finds
// both held; the file is not written.
func TestExplainWithRecord(t *testing.T) {
	specDir := threeGPUs(t)
	record := filepath.Join(t.TempDir(), "allocations.json")
	data := `{"version":1,"pods":[{"id":"id-a","namespace":"ns","name":"a","counted":[{"name":"nvidia.com/gpu=2","nodes":["c 195:2"]}]}],` +
		`"claims":[{"uid":"uid-c","namespace":"ns","name":"c","pods":["ns/p"],"devices":[{"name":"nvidia.com/gpu=1","nodes":["c 195:1"],"requests":["gpus"]}]}]}`
	if err := os.WriteFile(record, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	code := run([]string{"explain", "--cdi-spec-dirs", specDir, "--state-file", record, "--annotation", "gpus.nri-gpu.io=1"}, &stdout, &stderr)
	if code != exitError || !strings.Contains(stdout.String(), `is held by claim ns/c of pod ns/p`) {
		t.Errorf("exit %d, want a denial naming the claim:\n%s%s", code, stdout.String(), stderr.String())
	}
	for ann, want := range map[string]string{
		"gpus.nri-gpu.io=2":      "is held by pod ns/a",
		"gpu-count.nri-gpu.io=1": "0 are free and 2 held",
	} {
		stdout.Reset()
		code = run([]string{"explain", "--cdi-spec-dirs", specDir, "--state-file", record, "--annotation", ann}, &stdout, &stderr)
		if code != exitError || !strings.Contains(stdout.String(), want) {
			t.Errorf("%s: exit %d, want a denial saying %q:\n%s", ann, code, want, stdout.String())
		}
	}
	if got, err := os.ReadFile(record); err != nil || string(got) != data {
		t.Errorf("explain changed the state file: %s, %v", got, err)
	}
}

func TestPrintTopology(t *testing.T) {
	gpus := []nvidia.GPU{{Index: 0, Minor: 0}, {Index: 1, Minor: 1}, {Index: 2, Minor: 2}}
	node := func(i int64) string { return nvidia.GPUNode(int(i)) }
	topo := nvidia.Topology{{node(0), node(1)}: nvidia.ScoreNVLink + 2, {node(0), node(2)}: nvidia.ScoreSystem, {node(1), node(2)}: nvidia.ScoreSystem}
	var out bytes.Buffer
	printTopology(&out, gpus, topo)
	fields := func(line string) string { return strings.Join(strings.Fields(line), " ") }
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	want := []string{"GPU 0 1 2", "0 - 102 10", "1 102 - 10", "2 10 10 -"}
	if len(lines) != 5 {
		t.Fatalf("topology printed as:\n%s", out.String())
	}
	for i, w := range want {
		if got := fields(lines[i+1]); got != w {
			t.Errorf("row %d: %q, want %q", i, got, w)
		}
	}
}

// TestExplainSaysWhatIsKept: with a configuration whose policy.devices no
// longer gives what a recorded pod holds, explain says the pod keeps it.
func TestExplainSaysWhatIsKept(t *testing.T) {
	specDir := threeGPUs(t)
	dir := t.TempDir()
	record, cfg := filepath.Join(dir, "allocations.json"), filepath.Join(dir, "nri-gpu.yaml")
	data := `{"version":1,"pods":[{"id":"id-a","namespace":"ns","name":"a","counted":[{"name":"nvidia.com/gpu=2","nodes":["c 195:2"]}]}]}`
	if err := os.WriteFile(record, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg, []byte("policy: {devices: [\"nvidia.com/gpu=0\", \"nvidia.com/gpu=1\"]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	code := run([]string{"explain", "--config", cfg, "--cdi-spec-dirs", specDir, "--state-file", record, "--annotation", "gpus.nri-gpu.io=1"}, &stdout, &stderr)
	want := `kept     pod ns/a holds "nvidia.com/gpu=2", which policy.devices does not allow (any more) (kept until the pod is removed)`
	if code != exitOK || !strings.Contains(stdout.String(), want) {
		t.Errorf("exit %d, want %q:\n%s%s", code, want, stdout.String(), stderr.String())
	}
}

// TestSharersShown: explain and devices show, per shared GPU, the
// policy.sharing entry, who uses it as the state file says, and each MPS
// client's bounds.
func TestSharersShown(t *testing.T) {
	specDir := threeGPUs(t)
	dir := t.TempDir()
	record, cfg := filepath.Join(dir, "allocations.json"), filepath.Join(dir, "nri-gpu.yaml")
	data := `{"version":1,"pods":[` +
		`{"id":"id-a","namespace":"ns","name":"a","named":[{"name":"nvidia.com/gpu=2","nodes":["c 195:2"]}]},` +
		`{"id":"id-b","namespace":"ns","name":"b","counted":[{"name":"nvidia.com/gpu=2","nodes":["c 195:2"]}]}]}`
	if err := os.WriteFile(record, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	config := `policy:
  sharing:
  - {devices: ["nvidia.com/gpu=2"], replicas: 2}
  - {devices: ["nvidia.com/gpu=1"], replicas: 4, strategy: mps, pinnedMemoryLimit: 4Gi}
mps: {root: /run/mps}
`
	if err := os.WriteFile(cfg, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	code := run([]string{"explain", "--config", cfg, "--cdi-spec-dirs", specDir, "--state-file", record, "--annotation", "gpus.nri-gpu.io=2"}, &stdout, &stderr)
	for _, want := range []string{
		"shared   nvidia.com/gpu=2 by policy.sharing[0] (replicas 2, timeSlicing), used by 2: pod ns/a, pod ns/b\n",
		"shared   nvidia.com/gpu=1 by policy.sharing[1] (replicas 4, mps), used by no one\n",
		"shared   nvidia.com/gpu=1: each client 25% of compute, 4096 MiB of pinned memory; daemon in /run/mps/1\n",
		"used by 2 already: pod ns/a, pod ns/b",
	} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("explain does not say %q:\n%s%s", want, stdout.String(), stderr.String())
		}
	}
	if code != exitError {
		t.Errorf("a third pod on GPU 2: exit %d, want %d", code, exitError)
	}

	stdout.Reset()
	if code := run([]string{"devices", "--config", cfg, "--cdi-spec-dirs", specDir, "--state-file", record}, &stdout, &stderr); code != exitOK {
		t.Fatalf("devices: exit %d: %s", code, stderr.String())
	}
	var rows []string
	for _, l := range strings.Split(stdout.String(), "\n") {
		if strings.HasPrefix(l, "nvidia.com/gpu=") && strings.Contains(l, "policy.sharing") {
			rows = append(rows, strings.Join(strings.Fields(l), " "))
		}
	}
	want := []string{
		"nvidia.com/gpu=1 policy.sharing[1] (replicas 4, mps) - each client 25% of compute, 4096 MiB of pinned memory; daemon in /run/mps/1",
		"nvidia.com/gpu=2 policy.sharing[0] (replicas 2, timeSlicing) pod ns/a, pod ns/b none (time-slicing)",
	}
	if !slices.Equal(rows, want) {
		t.Errorf("devices' shared rows:\n%q\nwant\n%q\n%s", rows, want, stdout.String())
	}
}

// TestRelayNeedsItsConfiguration: nri-gpu relay with a configuration that
// sets no relay directory, or no resources, says so and exits with a
// usage error rather than serving kubelet nothing.
func TestRelayNeedsItsConfiguration(t *testing.T) {
	dir := testutil.ShortDir(t)
	for name, cfg := range map[string]string{
		"no relay":     "devicePlugin:\n  resources: [{name: nvidia.com/gpu}]\n",
		"no resources": "devicePlugin:\n  relay: " + dir + "/relay\n",
	} {
		t.Run(name, func(t *testing.T) {
			file := filepath.Join(dir, "config.yaml")
			if err := os.WriteFile(file, []byte(cfg), 0o644); err != nil {
				t.Fatal(err)
			}
			var stderr bytes.Buffer
			if code := run([]string{"relay", "--config", file}, io.Discard, &stderr); code != exitUsage || !strings.Contains(stderr.String(), "sets no start.devicePlugin.relay, or no resources") {
				t.Errorf("exit %d, stderr %q", code, stderr.String())
			}
		})
	}
}

// TestWaitingToTakeOverSaysItsConfiguration: an nri-gpu started with
// --take-over while another holds the record is ready (a rolling update
// with surge goes on to stop the one it replaces), and its metrics
// already name the configuration it will serve, by the file's digest; a
// SIGTERM while it waits stops it with status 0.
func TestWaitingToTakeOverSaysItsConfiguration(t *testing.T) {
	dir := testutil.ShortDir(t)
	state := filepath.Join(dir, "state", "state.json")
	config := filepath.Join(dir, "nri-gpu.yaml")
	if err := os.MkdirAll(filepath.Dir(state), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(config, []byte("version: v1\npolicy:\n  exclusive: true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	holder := record.Open(state)
	if err := holder.Lock(); err != nil {
		t.Fatal(err)
	}
	defer holder.Unlock()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + l.Addr().String()
	l.Close()
	var stderr testutil.SyncBuffer
	exited := make(chan int, 1)
	go func() {
		exited <- run([]string{"--socket-path", filepath.Join(dir, "nri.sock"), "--state-file", state, "--cdi-spec-dirs", dir,
			"--config", config, "--take-over", "--metrics-address", l.Addr().String()}, io.Discard, &stderr)
	}()
	testutil.Within(t, 10*time.Second, "/readyz 200 while waiting to take over", func() bool {
		select {
		case code := <-exited:
			t.Fatalf("exit %d while waiting to take over:\n%s", code, stderr.String())
		default:
		}
		code, _ := httpGet(base + "/readyz")
		return code == http.StatusOK
	})
	want := fmt.Sprintf("nri_gpu_config_info{digest=%q} 1", digest(config))
	if code, body := httpGet(base + "/metrics"); code != http.StatusOK || !strings.Contains(body, want) {
		t.Errorf("/metrics (%d) while waiting to take over has no %s:\n%s", code, want, body)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-exited:
		if code != exitOK || !strings.Contains(stderr.String(), "stopped before taking over") {
			t.Errorf("exit %d, want 0 saying it stopped before taking over:\n%s", code, stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("nri-gpu still waiting 20s after SIGTERM:\n%s", stderr.String())
	}
}

// httpGet fetches url and returns its status and body (0 when it could
// not be fetched).
func httpGet(url string) (int, string) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}
