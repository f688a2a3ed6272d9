package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/containerd/nri/pkg/api"
	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/yaml"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/access"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// specDir writes a spec of two GPUs (/dev/null and /dev/zero standing in
// for their nodes) with a library mount and a hook, and returns its dir.
func specDir(t *testing.T) string {
	t.Helper()
	dir := testutil.ShortDir(t)
	spec := `cdiVersion: "0.6.0"
kind: nvidia.com/gpu
containerEdits:
  env: [NVIDIA_VISIBLE_DEVICES=void]
  mounts: [{hostPath: /usr/lib/libcuda.so.1, containerPath: /usr/lib/libcuda.so.1, options: [ro, bind]}]
  hooks: [{hookName: createContainer, path: /usr/bin/nvidia-cdi-hook, args: [nvidia-cdi-hook, update-ldcache]}]
devices:
  - name: "0"
    containerEdits: {deviceNodes: [{path: /dev/nvidia0, hostPath: /dev/null}]}
  - name: "1"
    containerEdits: {deviceNodes: [{path: /dev/nvidia1, hostPath: /dev/zero}]}
`
	if err := os.WriteFile(filepath.Join(dir, "gpu.yaml"), []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func fileMode(m os.FileMode) *os.FileMode { return &m }

// TestAccessOutput: nri-gpu access DEVICE... prints, as JSON, the record
// a container running as root would get for the devices named (short
// names taken as the default kind's): a CDI spec naming them, with the
// nodes (with the host's numbers), mounts, hooks and env; an unknown
// device is an error that names it. nri-gpu access --pod prints the
// records the plugin keeps for the pod's containers, and says when there
// are none.
func TestAccessOutput(t *testing.T) {
	dir := specDir(t)
	var stdout, stderr bytes.Buffer
	if code := run([]string{"access", "--cdi-spec-dirs", dir, "1"}, &stdout, &stderr); code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	var got cdispec.Spec
	if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, stdout.String())
	}
	want := cdispec.Spec{
		Version:     "0.6.0",
		Kind:        access.Kind,
		Annotations: map[string]string{access.FormatAnnotation: access.Format, access.DevicesAnnotation: "nvidia.com/gpu=1"},
		Devices: []cdispec.Device{{Name: access.Device, ContainerEdits: cdispec.ContainerEdits{
			DeviceNodes: []*cdispec.DeviceNode{{Path: "/dev/nvidia1", Type: "c", Major: 1, Minor: 5, FileMode: fileMode(0o666)}},
			Mounts:      []*cdispec.Mount{{HostPath: "/usr/lib/libcuda.so.1", ContainerPath: "/usr/lib/libcuda.so.1", Options: []string{"ro", "bind"}}},
			Hooks:       []*cdispec.Hook{{HookName: "createContainer", Path: "/usr/bin/nvidia-cdi-hook", Args: []string{"nvidia-cdi-hook", "update-ldcache"}, Env: []string{specs.HookEnv}}},
			Env:         []string{"NVIDIA_VISIBLE_DEVICES=void"},
		}}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("access output (-want +got):\n%s", diff)
	}

	stdout.Reset()
	code := run([]string{"access", "--cdi-spec-dirs", dir, "7"}, &stdout, &stderr)
	if code != exitError || stdout.Len() > 0 || !strings.Contains(stderr.String(), `"nvidia.com/gpu=7"`) {
		t.Errorf("unknown device: exit %d, stdout %q, stderr %q", code, stdout.String(), stderr.String())
	}
	for _, args := range [][]string{{"access", "--cdi-spec-dirs", dir}, {"access", "--pod", "ns/a", "0"}} {
		stderr.Reset()
		if code := run(args, &stdout, &stderr); code != exitUsage || !strings.Contains(stderr.String(), "usage: nri-gpu access") {
			t.Errorf("%v: exit %d, stderr %q", args, code, stderr.String())
		}
	}

	records := t.TempDir()
	rec, err := access.New(access.Container{Namespace: "ns", Pod: "a", Name: "main"}, []string{"nvidia.com/gpu=0"}, &want.Devices[0].ContainerEdits)
	if err != nil {
		t.Fatal(err)
	}
	if err := access.Open(records).Write("id-a", "c1", rec, &api.ContainerAdjustment{}); err != nil {
		t.Fatal(err)
	}
	stdout.Reset()
	if code := run([]string{"access", "--pod", "ns/a", "--access-dir", records}, &stdout, &stderr); code != exitOK {
		t.Fatalf("--pod: exit %d: %s", code, stderr.String())
	}
	var kept cdispec.Spec
	if err := json.Unmarshal(stdout.Bytes(), &kept); err != nil || kept.Annotations[access.ContainerAnnotation] != "main" || kept.Annotations[access.DevicesAnnotation] != "nvidia.com/gpu=0" {
		t.Errorf("--pod ns/a: %v, %s; want the record of its container main", err, stdout.String())
	}
	for pod, want := range map[string]string{"ns/b": "no record in " + records + " of a container of pod ns/b", "nons": `--pod "nons": want NAMESPACE/NAME`} {
		stdout.Reset()
		stderr.Reset()
		if code := run([]string{"access", "--pod", pod, "--access-dir", records}, &stdout, &stderr); code == exitOK || stdout.Len() > 0 || !strings.Contains(stderr.String(), want) {
			t.Errorf("--pod %s: exit %d, stdout %q, stderr %q; want %q", pod, code, stdout.String(), stderr.String(), want)
		}
	}
}

// TestExplainOutput: explain prints the devices a pod would get, their
// nodes, and the env and hooks; or "denied:" and why.
func TestExplainOutput(t *testing.T) {
	dir := specDir(t)
	var stdout, stderr bytes.Buffer
	if code := run([]string{"explain", "--cdi-spec-dirs", dir, "--annotation", "gpus.nri-gpu.io=0"}, &stdout, &stderr); code != exitOK {
		t.Fatalf("exit %d: %s%s", code, stdout.String(), stderr.String())
	}
	for _, want := range []string{"nvidia.com/gpu=0", "/dev/nvidia0", "NVIDIA_VISIBLE_DEVICES=void", "/usr/bin/nvidia-cdi-hook"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("explain does not show %q:\n%s", want, stdout.String())
		}
	}
	if strings.Contains(stdout.String(), "/dev/nvidia1") {
		t.Errorf("explain shows a device not asked for:\n%s", stdout.String())
	}

	stdout.Reset()
	code := run([]string{"explain", "--cdi-spec-dirs", dir, "--annotation", "gpus.nri-gpu.io=all"}, &stdout, &stderr)
	if code != exitError || !strings.HasPrefix(stdout.String(), "denied: ") || !strings.Contains(stdout.String(), "policy.allowAll") {
		t.Errorf("a denied request: exit %d, output %q", code, stdout.String())
	}

	stdout.Reset()
	if code := run([]string{"explain", "--cdi-spec-dirs", dir, "--output", "json", "--annotation", "gpus.nri-gpu.io=1"}, &stdout, &stderr); code != exitOK {
		t.Fatalf("json: exit %d: %s", code, stderr.String())
	}
	var out map[string]any
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil || !strings.Contains(stdout.String(), "/dev/nvidia1") {
		t.Errorf("json output %q: %v", stdout.String(), err)
	}
}

// TestCheckOutput: check prints one line per finding, its status first,
// and the fix under a failure; it exits 1 when one fails.
func TestCheckOutput(t *testing.T) {
	dir := specDir(t) // its hook, /usr/bin/nvidia-cdi-hook, is not on this machine
	sock := filepath.Join(testutil.ShortDir(t), "nri.sock")
	check := func() (int, []string) {
		t.Helper()
		var stdout, stderr bytes.Buffer
		code := run([]string{"check", "--cdi-spec-dirs", dir, "--containerd-config", "", "--socket-path", sock}, &stdout, &stderr)
		var lines []string
		for _, l := range strings.Split(strings.TrimRight(stdout.String(), "\n"), "\n") {
			lines = append(lines, strings.Join(strings.Fields(l), " "))
		}
		return code, lines
	}
	if _, err := os.Stat("/usr/bin/nvidia-cdi-hook"); err == nil {
		t.Skip("this machine has /usr/bin/nvidia-cdi-hook")
	}
	code, lines := check()
	want := []string{
		"OK nri-gpu config none given: the defaults apply",
		"FAIL NRI socket " + sock + " does not answer",
		"OK spec dir " + dir + " exists and is trusted",
		"OK devices 2 devices can be injected",
		"FAIL hook /usr/bin/nvidia-cdi-hook (for nvidia.com/gpu=0, nvidia.com/gpu=1) does not exist",
		"fix: install it, or regenerate the specs",
	}
	if code != exitError {
		t.Errorf("exit %d, want %d", code, exitError)
	}
	for _, w := range want {
		if !slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, w) }) {
			t.Errorf("no line %q in:\n%s", w, strings.Join(lines, "\n"))
		}
	}
	if i := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, "FAIL NRI socket") }); i < 0 || i+1 == len(lines) || !strings.HasPrefix(lines[i+1], "fix: ") {
		t.Errorf("the socket's failure is not followed by its fix:\n%s", strings.Join(lines, "\n"))
	}

	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	code, lines = check()
	if code != exitError || !slices.Contains(lines, "OK NRI socket "+sock+" answers") || slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, "FAIL NRI") }) {
		t.Errorf("socket there: exit %d:\n%s", code, strings.Join(lines, "\n"))
	}
}

// TestGenerateOutput: generate writes the CDI spec of the GPUs NVML
// reports (go-nvml's mock of two A100s here): both GPUs by index and
// UUID, "all", the driver's libraries and the hooks, run by the hook path
// given; "-" writes it to standard output.
func TestGenerateOutput(t *testing.T) {
	s := testutil.NVML(2)
	mock := func(string) nvml.Interface { return s }
	root, err := filepath.Abs("../../pkg/specs/nvidia/testdata/minimal-root")
	if err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	code := runGenerate([]string{"--driver-root", root, "--hook-path", "/usr/bin/nvidia-cdi-hook", "--output", "-"}, &stdout, &stderr, mock)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	var spec cdispec.Spec
	if err := yaml.UnmarshalStrict(stdout.Bytes(), &spec); err != nil {
		t.Fatalf("output is not a CDI spec: %v\n%s", err, stdout.String())
	}
	var names []string
	for _, d := range spec.Devices {
		names = append(names, d.Name)
	}
	uuid0, _ := s.Devices[0].GetUUID()
	if spec.Kind != "nvidia.com/gpu" || !slices.Contains(names, "0") || !slices.Contains(names, "1") || !slices.Contains(names, uuid0) || !slices.Contains(names, "all") {
		t.Errorf("kind %q, devices %v", spec.Kind, names)
	}
	var hooks []string
	for _, h := range spec.ContainerEdits.Hooks {
		hooks = append(hooks, h.Path)
	}
	if len(hooks) == 0 || slices.ContainsFunc(hooks, func(p string) bool { return p != "/usr/bin/nvidia-cdi-hook" }) {
		t.Errorf("hooks run %v, want /usr/bin/nvidia-cdi-hook", hooks)
	}
	var mounts []string
	for _, m := range spec.ContainerEdits.Mounts {
		mounts = append(mounts, m.ContainerPath)
	}
	if !slices.Contains(mounts, "/usr/lib64/libcuda.so.550.54.15") {
		t.Errorf("mounts %v lack the driver's libcuda", mounts)
	}

	out := filepath.Join(testutil.ShortDir(t), "gpu.json")
	stderr.Reset()
	if code := runGenerate([]string{"--driver-root", root, "--output", out}, &stdout, &stderr, mock); code != exitOK {
		t.Fatalf("to a file: exit %d: %s", code, stderr.String())
	}
	data, err := os.ReadFile(out)
	if err != nil || !json.Valid(data) {
		t.Errorf("%s: not JSON (from its name): %v", out, err)
	}
	if !strings.Contains(stderr.String(), "wrote "+out+" (5 devices, CDI ") {
		t.Errorf("generate does not say what it wrote: %q", stderr.String())
	}
}

// TestCheckDRADriver: with DRA on, check says where nri-gpu finds its
// DRA driver's program, and fails when it finds none; with DRA off it
// does not look.
func TestCheckDRADriver(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfg, []byte("version: v1\nstart:\n  dra: {enabled: true, nodeName: node-1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin)
	check := func(args ...string) string {
		t.Helper()
		var stdout, stderr bytes.Buffer
		run(append([]string{"check", "--containerd-config", "", "--state-file", "", "--socket-path", filepath.Join(testutil.ShortDir(t), "nri.sock")}, args...), &stdout, &stderr)
		return strings.Join(strings.Fields(stdout.String()), " ")
	}
	if out := check("--config", cfg); !strings.Contains(out, "FAIL DRA driver start.dra.enabled, but nri-gpu-dra is neither beside nri-gpu nor on the PATH") {
		t.Errorf("no driver anywhere:\n%s", out)
	}
	driver := filepath.Join(bin, "nri-gpu-dra")
	if err := os.WriteFile(driver, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if out := check("--config", cfg); !strings.Contains(out, "OK DRA driver "+driver+": nri-gpu starts it") {
		t.Errorf("the driver on the PATH:\n%s", out)
	}
	if out := check(); strings.Contains(out, "DRA driver") {
		t.Errorf("DRA off, yet:\n%s", out)
	}
}

// TestGenerateHookFree: with --hook-free the spec has no hook, neither
// its own nor a device's, its mounts are kept, and generate says what it
// left out.
func TestGenerateHookFree(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("making the GPUs' device nodes needs root")
	}
	s := testutil.NVML(2)
	mock := func(string) nvml.Interface { return s }
	root, err := filepath.Abs("../../pkg/specs/nvidia/testdata/minimal-root")
	if err != nil {
		t.Fatal(err)
	}
	devRoot := t.TempDir()
	for i := range 2 {
		if err := os.MkdirAll(filepath.Join(devRoot, "dev"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mknod(filepath.Join(devRoot, "dev", fmt.Sprintf("nvidia%d", i)), unix.S_IFCHR|0o666, int(unix.Mkdev(195, uint32(i)))); err != nil {
			t.Fatal(err)
		}
	}
	for _, hookFree := range []bool{false, true} {
		var stdout, stderr bytes.Buffer
		args := []string{"--driver-root", root, "--dev-root", devRoot, "--output", "-"}
		if hookFree {
			args = append(args, "--hook-free")
		}
		if code := runGenerate(args, &stdout, &stderr, mock); code != exitOK {
			t.Fatalf("%v: exit %d: %s", args, code, stderr.String())
		}
		var spec cdispec.Spec
		if err := yaml.UnmarshalStrict(stdout.Bytes(), &spec); err != nil {
			t.Fatal(err)
		}
		hooks := len(spec.ContainerEdits.Hooks)
		for _, d := range spec.Devices {
			hooks += len(d.ContainerEdits.Hooks)
		}
		if hookFree != (hooks == 0) {
			t.Errorf("--hook-free %v: %d hooks", hookFree, hooks)
		}
		if !slices.ContainsFunc(spec.ContainerEdits.Mounts, func(m *cdispec.Mount) bool { return m.ContainerPath == "/usr/lib64/libcuda.so.550.54.15" }) {
			t.Errorf("--hook-free %v: the driver's libcuda not mounted", hookFree)
		}
		if said := strings.Contains(stderr.String(), "left out enable-cuda-compat"); said != hookFree {
			t.Errorf("--hook-free %v: stderr %q", hookFree, stderr.String())
		}
	}
}

// TestHelp: nri-gpu help and nri-gpu --help list every command with a
// line, and the plugin's flags; nri-gpu help COMMAND and COMMAND --help
// show that command's flags and exit 0; an unknown command says where
// the list is.
func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"help"}, {"--help"}, {"-h"}} {
		var stdout, stderr bytes.Buffer
		if code := run(args, &stdout, &stderr); code != exitOK {
			t.Errorf("nri-gpu %s: exit %d, want 0; %s", strings.Join(args, " "), code, stderr.String())
		}
		for _, c := range subcommands() {
			if !slices.ContainsFunc(strings.Split(stdout.String(), "\n"), func(l string) bool {
				return strings.HasPrefix(strings.TrimSpace(l), c.name+" ") && strings.Contains(l, c.summary)
			}) {
				t.Errorf("nri-gpu %s does not list %s with its line:\n%s", strings.Join(args, " "), c.name, stdout.String())
			}
		}
		for _, flag := range []string{"-config", "-socket-path", "-state-file", "-access-dir", "-take-over", "-metrics-address", "-generate-specs"} {
			if !strings.Contains(stdout.String(), flag+" ") && !strings.Contains(stdout.String(), flag+"\n") {
				t.Errorf("nri-gpu %s does not list the plugin's flag %s", strings.Join(args, " "), flag)
			}
		}
	}
	// Each command's flags, one of them named.
	for _, tc := range []struct{ command, flag string }{
		{"generate", "-output"}, {"devices", "-config"}, {"explain", "-config"}, {"access", "-pod"},
		{"check", "-containerd-config"}, {"validate", "FILE"}, {"relay", "-config"}, {"hook", "create-symlinks"},
		{"install", ""}, {"version", ""}, {"mps-shm", "--root"},
	} {
		for _, args := range [][]string{{tc.command, "--help"}, {"help", tc.command}} {
			var stdout, stderr bytes.Buffer
			code := run(args, &stdout, &stderr)
			out := stdout.String() + stderr.String()
			if code != exitOK || !strings.Contains(strings.ToLower(out), "usage") || !strings.Contains(out, tc.flag) {
				t.Errorf("nri-gpu %s: exit %d, want 0 and its usage naming %q:\n%s", strings.Join(args, " "), code, tc.flag, out)
			}
		}
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"bogus"}, &stdout, &stderr); code != exitUsage || !strings.Contains(stderr.String(), "nri-gpu help lists") {
		t.Errorf("nri-gpu bogus: exit %d, %q; want 2 and where the commands are listed", code, stderr.String())
	}
}
