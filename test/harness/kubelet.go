package harness

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"sigs.k8s.io/yaml"
)

// KubeletEnv names the kubelet binary the Kubernetes tests run (`make
// test` builds it from k8s.io/kubernetes, test/tools/kubelet).
const KubeletEnv = "NRI_GPU_KUBELET"

// Kubelet is a real kubelet in standalone mode (no API server: static
// pods from a directory) against a test containerd, contained so that it
// changes nothing of the machine's: it runs in a mount namespace of its
// own in which /var/lib, /var/log and the sysctls it would rewrite are
// files and directories under Dir, and its pods live in a cgroup root of
// its own, removed by Stop.
type Kubelet struct {
	Dir string
	// Node is the node name: static pods are named <name>-<Node>.
	Node string
	// Manifests is the static pod directory.
	Manifests string
	// VarLib is what kubelet sees as /var/lib (its device-plugins
	// directory is VarLib/kubelet/device-plugins).
	VarLib  string
	LogPath string

	binary     string
	ctd        *Containerd
	cgroupRoot string
	proc       *process
}

// kubeletSysctls are the sysctls kubelet sets on start: inside its mount
// namespace each is a file of the test's, holding the machine's value.
var kubeletSysctls = []string{
	"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
}

// kubeletScript sets up kubelet's mount namespace and execs it: $1 is the
// run's directory, $2 what kubelet sees as /var/lib, the rest kubelet's
// command line.
const kubeletScript = `set -e
dir=$1; shift
for s in %s; do
	f="$dir/sysctl/$(echo "$s" | tr / .)"
	cat "/proc/sys/$s" > "$f"
	mount --bind "$f" "/proc/sys/$s"
done
varlib=$1; shift
mount --bind "$varlib" /var/lib
mount --bind "$dir/var-log" /var/log
exec "$@"
`

// StartKubelet writes kubelet's configuration under dir and starts it
// against c. binary is the kubelet to run.
func StartKubelet(dir, binary string, c *Containerd) (k *Kubelet, err error) {
	k = &Kubelet{
		Dir:       dir,
		Node:      "e2e-node",
		Manifests: filepath.Join(dir, "manifests"),

		LogPath: filepath.Join(dir, "kubelet.log"),
		binary:  binary,
		ctd:     c,
		// A cgroup root of its own, under every controller.
		cgroupRoot: fmt.Sprintf("/nri-gpu-e2e-%d-%d", os.Getpid(), kubelets.Add(1)),
	}
	// What kubelet sees as /var/lib is a short path of its own: unix
	// socket paths (nri-gpu's, in kubelet's device-plugin directory) are
	// limited to 108 bytes.
	if k.VarLib, err = os.MkdirTemp("/tmp", "kl-"); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(k.VarLib, "kubelet", "device-plugins"), 0o755); err != nil {
		return nil, err
	}
	for _, d := range []string{"manifests", "var-log", "sysctl", "root", "certs", "volume-plugins", "pod-logs"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return nil, err
		}
	}
	cfg := kubeletConfig("unix://"+c.Address, k.cgroupRoot)
	cfg["staticPodPath"] = k.Manifests
	cfg["fileCheckFrequency"] = "1s"
	cfg["podLogsDir"] = filepath.Join(dir, "pod-logs")
	data, err := yaml.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "config.yaml"), data, 0o644); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = k.Stop()
		}
	}()
	if err := makeCgroup(k.cgroupRoot); err != nil {
		return k, err
	}
	return k, k.start()
}

// kubeletConfig is the KubeletConfiguration of a test's kubelet against
// the runtime at endpoint, its pods in cgroupRoot: no server, no port,
// and nothing it would collect or evict on a busy test machine.
func kubeletConfig(endpoint, cgroupRoot string) map[string]any {
	return map[string]any{
		"apiVersion":               "kubelet.config.k8s.io/v1beta1",
		"kind":                     "KubeletConfiguration",
		"syncFrequency":            "2s",
		"containerRuntimeEndpoint": endpoint,
		"imageServiceEndpoint":     endpoint,
		"cgroupDriver":             "cgroupfs",
		"cgroupRoot":               cgroupRoot,
		"failSwapOn":               false,
		// From 1.35 kubelet refuses cgroup v1 unless told otherwise; these
		// machines have it.
		"failCgroupV1":   false,
		"enableServer":   false,
		"readOnlyPort":   0,
		"healthzPort":    0,
		"authentication": map[string]any{"anonymous": map[string]any{"enabled": true}, "webhook": map[string]any{"enabled": false}},
		"authorization":  map[string]any{"mode": "AlwaysAllow"},
		// The test image is never pulled, and must never be collected,
		// nor pods evicted, on a busy test machine.
		"imageGCHighThresholdPercent": 100,
		"imageGCLowThresholdPercent":  99,
		"evictionHard":                map[string]string{"memory.available": "0%", "nodefs.available": "0%", "imagefs.available": "0%"},
	}
}

// kubelets counts the kubelets this process started, for their cgroups'
// names.
var kubelets atomic.Int64

// makeCgroup makes the cgroup at path under every controller of the
// cgroup v1 hierarchy (kubelet requires its cgroup root to exist), its
// cpuset given all its parent's CPUs and memory nodes; or, on cgroup v2,
// in the one hierarchy.
func makeCgroup(path string) error {
	for _, m := range cgroupMounts() {
		dir := filepath.Join(m, path)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("cgroup %s: %w", dir, err)
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			if v, err := os.ReadFile(filepath.Join(m, f)); err == nil && filepath.Base(m) == "cpuset" {
				if err := os.WriteFile(filepath.Join(dir, f), v, 0o644); err != nil {
					return fmt.Errorf("cgroup %s: %s: %w", dir, f, err)
				}
			}
		}
	}
	return nil
}

func (k *Kubelet) start() (err error) {
	args := []string{"--mount", "--propagation", "slave", "sh", "-c", fmt.Sprintf(kubeletScript, strings.Join(kubeletSysctls, " ")), "sh", k.Dir, k.VarLib,
		k.binary,
		"--config", filepath.Join(k.Dir, "config.yaml"),
		"--root-dir", filepath.Join(k.Dir, "root"),
		"--cert-dir", filepath.Join(k.Dir, "certs"),
		"--volume-plugin-dir", filepath.Join(k.Dir, "volume-plugins"),
		"--hostname-override", k.Node,
		"--v", "2",
	}
	k.proc, err = startProcess("kubelet", k.LogPath, append([]string{"unshare"}, args...)...)
	return err
}

// running reports whether kubelet's process has not exited.
func (k *Kubelet) running() bool { return k.proc.Running() }

// stop ends kubelet's process (SIGTERM, then SIGKILL), leaving its pods.
func (k *Kubelet) stop() { k.proc.Stop(10 * time.Second) }

// Restart stops kubelet and starts it again, its pods left running, as
// an upgrade or a crash and restart by systemd does.
func (k *Kubelet) Restart() error {
	k.stop()
	return k.start()
}

// Stop ends kubelet, removes its pods from the runtime and its cgroup
// root from every controller. It returns what went wrong, after doing all
// it can.
func (k *Kubelet) Stop() error {
	k.stop()
	return errors.Join(k.ctd.RemovePods(), removeCgroup(k.cgroupRoot), os.RemoveAll(k.VarLib))
}

// removeCgroup removes the cgroup at path (and those below it) from every
// controller of the cgroup v1 hierarchy, and from the v2 one.
func removeCgroup(path string) error {
	if path == "" || path == "/" {
		return nil
	}
	mounts, _ := filepath.Glob("/sys/fs/cgroup/*")
	mounts = append(mounts, "/sys/fs/cgroup")
	var errs []error
	for _, m := range mounts {
		dir := filepath.Join(m, path)
		if _, err := os.Stat(dir); err != nil {
			continue
		}
		var dirs []string
		_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- { // deepest first
			if err := os.Remove(dirs[i]); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// LogTail returns the last n lines of kubelet's log.
func (k *Kubelet) LogTail(n int) string { return tail(k.LogPath, n) }

// Log returns kubelet's log.
func (k *Kubelet) Log() string {
	data, _ := os.ReadFile(k.LogPath)
	return string(data)
}

// StaticPod is a pod for kubelet's static pod directory: one container
// running the test image's sleep.
type StaticPod struct {
	Name, Namespace string
	Annotations     map[string]string
	// Limits are the container's resource limits (an extended resource
	// such as nvidia.com/gpu).
	Limits map[string]string
	// Command is the container's command; sleep by default.
	Command []string
}

// AddPod writes p into the static pod directory, as a Kubernetes Pod.
func (k *Kubelet) AddPod(p StaticPod) error {
	cmd := p.Command
	if cmd == nil {
		cmd = []string{"/bin/sleep", "3600"}
	}
	ctr := map[string]any{
		"name":            "main",
		"image":           ImageRef,
		"imagePullPolicy": "Never",
		"command":         cmd,
	}
	if len(p.Limits) > 0 {
		ctr["resources"] = map[string]any{"limits": p.Limits}
	}
	pod := map[string]any{
		"apiVersion": "v1",
		"kind":       "Pod",
		"metadata":   map[string]any{"name": p.Name, "namespace": p.Namespace, "annotations": p.Annotations},
		"spec": map[string]any{
			"hostNetwork":                   true,
			"restartPolicy":                 "Always",
			"terminationGracePeriodSeconds": 1,
			"containers":                    []any{ctr},
		},
	}
	return k.AddManifest(p.Name, pod)
}

// AddManifest writes a Pod object as the static pod name.
func (k *Kubelet) AddManifest(name string, pod map[string]any) error {
	data, err := yaml.Marshal(pod)
	if err != nil {
		return err
	}
	tmp := filepath.Join(k.Dir, "."+name+".yaml")
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	// Renamed into place: kubelet never reads half a manifest.
	return os.Rename(tmp, filepath.Join(k.Manifests, name+".yaml"))
}

// RemovePod removes p's manifest: kubelet then stops and removes the pod.
func (k *Kubelet) RemovePod(name string) error {
	return os.Remove(filepath.Join(k.Manifests, name+".yaml"))
}

// PodName is the name kubelet gives the static pod name on its node.
func (k *Kubelet) PodName(name string) string { return name + "-" + k.Node }

// RunningContainer returns the id of the running container of the static
// pod name, waiting up to timeout for it.
func (k *Kubelet) RunningContainer(name string, timeout time.Duration) (string, error) {
	c := k.ctd
	deadline := time.Now().Add(timeout)
	for {
		out, err := c.Crictl("ps", "-q", "--state", "running", "--label", "io.kubernetes.pod.name="+k.PodName(name))
		if id := strings.TrimSpace(out); err == nil && id != "" {
			return strings.Fields(id)[0], nil
		}
		if !k.running() {
			return "", fmt.Errorf("kubelet exited; log:\n%s", k.LogTail(40))
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no running container of pod %s after %s; %s", k.PodName(name), timeout, k.report())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Containers returns the ids of every container (in any state) of the
// static pod name.
func (k *Kubelet) Containers(name string) ([]string, error) {
	out, err := k.ctd.Crictl("ps", "-a", "-q", "--label", "io.kubernetes.pod.name="+k.PodName(name))
	if err != nil {
		return nil, fmt.Errorf("crictl ps: %w: %s", err, out)
	}
	return strings.Fields(out), nil
}

// LogSize is how long kubelet's log is now: WaitLog from there reads
// only what comes after.
func (k *Kubelet) LogSize() int { return len(k.Log()) }

// WaitLog waits up to timeout for a line of kubelet's log, after its
// first since bytes, that holds every one of want, and returns it.
func (k *Kubelet) WaitLog(since int, timeout time.Duration, want ...string) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		log := k.Log()
		for _, line := range strings.Split(log[min(since, len(log)):], "\n") {
			if containsAll(line, want) {
				return line, nil
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("kubelet logged no line with %q in %s; %s", want, timeout, k.report())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// report is what a failed wait says of the node: the end of kubelet's
// log, the containers the runtime has, what the runtime logged of its NRI
// plugins' failures, and the end of the log of the nri-gpu last started.
func (k *Kubelet) report() string {
	ps, err := k.ctd.Crictl("ps", "-a")
	if err != nil {
		ps = fmt.Sprintf("crictl ps: %v: %s", err, ps)
	}
	return fmt.Sprintf("kubelet's log ends:\n%s\nthe runtime's containers:\n%s\nthe runtime's NRI failures:\n%s\nnri-gpu's log ends:\n%s",
		k.LogTail(30), ps, k.ctd.NRIFailures(10), k.ctd.PluginLogTail(15))
}

// WaitDevices waits up to timeout for kubelet to have taken in, after the
// first since bytes of its log, that resource has healthy healthy
// devices: its device manager's "Processed device updates" line (logged
// at -v 2), after which the pods it admits are offered them.
func (k *Kubelet) WaitDevices(since int, timeout time.Duration, resource string, healthy int) error {
	_, err := k.WaitLog(since, timeout, `"Processed device updates for resource"`, `resourceName="`+resource+`"`, fmt.Sprintf("healthyCount=%d", healthy))
	return err
}

func containsAll(s string, want []string) bool {
	for _, w := range want {
		if !strings.Contains(s, w) {
			return false
		}
	}
	return true
}

// PodLog returns what the container of static pod name in namespace has
// written to its log (stdout and stderr, as the runtime records them).
func (k *Kubelet) PodLog(namespace, name, container string) string {
	files, _ := filepath.Glob(filepath.Join(k.Dir, "pod-logs", namespace+"_"+k.PodName(name)+"_*", container, "*.log"))
	var out strings.Builder
	for _, f := range files {
		data, _ := os.ReadFile(f)
		out.Write(data)
	}
	return out.String()
}
