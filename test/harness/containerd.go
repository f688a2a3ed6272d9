package harness

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"text/template"
	"time"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// Options configure a containerd run.
type Options struct {
	// EnableCDI turns on containerd's own CDI support (off by default, as
	// on containerd 1.7).
	EnableCDI bool
	// CDISpecDirs are containerd's cdi_spec_dirs, used when EnableCDI is set.
	CDISpecDirs []string
	// Image is the image tar to import; BuildImage makes it.
	Image string
	// DefaultValidator enables NRI's default validator (containerd 2.2+),
	// which fails containers whose pods require a plugin that is absent.
	DefaultValidator bool
	// RejectHooks turns on the default validator's
	// reject_oci_hook_adjustment: a container to which a plugin adds an
	// OCI hook is refused (DefaultValidator is implied).
	RejectHooks bool
	// PreRegister, when set, installs nri-gpu as the pre-registered plugin
	// 10-nri-gpu, which containerd starts itself and hands this
	// configuration (plugin_config_path/10-nri-gpu.conf).
	PreRegister string
	// Prefix is a command that runs containerd (a node's nsenter into its
	// mount namespace).
	Prefix []string
	// GVisor, when set, is a directory holding gVisor's runsc and
	// containerd-shim-runsc-v1: containerd then has the runtime handler
	// GVisorHandler, which runs a pod's sandbox in gVisor (systrap
	// platform; no network: the harness's pods share the host's; nvproxy
	// told the driver's ABI, "latest", as a fake GPU has no kernel driver
	// to ask).
	GVisor string
	// SystemdCgroup runs containers with runc's systemd cgroup driver
	// (SystemdCgroup = true, as kubelet's cgroupDriver: systemd asks): a
	// pod's cgroup is a slice of its own (Pod's cgroup parent), each
	// container a scope systemd knows. It needs systemd as PID 1.
	// SystemdCgroupEnv=1 sets it for every containerd a run starts (the
	// node's driver, as on the cgroup v2 test node).
	SystemdCgroup bool
}

// SystemdCgroupEnv, set to 1, runs every containerd with runc's systemd
// cgroup driver (Options.SystemdCgroup).
const SystemdCgroupEnv = "NRI_GPU_SYSTEMD_CGROUP"

// GVisorHandler is the runtime handler (a RuntimeClass's handler) of
// gVisor's runsc, where Options.GVisor is set.
const GVisorHandler = "runsc"

// Containerd is a running throwaway containerd, or CRI-O (StartCRIO):
// a CRI runtime with NRI, which crictl and nri-gpu talk to alike.
type Containerd struct {
	Dir     string
	Tools   Tools
	Address string
	NRISock string
	LogPath string
	cfgPath string
	prefix  []string
	cmd     *exec.Cmd
	done    chan error
	plugins []*Plugin
	// crictl is the tools' crictl, fixed at the start: a forwarder asks
	// it while Upgrade changes Tools.
	crictl string
	// crio, when set, makes this CRI-O: the binaries it runs.
	crio *CRIOTools
	// systemd: containers run under runc's systemd cgroup driver, each
	// pod in a slice of its own.
	systemd bool
}

// configCommon is what the configurations of every version share: where
// containerd keeps its state and sockets, all below the run's directory.
const configCommon = `{{define "common"}}[grpc]
  address = "{{.Dir}}/containerd.sock"

[ttrpc]
  address = "{{.Dir}}/containerd.sock.ttrpc"

[debug]
  address = "{{.Dir}}/debug.sock"
  level = "info"

[plugins."io.containerd.internal.v1.opt"]
  path = "{{.Dir}}/opt"
{{end}}`

const configTemplate = `version = 2
root = "{{.Dir}}/root"
state = "{{.Dir}}/state"
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]

{{template "common" .}}

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{{.Image}}"
  restrict_oom_score_adj = true
  enable_cdi = {{.EnableCDI}}
  cdi_spec_dirs = [{{.CDIDirs}}]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "{{.Runc}}"
        SystemdCgroup = {{.SystemdCgroup}}
{{- if .GVisor}}
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runsc]
      runtime_type = "io.containerd.runsc.v1"
      runtime_path = "{{.GVisor}}/containerd-shim-runsc-v1"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runsc.options]
        TypeUrl = "io.containerd.runsc.v1.options"
        ConfigPath = "{{.Dir}}/runsc.toml"
{{- end}}
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{{.Dir}}/cni/bin"
    conf_dir = "{{.Dir}}/cni/conf"

[plugins."io.containerd.nri.v1.nri"]
  disable = false
  socket_path = "{{.Dir}}/nri/nri.sock"
  plugin_path = "{{.Dir}}/nri/plugins"
  plugin_config_path = "{{.Dir}}/nri/conf.d"
  plugin_registration_timeout = "5s"
  plugin_request_timeout = "2s"
`

const configTemplateV3 = `version = 3
root = "{{.Dir}}/root"
state = "{{.Dir}}/state"
disabled_plugins = [
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.erofs",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]

{{template "common" .}}

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{{.Image}}"

[plugins.'io.containerd.cri.v1.runtime']
  enable_cdi = {{.EnableCDI}}
  cdi_spec_dirs = [{{.CDIDirs}}]
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "{{.Runc}}"
        SystemdCgroup = {{.SystemdCgroup}}
{{- if .GVisor}}
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runsc]
      runtime_type = "io.containerd.runsc.v1"
      runtime_path = "{{.GVisor}}/containerd-shim-runsc-v1"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runsc.options]
        TypeUrl = "io.containerd.runsc.v1.options"
        ConfigPath = "{{.Dir}}/runsc.toml"
{{- end}}
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{{.Dir}}/cni/bin"]
    conf_dir = "{{.Dir}}/cni/conf"

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins.'io.containerd.nri.v1.nri']
  disable = false
  socket_path = "{{.Dir}}/nri/nri.sock"
  plugin_path = "{{.Dir}}/nri/plugins"
  plugin_config_path = "{{.Dir}}/nri/conf.d"
  plugin_registration_timeout = "5s"
  plugin_request_timeout = "2s"
  [plugins.'io.containerd.nri.v1.nri'.default_validator]
    enable = {{.Validator}}
    reject_oci_hook_adjustment = {{.RejectHooks}}
`

// runscConfig is the configuration of gVisor's shim (ConfigPath of the
// runsc runtime): the runsc it runs and runsc's own flags.
const runscConfig = `binary_name = "{{.GVisor}}/runsc"
root = "{{.Dir}}/runsc"

[runsc_config]
  platform = "systrap"
  network = "none"
  nvproxy-driver-version = "latest"
  debug-log = "{{.Dir}}/runsc-logs/"
`

// StartContainerd writes a config under dir, starts containerd, waits for
// CRI to answer and imports the image. On error it cleans up what it began.
func StartContainerd(dir string, tools Tools, opts Options) (c *Containerd, err error) {
	c = &Containerd{
		Dir:     dir,
		Tools:   tools,
		Address: filepath.Join(dir, "containerd.sock"),
		NRISock: filepath.Join(dir, "nri", "nri.sock"),
		LogPath: filepath.Join(dir, "containerd.log"),
		prefix:  opts.Prefix,
		crictl:  tools.Path("crictl"),
		systemd: opts.SystemdCgroup || os.Getenv(SystemdCgroupEnv) == "1",
	}
	if err := makeDirs(dir, "root", "state", "opt", "nri/plugins", "nri/conf.d", "cni/bin", "cni/conf", "logs"); err != nil {
		return nil, err
	}
	var cfg bytes.Buffer
	tmpl := configTemplate
	if tools.Containerd2() {
		tmpl = configTemplateV3
	} else if opts.DefaultValidator || opts.RejectHooks {
		return nil, fmt.Errorf("containerd %s has no NRI default validator", tools.ContainerdVersion)
	}
	if err := template.Must(template.Must(template.New("config").Parse(configCommon)).Parse(tmpl)).Execute(&cfg, map[string]any{
		"Dir": dir, "Image": ImageRef, "EnableCDI": opts.EnableCDI,
		"CDIDirs": quotedList(opts.CDISpecDirs), "Runc": tools.Runc, "Validator": opts.DefaultValidator || opts.RejectHooks, "RejectHooks": opts.RejectHooks,
		"GVisor": opts.GVisor, "SystemdCgroup": c.systemd,
	}); err != nil {
		return nil, err
	}
	if opts.GVisor != "" {
		var runsc bytes.Buffer
		if err := template.Must(template.New("runsc").Parse(runscConfig)).Execute(&runsc, map[string]any{"Dir": dir, "GVisor": opts.GVisor}); err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(dir, "runsc.toml"), runsc.Bytes(), 0o644); err != nil {
			return nil, err
		}
	}
	if opts.PreRegister != "" {
		if err := preRegister(tools.Path("nri-gpu"), dir, opts.PreRegister); err != nil {
			return nil, err
		}
	}
	cfgPath := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfgPath, cfg.Bytes(), 0o644); err != nil {
		return nil, err
	}
	c.cfgPath = cfgPath
	defer func() {
		if err != nil {
			_ = c.Stop()
		}
	}()
	if err := c.start(); err != nil {
		return c, err
	}
	if opts.Image != "" {
		if err := c.ImportImage(opts.Image); err != nil {
			return c, err
		}
	}
	return c, nil
}

// start starts the containerd process and waits until CRI answers.
func (c *Containerd) start() error {
	logFile, err := os.OpenFile(c.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logFile.Close()
	argv := append(slices.Clone(c.prefix), c.Tools.Path("containerd"), "--config", c.cfgPath)
	if c.crio != nil {
		argv = append(slices.Clone(c.prefix), c.crio.Crio, "--config", c.cfgPath, "--config-dir", filepath.Join(c.Dir, "crio.conf.d"))
	}
	c.cmd = exec.Command(argv[0], argv[1:]...)
	// containerd finds its shim on PATH: its own release's first.
	c.cmd.Env = append(os.Environ(), "PATH="+c.Tools.ContainerdDir+":"+c.Tools.Dir+":"+os.Getenv("PATH"))
	c.cmd.Stdout, c.cmd.Stderr = logFile, logFile
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := c.cmd.Start(); err != nil {
		return fmt.Errorf("starting containerd: %w", err)
	}
	c.done = make(chan error, 1)
	go func(cmd *exec.Cmd, done chan error) { done <- cmd.Wait() }(c.cmd, c.done)
	return c.waitReady(30 * time.Second)
}

// Restart stops containerd with SIGTERM, as an upgrade or a restart by
// systemd does, leaving pods, shims and plugins running, and starts it
// again.
func (c *Containerd) Restart() error {
	if err := c.terminate(); err != nil {
		return err
	}
	return c.start()
}

// terminate stops containerd with SIGTERM, leaving pods, shims and
// plugins running, and waits for it to exit.
func (c *Containerd) terminate() error {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-c.done:
		c.done <- err
		return nil
	case <-time.After(15 * time.Second):
		return fmt.Errorf("containerd did not stop on SIGTERM")
	}
}

// Upgrade moves this containerd to the release of to in place, as
// containerd documents an upgrade from 1.7 to 2.x: containerd stopped
// with SIGTERM (pods, shims and plugins left running), its configuration
// migrated by the new release's own `containerd config migrate` (the old
// one kept beside it, as config.toml.<old version>), the runc it names
// replaced by the one the new release ships with, and the new containerd
// started on the same state. With cdiSpecDirs, its own CDI is turned on
// with them, as docs/deploying.md has it (`config migrate` keeps an
// `enable_cdi = false`, under which 2.x refuses a container whose CRI
// request names CDI devices).
func (c *Containerd) Upgrade(to Tools, cdiSpecDirs ...string) error {
	if err := c.terminate(); err != nil {
		return err
	}
	old, err := os.ReadFile(c.cfgPath)
	if err != nil {
		return err
	}
	if err := os.WriteFile(c.cfgPath+"."+c.Tools.ContainerdVersion, old, 0o644); err != nil {
		return err
	}
	migrated, err := exec.Command(to.Path("containerd"), "--config", c.cfgPath, "config", "migrate").Output()
	if err != nil {
		return fmt.Errorf("containerd %s config migrate: %w", to.ContainerdVersion, err)
	}
	for _, q := range []func(string) string{strconv.Quote, func(s string) string { return "'" + s + "'" }} {
		migrated = bytes.ReplaceAll(migrated, []byte(q(c.Tools.Runc)), []byte(q(to.Runc)))
	}
	if len(cdiSpecDirs) > 0 {
		migrated = enableCDI.ReplaceAll(migrated, []byte("enable_cdi = true"))
		migrated = cdiDirs.ReplaceAll(migrated, []byte("cdi_spec_dirs = ["+quotedList(cdiSpecDirs)+"]"))
	}
	if err := os.WriteFile(c.cfgPath, migrated, 0o644); err != nil {
		return err
	}
	c.Tools = to
	return c.start()
}

// makeDirs makes the directories below dir a run's configuration names.
func makeDirs(dir string, below ...string) error {
	for _, d := range below {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	return nil
}

// quotedList is a TOML list's items: each of ss quoted.
func quotedList(ss []string) string {
	quoted := make([]string, len(ss))
	for i, s := range ss {
		quoted[i] = strconv.Quote(s)
	}
	return strings.Join(quoted, ", ")
}

// The settings of containerd's own CDI in a migrated configuration.
var (
	enableCDI = regexp.MustCompile(`enable_cdi = false`)
	cdiDirs   = regexp.MustCompile(`cdi_spec_dirs = \[[^\]]*\]`)
)

// ConfigPath returns the path of this containerd's config.toml.
func (c *Containerd) ConfigPath() string { return c.cfgPath }

// preRegister installs the plugin binary and its configuration where
// containerd looks for pre-registered plugins.
func preRegister(binary, dir, config string) error {
	data, err := os.ReadFile(binary)
	if err != nil {
		return err
	}
	// containerd starts a pre-registered plugin with no arguments: a
	// script hands the binary a state file in dir, not the host's.
	bin := filepath.Join(dir, "nri", "nri-gpu")
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		return err
	}
	script := fmt.Sprintf("#!/bin/sh\nexec %q --state-file %q --access-dir %q \"$@\"\n", bin, StateFile(dir, "nri-gpu-preregistered"), AccessDir(dir, "nri-gpu-preregistered"))
	if err := os.WriteFile(filepath.Join(dir, "nri", "plugins", "10-nri-gpu"), []byte(script), 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "nri", "conf.d", "10-nri-gpu.conf"), []byte(config), 0o644)
}

func (c *Containerd) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		select {
		case err := <-c.done:
			c.done <- err
			return fmt.Errorf("containerd exited: %v; log:\n%s", err, c.LogTail(40))
		default:
		}
		if _, err := c.Crictl("info"); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("containerd not ready after %s; log:\n%s", timeout, c.LogTail(40))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// LogTail returns the last n lines of containerd's log.
func (c *Containerd) LogTail(n int) string { return tail(c.LogPath, n) }

func tail(path string, n int) string {
	data, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// run runs a tool with a timeout and returns its output: standard output
// when it succeeds, and standard error after it when it fails.
func run(timeout time.Duration, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return strings.TrimSpace(stdout.String() + "\n" + stderr.String()), err
	}
	return strings.TrimSpace(stdout.String()), nil
}

// Crictl runs crictl against this containerd.
func (c *Containerd) Crictl(args ...string) (string, error) {
	ep := "unix://" + c.Address
	return c.run(c.crictl, append([]string{"--config", c.crictlConfig(), "--runtime-endpoint", ep, "--image-endpoint", ep, "--timeout", "30s"}, args...)...)
}

// crictlConfig returns an empty crictl config of this run, so that crictl
// reads no config of the host.
func (c *Containerd) crictlConfig() string {
	path := filepath.Join(c.Dir, "crictl.yaml")
	if _, err := os.Stat(path); err != nil {
		_ = os.WriteFile(path, nil, 0o644)
	}
	return path
}

// Ctr runs ctr in the k8s.io namespace against this containerd.
func (c *Containerd) Ctr(args ...string) (string, error) {
	return c.run(c.Tools.Path("ctr"), append([]string{"--address", c.Address, "-n", "k8s.io"}, args...)...)
}

// run runs a client of this containerd where containerd runs (after its
// prefix: a node's mount namespace, where the paths it names are).
func (c *Containerd) run(name string, args ...string) (string, error) {
	argv := append(slices.Clone(c.prefix), name)
	return run(60*time.Second, argv[0], append(argv[1:], args...)...)
}

// Pod describes a pod sandbox for crictl.
type Pod struct {
	Name, Namespace string
	Annotations     map[string]string
	// UserNS runs the pod in a user namespace of its own (CRI's
	// userns_options, mode POD): uids and gids 0 to 65535 inside are
	// UserNSHost and up on the host.
	UserNS bool
	// RuntimeHandler runs the pod with that runtime handler of
	// containerd's (GVisorHandler) instead of the default runc.
	RuntimeHandler string
	// ownPID gives each container a PID namespace of its own: on CRI-O,
	// whose pod infra container (a shared PID namespace's) sets an
	// oom_score_adj these machines refuse, so that it is dropped.
	ownPID bool
	// cgroupParent is the pod's cgroup parent: under the systemd cgroup
	// driver a slice of its own, named as kubelet names a BestEffort
	// pod's.
	cgroupParent string
}

// UserNSHost is the first host uid and gid of a UserNS pod's range.
const UserNSHost = 4 << 16

// containerLinux is the linux part of a container's CRI config: a
// UserNS pod's containers must have its user namespace; ctr's user and
// groups.
func (p Pod) containerLinux(ctr Container) map[string]any {
	sc := map[string]any{}
	if p.UserNS || p.ownPID {
		sc["namespace_options"] = p.namespaceOptions()
	}
	if ctr.User != nil {
		sc["run_as_user"] = map[string]any{"value": *ctr.User}
		sc["run_as_group"] = map[string]any{"value": *ctr.User}
	}
	if len(ctr.Groups) > 0 {
		sc["supplemental_groups"] = ctr.Groups
	}
	if len(sc) == 0 {
		return map[string]any{}
	}
	return map[string]any{"security_context": sc}
}

// namespaceOptions are the CRI namespace options of the pod.
func (p Pod) namespaceOptions() map[string]any {
	opts := map[string]any{"network": 2}
	if p.ownPID {
		opts["pid"] = 1
	}
	if p.UserNS {
		ids := []map[string]any{{"host_id": UserNSHost, "container_id": 0, "length": 65536}}
		opts["userns_options"] = map[string]any{"mode": 0, "uids": ids, "gids": ids}
	}
	return opts
}

// Container describes a container for crictl.
type Container struct {
	Name        string
	Annotations map[string]string
	Command     []string
	Env         map[string]string
	// CDIDevices are the CDI devices of its CRI request, as kubelet asks
	// them for a device plugin's allocation.
	CDIDevices []string
	// Mounts are host paths bound into the container, as a pod's
	// volumes are.
	Mounts []Mount
	// User, when set, is the uid and gid the container runs as (else the
	// image's, root); Groups its supplemental groups.
	User   *int64
	Groups []int64
	// Unlabelled leaves out the label kubelet sets with the container's
	// name (io.kubernetes.container.name), which CRI-O names the container
	// to NRI by.
	Unlabelled bool
}

// labels are a container's CRI labels: the one kubelet sets with its
// name, unless ctr is Unlabelled.
func (c *Containerd) labels(ctr Container) map[string]string {
	if ctr.Unlabelled {
		return nil
	}
	return map[string]string{"io.kubernetes.container.name": ctr.Name}
}

// Mount is a host path bound into a container.
type Mount struct {
	HostPath, ContainerPath string
	ReadOnly                bool
}

func (c *Containerd) writeJSON(name string, v any) (string, error) {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return "", err
	}
	f, err := os.CreateTemp(c.Dir, name+"-*.json")
	if err != nil {
		return "", err
	}
	defer f.Close()
	_, err = f.Write(data)
	return f.Name(), err
}

func (p Pod) config(logDir string) map[string]any {
	return map[string]any{
		"metadata":      map[string]any{"name": p.Name, "namespace": p.Namespace, "uid": p.uid(), "attempt": 0},
		"annotations":   p.Annotations,
		"log_directory": logDir,
		"linux": map[string]any{"cgroup_parent": p.cgroupParent, "security_context": map[string]any{
			"namespace_options": p.namespaceOptions(),
		}},
	}
}

// Slice is the systemd slice the pod runs in under the systemd cgroup
// driver: kubelet's name for a BestEffort pod's, its UID's dashes
// underscores (a dash in a slice's name nests it).
func (p Pod) Slice() string {
	return "kubepods-besteffort-pod" + strings.ReplaceAll(p.uid(), "-", "_") + ".slice"
}

// uid is the pod's UID as the harness gives it to the runtime.
func (p Pod) uid() string { return p.Namespace + "-" + p.Name }

// forRuntime is the pod as this runtime runs it: on CRI-O with a PID
// namespace per container; under the systemd cgroup driver in a slice of
// its own (kubelet's name for a BestEffort pod's: its UID's dashes are
// underscores, as a dash in a slice's name nests it).
func (c *Containerd) forRuntime(p Pod) Pod {
	p.ownPID = c.crio != nil
	if c.systemd {
		p.cgroupParent = p.Slice()
	}
	return p
}

// RunPod runs a pod sandbox and returns its id.
func (c *Containerd) RunPod(p Pod) (string, error) {
	p = c.forRuntime(p)
	path, err := c.writeJSON("pod", p.config(filepath.Join(c.Dir, "logs", p.Namespace+"-"+p.Name)))
	if err != nil {
		return "", err
	}
	out, err := c.Crictl("runp", "--runtime", p.RuntimeHandler, path)
	if err != nil {
		return "", fmt.Errorf("crictl runp: %w: %s", err, out)
	}
	return LastLine(out), nil
}

// CreateContainer creates a container in a pod, never pulling, and
// returns its id. The error carries crictl's output, which holds the
// reason a plugin gave.
func (c *Containerd) CreateContainer(podID string, p Pod, ctr Container) (string, error) {
	p = c.forRuntime(p)
	podPath, err := c.writeJSON("pod", p.config(filepath.Join(c.Dir, "logs", p.Namespace+"-"+p.Name)))
	if err != nil {
		return "", err
	}
	cmd := ctr.Command
	if cmd == nil {
		cmd = []string{"/bin/sleep", "3600"}
	}
	var envs []map[string]string
	for k, v := range ctr.Env {
		envs = append(envs, map[string]string{"key": k, "value": v})
	}
	var mounts []map[string]any
	for _, m := range ctr.Mounts {
		mounts = append(mounts, map[string]any{"host_path": m.HostPath, "container_path": m.ContainerPath, "readonly": m.ReadOnly})
	}
	config := map[string]any{
		"envs":        envs,
		"mounts":      mounts,
		"metadata":    map[string]any{"name": ctr.Name},
		"image":       map[string]any{"image": ImageRef},
		"command":     cmd,
		"annotations": ctr.Annotations,
		"labels":      c.labels(ctr),
		"log_path":    ctr.Name + ".log",
		"linux":       p.containerLinux(ctr),
	}
	if len(ctr.CDIDevices) > 0 {
		var cdi []map[string]string
		for _, d := range ctr.CDIDevices {
			cdi = append(cdi, map[string]string{"name": d})
		}
		config["CDI_devices"] = cdi
	}
	ctrPath, err := c.writeJSON("container", config)
	if err != nil {
		return "", err
	}
	out, err := c.Crictl("create", "--no-pull", podID, ctrPath, podPath)
	if err != nil {
		return "", fmt.Errorf("crictl create: %w: %s", err, out)
	}
	return LastLine(out), nil
}

// StartContainer starts a created container.
func (c *Containerd) StartContainer(id string) error {
	if out, err := c.Crictl("start", id); err != nil {
		return fmt.Errorf("crictl start: %w: %s", err, out)
	}
	return nil
}

// Exec runs a command in a running container and returns its output.
func (c *Containerd) Exec(id string, cmd ...string) (string, error) {
	return c.Crictl(append([]string{"exec", id}, cmd...)...)
}

// ContainerSpec returns the final OCI spec of a container, as
// `ctr -n k8s.io containers info` prints it.
func (c *Containerd) ContainerSpec(id string) (*oci.Spec, error) {
	if c.crio != nil {
		return c.inspectSpec(id)
	}
	out, err := c.Ctr("containers", "info", id)
	if err != nil {
		return nil, fmt.Errorf("ctr containers info: %w: %s", err, out)
	}
	var info struct {
		Spec *oci.Spec `json:"Spec"`
	}
	if err := json.Unmarshal([]byte(out), &info); err != nil {
		return nil, fmt.Errorf("parsing ctr containers info: %w", err)
	}
	if info.Spec == nil {
		return nil, errors.New("ctr containers info printed no spec")
	}
	return info.Spec, nil
}

// RemovePods stops and removes every pod.
//
// crictl removes the pods it is given at once, each call with its own
// timeout; a hundred at once on 2 cores can outlast it, so they go a few
// at a time.
func (c *Containerd) RemovePods() error {
	out, err := c.Crictl("pods", "-q")
	if err != nil {
		return fmt.Errorf("crictl pods: %w: %s", err, out)
	}
	ids := strings.Fields(out)
	var errs []error
	for batch := range slices.Chunk(ids, removeBatch) {
		if out, err := c.Crictl(append([]string{"rmp", "--force"}, batch...)...); err != nil {
			errs = append(errs, fmt.Errorf("crictl rmp: %w: %s", err, out))
		}
	}
	return errors.Join(errs...)
}

// removeBatch is how many pods RemovePods removes at once.
const removeBatch = 10

// LastLine returns the last line of s (crictl's output or error), trimmed.
func LastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// Stop removes the pods, stops the plugins, containerd and any shim it
// left, and unmounts everything below Dir. It returns what went wrong,
// after doing all it can.
func (c *Containerd) Stop() error {
	var errs []error
	running := c.cmd != nil && c.cmd.Process != nil
	if running {
		if err := c.RemovePods(); err != nil {
			errs = append(errs, err)
		}
	}
	for _, p := range c.plugins {
		p.Stop()
	}
	if running {
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-c.done:
			c.done <- err
		case <-time.After(15 * time.Second):
		}
		// Whatever is left of containerd's process group (containerd
		// itself, a pre-registered plugin it started) goes too.
		c.kill()
	}
	errs = append(errs, killShims(c.Address, c.Dir))
	if c.crio != nil {
		errs = append(errs, killConmons(c.Dir))
	}
	errs = append(errs, unmountBelow(c.Dir))
	return errors.Join(errs...)
}

// killShims kills the shims serving the containerd of address and dir,
// and gVisor's sandboxes of it (they outlive containerd).
func killShims(address, dir string) error {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return err
	}
	// gVisor's sandbox and gofer processes, which outlive a killed shim,
	// name their root below dir.
	runscRoot := "--root=" + filepath.Join(dir, "runsc") + "/"
	for _, e := range entries {
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(cmdline), "\x00")
		shim := strings.HasPrefix(filepath.Base(args[0]), "containerd-shim-")
		for i, a := range args {
			if (shim && a == "-address" && i+1 < len(args) && args[i+1] == address) || strings.HasPrefix(a, runscRoot) {
				var pid int
				fmt.Sscan(e.Name(), &pid)
				_ = syscall.Kill(pid, syscall.SIGKILL)
				break
			}
		}
	}
	return nil
}

// unmountBelow lazily unmounts every mount point below dir, deepest first.
func unmountBelow(dir string) error {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	defer f.Close()
	var points []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && strings.HasPrefix(fields[4], dir+"/") {
			points = append(points, fields[4])
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(points)))
	var errs []error
	for _, p := range points {
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}
