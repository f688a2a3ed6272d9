package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// NodeDevDir is where a cluster node's fake GPU device nodes are, as its
// containerd, kubelet and pods see them: a directory of /dev (the chart's
// pod mounts the host's /dev), made for the cluster and removed with it,
// over which each node's mount namespace binds its own nodes.
const NodeDevDir = "/dev/nri-gpu-e2e"

// NodeSpecDir is the CDI spec directory of a cluster node as its pods
// see it (/var/run/cdi is /run/cdi): the node's own, in its namespace.
const NodeSpecDir = "/var/run/cdi"

// NodeOptions configure a cluster node.
type NodeOptions struct {
	// Name is the node's name.
	Name string
	// Tools are the binaries; their containerd is the node's.
	Tools Tools
	// GPUs is how many fake GPUs the node has.
	GPUs int
	// EnableCDI turns the node's containerd's own CDI on.
	EnableCDI bool
	// DefaultValidator turns NRI's default validator on (containerd
	// 2.2 and later), so that a pod can require a plugin.
	DefaultValidator bool
	// Images are image tars imported into the node's containerd.
	Images []string
	// CNIBin holds the CNI plugins bridge, host-local and loopback.
	CNIBin string
	// KubeletRoot is kubelet's --root-dir, under the node's /var/lib
	// (LongKubeletRoot); empty: kubelet's default, /var/lib/kubelet.
	KubeletRoot string
	// Systemd makes the node one of a cgroup v2 machine with systemd as
	// PID 1, as current distributions ship it: containerd's runc with the
	// systemd cgroup driver, and kubelet with its defaults (the cgroup
	// driver the runtime reports, cgroup v1 refused, pods under
	// kubepods.slice). One such node per machine: its kubelet owns
	// kubepods.slice.
	Systemd bool
	// CRIO, when set, makes the node's runtime CRI-O (these binaries)
	// instead of the tools' containerd; its own CDI reads the node's spec
	// directory.
	CRIO *CRIOTools
}

// LongKubeletRoot is a kubelet root directory as long as microk8s'
// (/var/snap/microk8s/common/var/lib/kubelet, 41 bytes), under the
// node's own /var/lib: unix sockets under it (DRA's, the pod-resources
// API's) must be named to fit 108 bytes. kubelet's device-plugin
// directory stays /var/lib/kubelet/device-plugins whatever its root.
const LongKubeletRoot = "/var/lib/snap/microk8s/common/var/kubelet"

// Node is a Kubernetes node of a test cluster: its own containerd and a
// kubelet registered with the control plane, in one mount namespace of
// their own in which the paths a node has (/var/lib, /var/log, /run, the
// NRI socket at /var/run/nri, the CDI specs at /var/run/cdi, the fake
// GPUs under NodeDevDir) are the node's files under Dir, as on a machine
// of its own. Its pods are on a bridge of its own (no masquerade, no
// iptables), so the kubelet probes them on their IPs; its cgroups are in
// a root of its own; the sysctls kubelet and the CNI plugins write are
// files of the test in its namespace.
type Node struct {
	Name string
	Dir  string
	Ctd  *Containerd
	GPUs int
	// Subnet is the node's pod network.
	Subnet string
	// index numbers the node in its cluster, from 1.
	index int

	cp          *ControlPlane
	holder      *process
	kubelet     *process
	kubeletArgs []string
	// cgroupRoot is the kubelet's cgroup root of its own ("": kubelet's
	// default, on a Systemd node).
	cgroupRoot string
	systemd    bool
	bridge     string
	// baseMounts are the IDs of the namespace's mounts as it was made.
	baseMounts map[string]bool
}

// nodeSysctls are what a node's kubelet and CNI plugins write.
var nodeSysctls = append([]string{"net/ipv4/ip_forward"}, kubeletSysctls...)

// nodeScript makes a node's mount namespace and keeps it: $1 is the
// node's directory. It says it is ready by creating $1/ns-ready.
const nodeScript = `set -e
d=$1
for s in %s; do
	f="$d/sysctl/$(echo "$s" | tr / .)"
	cat "/proc/sys/$s" > "$f"
	mount --bind "$f" "/proc/sys/$s"
done
mount --bind "$d/var-lib" /var/lib
mount --bind "$d/var-log" /var/log
if [ "$2" = systemd ]; then
	# runc's and kubelet's systemd cgroup driver ask systemd over its
	# sockets: those stay the machine's.
	mkdir -p "$d/run/dbus" "$d/run/systemd"
	mount --bind /run/dbus "$d/run/dbus"
	mount --bind /run/systemd "$d/run/systemd"
	mount --rbind "$d/run" /run
else
	mount --bind "$d/run" /run
fi
mount --bind "$d/ctd/nri" /run/nri
mount --bind "$d/dev" ` + NodeDevDir + `
# The files bound over /proc/sys leave /proc not fully visible, and the
# kernel then refuses a new proc mount in a user namespace (a pod with
# hostUsers: false): one proc mount with nothing over it is enough.
mkdir -p "$d/proc"
mount -t proc proc "$d/proc"
touch "$d/ns-ready"
exec sleep 2147483647
`

// AddNode starts a node of the cluster: its namespace, containerd (the
// images imported), pod network and kubelet, and waits until the node
// is Ready. On error it stops what it started.
func (c *Cluster) AddNode(opts NodeOptions) (n *Node, err error) {
	index := len(c.Nodes) + 1
	n = &Node{
		Name:    opts.Name,
		Dir:     filepath.Join(c.Dir, opts.Name),
		GPUs:    opts.GPUs,
		Subnet:  fmt.Sprintf("10.244.%d.0/24", index),
		index:   index,
		cp:      c.ControlPlane,
		bridge:  fmt.Sprintf("%s%d", bridgePrefix, index),
		systemd: opts.Systemd,
	}
	if !opts.Systemd {
		n.cgroupRoot = fmt.Sprintf("/nri-gpu-e2e-%d-%d", os.Getpid(), kubelets.Add(1))
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, n.Stop())
		}
	}()
	for _, d := range []string{"var-lib", "var-log", "run/nri", "run/cdi", "dev", "sysctl", "ctd/nri", "ctd/cni/bin", "ctd/cni/conf", "volume-plugins"} {
		if err := os.MkdirAll(filepath.Join(n.Dir, d), 0o755); err != nil {
			return n, err
		}
	}
	if err := n.writeGPUs(); err != nil {
		return n, err
	}
	if err := n.writeCNI(opts.CNIBin); err != nil {
		return n, err
	}
	if n.cgroupRoot != "" {
		if err := makeCgroup(n.cgroupRoot); err != nil {
			return n, err
		}
	}
	// A stale bridge of a run that was killed would hold the subnet.
	_ = n.deleteBridge()
	if n.holder, err = startProcess(n.Name+" namespace", filepath.Join(n.Dir, "namespace.log"),
		"unshare", "--mount", "--propagation", "slave", "sh", "-c", fmt.Sprintf(nodeScript, strings.Join(nodeSysctls, " ")), "sh", n.Dir, n.shape()); err != nil {
		return n, err
	}
	if err := n.holder.waitFor("namespace", 10*time.Second, func() error {
		_, err := os.Stat(filepath.Join(n.Dir, "ns-ready"))
		return err
	}); err != nil {
		return n, err
	}
	ids, err := n.mountIDs()
	if err != nil {
		return n, err
	}
	n.baseMounts = map[string]bool{}
	for id := range ids {
		n.baseMounts[id] = true
	}
	runtime := Options{EnableCDI: opts.EnableCDI, DefaultValidator: opts.DefaultValidator, CDISpecDirs: []string{NodeSpecDir}, Prefix: n.enter(), SystemdCgroup: opts.Systemd}
	if opts.CRIO != nil {
		n.Ctd, err = StartCRIO(filepath.Join(n.Dir, "ctd"), opts.Tools, *opts.CRIO, runtime)
	} else {
		n.Ctd, err = StartContainerd(filepath.Join(n.Dir, "ctd"), opts.Tools, runtime)
	}
	if err != nil {
		return n, err
	}
	for _, image := range opts.Images {
		if err := n.Ctd.ImportImage(image); err != nil {
			return n, fmt.Errorf("%s: %w", n.Name, err)
		}
	}
	kubeconfig, err := c.KubeconfigFor(n.Name, "system:node:"+n.Name, "system:nodes")
	if err != nil {
		return n, err
	}
	if err := n.writeKubeletConfig(); err != nil {
		return n, err
	}
	n.kubeletArgs = []string{
		"--config", filepath.Join(n.Dir, "kubelet.yaml"),
		"--kubeconfig", kubeconfig,
		"--hostname-override", n.Name,
		"--volume-plugin-dir", filepath.Join(n.Dir, "volume-plugins"),
		"--v", "2",
	}
	if opts.KubeletRoot != "" {
		n.kubeletArgs = append(n.kubeletArgs, "--root-dir", opts.KubeletRoot)
	}
	if err := n.StartKubelet(); err != nil {
		return n, err
	}
	if err := n.WaitReady(90 * time.Second); err != nil {
		return n, err
	}
	c.Nodes = append(c.Nodes, n)
	return n, nil
}

// shape names the node's shape to its namespace's script.
func (n *Node) shape() string {
	if n.systemd {
		return "systemd"
	}
	return "cgroupfs"
}

// enter is the command prefix that runs a program in the node's mount
// namespace.
func (n *Node) enter() []string {
	return enterMountNS(n.holder.Pid())
}

// UUID is the UUID of the node's fake GPU i: its own, as a real GPU's is
// unique across a cluster.
func (n *Node) UUID(i int) string {
	return fmt.Sprintf("%s%012d", nodeUUIDPrefix(n.index), i)
}

// nodeUUIDPrefix begins the UUIDs of the GPUs of the node numbered index.
func nodeUUIDPrefix(index int) string { return fmt.Sprintf("GPU-00000000-0000-0000-%04d-", index) }

// FakeDriver is ClusterFakeDriver of the node: one whose GPUs are its.
func (n *Node) FakeDriver() FakeDriver { return ClusterFakeDriver(n.index) }

// writeGPUs makes the node's fake GPUs (device nodes with NVIDIA's
// numbers, seen at NodeDevDir) and their CDI spec in its spec directory.
func (n *Node) writeGPUs() error {
	if err := mknodGPUs(filepath.Join(n.Dir, "dev"), n.GPUs); err != nil {
		return err
	}
	spec := deviceSpec(n.GPUs, func(name string) string { return filepath.Join(NodeDevDir, name) }, n.UUID)
	return os.WriteFile(filepath.Join(n.Dir, "run", "cdi", "nvidia.yaml"), []byte(spec), 0o644)
}

// writeCNI puts the CNI plugins in containerd's CNI bin directory and a
// network of one bridge of the node's, with host-local addresses of its
// subnet, in its conf directory.
func (n *Node) writeCNI(bin string) error {
	for _, p := range []string{"bridge", "host-local", "loopback"} {
		data, err := os.ReadFile(filepath.Join(bin, p))
		if err != nil {
			return fmt.Errorf("CNI plugin %s: %w", p, err)
		}
		if err := os.WriteFile(filepath.Join(n.Dir, "ctd", "cni", "bin", p), data, 0o755); err != nil {
			return err
		}
	}
	conf := fmt.Sprintf(`{"cniVersion": "1.0.0", "name": "e2e", "plugins": [{
  "type": "bridge", "bridge": %q, "isGateway": true, "ipMasq": false,
  "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "routes": [{"dst": "0.0.0.0/0"}]}
}]}`, n.bridge, n.Subnet)
	return os.WriteFile(filepath.Join(n.Dir, "ctd", "cni", "conf", "10-e2e.conflist"), []byte(conf), 0o644)
}

// writeKubeletConfig writes the kubelet's configuration of the node.
func (n *Node) writeKubeletConfig() error {
	cfg := kubeletConfig("unix://"+n.Ctd.Address, n.cgroupRoot)
	if n.systemd {
		// kubelet's defaults: the cgroup driver the runtime reports
		// (systemd), cgroup v1 refused, its pods under kubepods.slice.
		for _, k := range []string{"cgroupDriver", "cgroupRoot", "failCgroupV1"} {
			delete(cfg, k)
		}
	}
	// Device-plugin and status changes reach the API server quickly.
	cfg["nodeStatusUpdateFrequency"] = "2s"
	cfg["nodeStatusReportFrequency"] = "10s"
	data, err := yaml.Marshal(cfg)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(n.Dir, "kubelet.yaml"), data, 0o644)
}

// StartKubelet starts the node's kubelet (again, after StopKubelet).
func (n *Node) StartKubelet() (err error) {
	argv := append(n.enter(), append([]string{filepath.Join(n.cp.bin, "kubelet")}, n.kubeletArgs...)...)
	n.kubelet, err = startProcess(n.Name+" kubelet", filepath.Join(n.Dir, "kubelet.log"), argv...)
	return err
}

// StopKubelet stops the node's kubelet, its pods left running, as a
// crash or an upgrade does.
func (n *Node) StopKubelet() { n.kubelet.Stop(10 * time.Second) }

// KubeletLogTail returns the last lines of the node's kubelet's log.
func (n *Node) KubeletLogTail(lines int) string { return n.kubelet.LogTail(lines) }

// WaitReady waits until the node's Ready condition is True.
func (n *Node) WaitReady(timeout time.Duration) error {
	ctx := context.Background()
	return n.kubelet.waitFor("Ready node", timeout, func() error {
		node, err := n.cp.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady {
				if c.Status == corev1.ConditionTrue {
					return nil
				}
				return fmt.Errorf("Ready is %s: %s", c.Status, c.Message)
			}
		}
		return errors.New("no Ready condition")
	})
}

// Stop stops the kubelet, removes the pods from containerd and stops it,
// then ends the namespace and removes the node's cgroups and bridge. It
// returns what went wrong, after doing all it can.
func (n *Node) Stop() error {
	var errs []error
	n.kubelet.Stop(10 * time.Second)
	if n.Ctd != nil {
		errs = append(errs, n.Ctd.Stop())
	}
	n.holder.Stop(5 * time.Second)
	if n.cgroupRoot != "" {
		errs = append(errs, removeCgroup(n.cgroupRoot))
	}
	errs = append(errs, n.deleteBridge())
	return errors.Join(errs...)
}

// deleteBridge deletes the node's pod bridge, if there is one.
func (n *Node) deleteBridge() error { return deleteBridge(n.bridge) }

// deleteBridge deletes the bridge name, if there is one.
func deleteBridge(name string) error {
	if out, err := exec.Command("ip", "link", "del", name).CombinedOutput(); err != nil && !strings.Contains(string(out), "Cannot find device") {
		return fmt.Errorf("deleting bridge %s: %w: %s", name, err, out)
	}
	return nil
}

// PodLog returns what container of pod namespace/name on the node has
// written (stdout and stderr, in the CRI log format), from the log files
// kubelet keeps in the node's /var/log/pods.
func (n *Node) PodLog(namespace, name, container string) string {
	files, _ := filepath.Glob(filepath.Join(n.Dir, "var-log", "pods", namespace+"_"+name+"_*", container, "*.log"))
	var out strings.Builder
	for _, f := range files {
		data, _ := os.ReadFile(f)
		out.Write(data)
	}
	return out.String()
}

// Dev returns the path, on the host, of the node's fake device node name
// (what the node sees as NodeDevDir/name).
func (n *Node) Dev(name string) string { return filepath.Join(n.Dir, "dev", name) }

// RestoreGPU makes fake GPU i's device node again, after a test removed
// it.
func (n *Node) RestoreGPU(i int) error {
	return mknod(n.Dev(fmt.Sprintf("nvidia%d", i)), NvidiaMajor, uint32(i))
}

// GPUResource is the device-plugin resource the cluster's nri-gpu offers.
const GPUResource corev1.ResourceName = "nvidia.com/gpu"

// Allocatable returns how many GPUResource the node's status offers.
func (n *Node) Allocatable() (int64, error) {
	node, err := n.cp.Client.CoreV1().Nodes().Get(context.Background(), n.Name, metav1.GetOptions{})
	if err != nil {
		return 0, err
	}
	q := node.Status.Allocatable[GPUResource]
	return q.Value(), nil
}

// WaitAllocatable waits until the node's status offers want GPUs.
func (n *Node) WaitAllocatable(want int64, timeout time.Duration) error {
	return n.kubelet.waitFor(fmt.Sprintf("%d allocatable %s", want, GPUResource), timeout, func() error {
		got, err := n.Allocatable()
		if err == nil && got != want {
			err = fmt.Errorf("%d allocatable", got)
		}
		return err
	})
}

// SleepPod is a pod of the test image sleeping, asking for gpus of
// GPUResource (none when 0), deleted at once when asked to and with no
// service-account token.
func SleepPod(namespace, name string, gpus int64) *corev1.Pod {
	ctr := corev1.Container{Name: "main", Image: ImageRef, ImagePullPolicy: corev1.PullNever, Command: []string{"/bin/sleep", "3600"}}
	if gpus > 0 {
		ctr.Resources.Limits = corev1.ResourceList{GPUResource: *resource.NewQuantity(gpus, resource.DecimalSI)}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: corev1.PodSpec{
			Containers:                    []corev1.Container{ctr},
			TerminationGracePeriodSeconds: new(int64),
			AutomountServiceAccountToken:  new(bool),
		},
	}
}
