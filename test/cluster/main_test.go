// Package cluster tests nri-gpu on a real Kubernetes cluster, as an
// operator runs it: etcd, kube-apiserver, kube-scheduler and
// kube-controller-manager built from Kubernetes' own modules, two GPU
// nodes of different sizes (node-a: containerd 1.7.35 with CDI off and 2
// fake GPUs; node-b: containerd 2.3.7 with its CDI and NRI's default validator on and 4), each with
// its own kubelet, and nri-gpu installed on them by its Helm chart with
// Helm's own CLI. The cluster is started once for the package's tests;
// each test removes what it made. It needs root; without root (or the
// tools `make test` builds) every test is skipped and says why.
package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nri-gpu/nri-gpu/test/harness"
)

// RequiredEnv, when set to 1 (as `make test` sets it), turns missing root
// or tools into a failure instead of a skip.
const RequiredEnv = "NRI_GPU_E2E_REQUIRED"

// Environment the tools are named by (`make test` sets them).
const (
	imageEnv    = "NRI_GPU_IMAGE"
	cniEnv      = "NRI_GPU_CNI"
	containerd2 = "NRI_GPU_REFERENCE_CONTAINERD"
	chartDir    = "../../deploy/helm/nri-gpu"
	releaseName = "nri-gpu"
	// apiForwardPort is where nri-gpu's pods reach the API server.
	apiForwardPort = "16443"
	nriNamespace   = "nri-gpu"
)

// env is the shared cluster.
var env struct {
	skip    string
	dir     string
	helm    string
	cluster *harness.Cluster
	// a has 2 GPUs on containerd 1.7 (CDI off), b 4 on containerd 2.x;
	// on the cgroup v2 node (systemdShape) a alone, on containerd 2.x.
	a, b *harness.Node
	// nodes are the cluster's GPU nodes: a and b, or a alone.
	nodes  []*harness.Node
	client *kubernetes.Clientset
	// forwards give nri-gpu's pods the API server.
	forwards []*harness.PodForwarder
	values   string
	tools    harness.Tools
	// images are the tars imported into each node's containerd.
	images []string
}

// suiteValues are the chart values of the installation: the image
// imported into each node (never pulled), the nodes' spec directory,
// one device-plugin resource, the metrics Service, a multi-tenant policy,
// and kubelet's directories under the nodes' kubelet root, as long as
// microk8s' (harness.LongKubeletRoot): its pod-resources socket and DRA's
// plugin and registration directories.
const suiteValues = `image:
  pullPolicy: Never
hostPaths:
  # kubelet's device-plugin directory is /var/lib/kubelet/device-plugins
  # whatever its root (the device-plugin API's KubeletSocket).
  kubeletPodResourcesDir: ` + harness.LongKubeletRoot + `/pod-resources
config:
  cdiSpecDirs: [` + harness.NodeSpecDir + `]
  policy:
    namespaces: [default, "tenant-*"]
    devices: ["nvidia.com/gpu=*"]
    exclusive: true
  devicePlugin:
    resources:
      - name: nvidia.com/gpu
  dra:
    enabled: true
    pluginDir: ` + harness.LongKubeletRoot + `/plugins
    registryDir: ` + harness.LongKubeletRoot + `/plugins_registry
  # A container created while nri-gpu was away, stopped, is told in its
  # pod's events.
  events:
    enabled: true
  # MPS daemons nri-gpu runs, once a test shares GPUs with MPS: the
  # stand-in control program the test puts on the node, where nri-gpu's
  # container has no such path: it runs chrooted into the node's root, as
  # the driver's would.
  mps:
    daemon: managed
    controlCommand: /var/lib/mps-standin/nvidia-cuda-mps-control
    root: /run/nri-gpu/mps
    hostRoot: /host
dra:
  # No kube-proxy here: the harness forwards this port of nri-gpu's pods
  # to the API server (harness.PodForwarder).
  apiServer: {host: 127.0.0.1, port: ` + apiForwardPort + `}
metrics:
  service:
    enabled: true
logLevel: debug
`

func TestMain(m *testing.M) {
	if removed := harness.SweepKilledRun(); len(removed) > 0 {
		fmt.Fprintf(os.Stderr, "cluster: removed what a killed run left: %s\n", strings.Join(removed, ", "))
	}
	before := harness.Host()
	code, err := setup()
	if err != nil {
		fmt.Fprintf(os.Stderr, "cluster setup: %v\n", err)
		code = 1
	}
	if code == 0 {
		code = m.Run()
	}
	if err := uninstall(); err != nil {
		fmt.Fprintf(os.Stderr, "cluster uninstall: %v\n", err)
		code = 1
	}
	if err := teardown(); err != nil {
		fmt.Fprintf(os.Stderr, "cluster teardown: %v\n", err)
		code = 1
	}
	// Nothing of the machine's is changed: sysctls, a node's paths,
	// cgroups, bridges.
	if changes := harness.Host().Changes(before); env.skip == "" && len(changes) > 0 {
		fmt.Fprintf(os.Stderr, "cluster: the run changed the machine:\n%s\n", strings.Join(changes, "\n"))
		code = 1
	} else if env.skip == "" {
		fmt.Fprintln(os.Stderr, "cluster: the machine's sysctls, node paths, cgroups and bridges are as before")
	}
	os.Exit(code)
}

// need says which tool of the environment is missing.
func need(names ...string) string {
	for _, n := range names {
		if os.Getenv(n) == "" {
			return fmt.Sprintf("%s is not set (make test sets it)", n)
		}
	}
	return ""
}

func setup() (int, error) {
	required := os.Getenv(RequiredEnv) == "1"
	tools, err := harness.FindTools("")
	switch {
	case os.Geteuid() != 0:
		env.skip = "the cluster tests need root (device nodes, mounts, runc)"
	case err != nil:
		env.skip = fmt.Sprintf("end-to-end tools missing (run make test): %v", err)
	default:
		env.skip = need(harness.KubernetesEnv, harness.HelmEnv, imageEnv, cniEnv, containerd2)
	}
	if env.skip != "" {
		if required {
			return 1, fmt.Errorf("%s, and %s=1", env.skip, RequiredEnv)
		}
		fmt.Fprintf(os.Stderr, "SKIP cluster: %s\n", env.skip)
		return 0, nil
	}
	env.tools = tools
	toolsB, err := tools.WithContainerd(os.Getenv(containerd2))
	if err != nil {
		return 1, err
	}
	env.helm = os.Getenv(harness.HelmEnv)
	start := time.Now()
	// Under /tmp, short: it holds unix sockets, whatever TMPDIR is.
	if env.dir, err = os.MkdirTemp("/tmp", "nri-gpu-cluster-"); err != nil {
		return 1, err
	}
	// A user-namespaced pod's root (a host uid of its range) reaches its
	// bundle under it.
	if err := os.Chmod(env.dir, 0o711); err != nil {
		return 1, err
	}
	busybox := filepath.Join(env.dir, "busybox.tar")
	if err := harness.BuildImage(tools.Busybox, busybox); err != nil {
		return 1, err
	}
	// NVIDIA's demo manifests' image, a stand-in (TestNVIDIAManifests).
	ubuntu := filepath.Join(env.dir, "ubuntu.tar")
	if err := harness.BuildNamedImage(tools.Busybox, ubuntu, ubuntuStandIn, ubuntuFiles...); err != nil {
		return 1, err
	}
	nbody := filepath.Join(env.dir, "nbody.tar")
	if err := harness.BuildNamedImage(tools.Busybox, nbody, nbodyStandIn, nbodyFiles...); err != nil {
		return 1, err
	}
	if env.cluster, err = harness.StartCluster(env.dir, os.Getenv(harness.KubernetesEnv)); err != nil {
		return 1, err
	}
	env.client = env.cluster.Client
	images := []string{busybox, ubuntu, nbody, os.Getenv(imageEnv)}
	env.images = images
	if err := addNodes(tools, toolsB, images); err != nil {
		return 1, err
	}
	fmt.Fprintf(os.Stderr, "cluster: control plane and %d nodes Ready in %s\n", len(env.nodes), time.Since(start).Round(100*time.Millisecond))
	port, _ := strconv.Atoi(apiForwardPort)
	for _, n := range env.nodes {
		env.forwards = append(env.forwards, n.ForwardToPods("app.kubernetes.io/name=nri-gpu", port, strings.TrimPrefix(env.cluster.Server, "https://")))
	}
	env.values = filepath.Join(env.dir, "values.yaml")
	if err := os.WriteFile(env.values, []byte(suiteValues), 0o644); err != nil {
		return 1, err
	}
	start = time.Now()
	if _, err := env.cluster.Helm(env.helm, "install", releaseName, chartDir, "--namespace", nriNamespace, "--create-namespace",
		"--values", env.values, "--wait", "--timeout", "3m"); err != nil {
		return 1, fmt.Errorf("%w\n%s", err, nodeLogs())
	}
	if err := waitDaemonSetReady(int32(len(env.nodes))); err != nil {
		return 1, fmt.Errorf("%w\n%s", err, nodeLogs())
	}
	fmt.Fprintf(os.Stderr, "cluster: nri-gpu installed and Ready on %d nodes in %s\n", len(env.nodes), time.Since(start).Round(100*time.Millisecond))
	return 0, nil
}

// systemdShape says the suite runs on the cgroup v2 node of test/vm
// (systemd as PID 1, harness.SystemdCgroupEnv set): there the cluster has
// one GPU node, node-a, of containerd 2.x with runc's systemd cgroup
// driver and kubelet with its defaults (harness.NodeOptions.Systemd).
func systemdShape() bool { return os.Getenv(harness.SystemdCgroupEnv) == "1" }

// nodeRuntimeEnv, set to "crio" in the systemd shape, makes node-a's
// runtime CRI-O (harness.CRIOEnv's binaries) under systemd's cgroup
// manager, instead of containerd.
const nodeRuntimeEnv = "NRI_GPU_NODE_RUNTIME"

// crioNode says node-a runs CRI-O.
func crioNode() bool { return os.Getenv(nodeRuntimeEnv) == "crio" }

// addNodes adds the GPU nodes: node-a (containerd 1.7, CDI off, 2 GPUs)
// and node-b (containerd 2.x with its CDI and NRI's default validator,
// 4 GPUs), each with kubelet's root as long as microk8s'; or, in the
// systemd shape, node-a alone, as node-b's containerd but with 2 GPUs, or
// CRI-O (crioNode).
func addNodes(tools, toolsB harness.Tools, images []string) error {
	a := harness.NodeOptions{Name: "node-a", Tools: tools, GPUs: 2, Images: images, CNIBin: os.Getenv(cniEnv), KubeletRoot: harness.LongKubeletRoot}
	if systemdShape() {
		a.Tools, a.EnableCDI, a.DefaultValidator, a.Systemd = toolsB, true, true, true
	}
	if crioNode() {
		crio, err := harness.FindCRIO("")
		if err != nil {
			return err
		}
		a.CRIO = &crio
	}
	var err error
	if env.a, err = env.cluster.AddNode(a); err != nil {
		return err
	}
	env.nodes = []*harness.Node{env.a}
	if systemdShape() {
		return nil
	}
	b := harness.NodeOptions{Name: "node-b", Tools: toolsB, GPUs: 4, EnableCDI: true, DefaultValidator: true, Images: images, CNIBin: os.Getenv(cniEnv), KubeletRoot: harness.LongKubeletRoot}
	if env.b, err = env.cluster.AddNode(b); err != nil {
		return err
	}
	env.nodes = append(env.nodes, env.b)
	return nil
}

// waitDaemonSetReady waits until nri-gpu's DaemonSet has want pods, all
// of the current template, each Ready.
func waitDaemonSetReady(want int32) error {
	ctx := context.Background()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		ds, err := env.client.AppsV1().DaemonSets(nriNamespace).Get(ctx, releaseName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		st := ds.Status
		if st.ObservedGeneration == ds.Generation && st.DesiredNumberScheduled == want && st.UpdatedNumberScheduled == want && st.NumberReady == want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("nri-gpu's DaemonSet not Ready on %d nodes in 2m: %+v", want, st)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// nodeLogs is the end of each node's kubelet log, for a failure to show.
func nodeLogs() string {
	var b strings.Builder
	for _, n := range env.nodes {
		if n != nil {
			fmt.Fprintf(&b, "--- %s kubelet:\n%s\n", n.Name, n.KubeletLogTail(20))
		}
	}
	return b.String()
}

// uninstall runs `helm uninstall` and checks that it leaves no nri-gpu
// container running on either node.
func uninstall() error {
	if env.cluster == nil || env.b == nil {
		return nil
	}
	if _, err := env.cluster.Helm(env.helm, "uninstall", releaseName, "--namespace", nriNamespace, "--wait", "--timeout", "2m"); err != nil {
		return err
	}
	deadline := time.Now().Add(time.Minute)
	for _, n := range env.nodes {
		for {
			out, err := n.Ctd.Crictl("ps", "-q", "--name", "^nri-gpu$")
			if err == nil && strings.TrimSpace(out) == "" {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s: nri-gpu containers still running a minute after helm uninstall: %v %s", n.Name, err, out)
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
	fmt.Fprintln(os.Stderr, "cluster: helm uninstall left no nri-gpu container running")
	return nil
}

func teardown() error {
	if env.dir == "" {
		return nil
	}
	for _, f := range env.forwards {
		f.Stop()
	}
	if env.cluster != nil {
		if err := env.cluster.Stop(); err != nil {
			return err
		}
	}
	if os.Getenv("NRI_GPU_E2E_KEEP") == "" {
		return os.RemoveAll(env.dir)
	}
	return nil
}

// needCluster skips a test when the cluster could not be set up.
func needCluster(t *testing.T) {
	t.Helper()
	if env.skip != "" {
		t.Skip(env.skip)
	}
}

// nriPods returns the pods of nri-gpu's DaemonSet, by node.
func nriPods(t *testing.T) map[string]corev1.Pod {
	t.Helper()
	byNode, err := listNRIPods()
	if err != nil {
		t.Fatal(err)
	}
	return byNode
}

// listNRIPods is nriPods for a goroutine other than the test's: it
// returns its error.
func listNRIPods() (map[string]corev1.Pod, error) {
	pods, err := env.client.CoreV1().Pods(nriNamespace).List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=nri-gpu"})
	if err != nil {
		return nil, err
	}
	byNode := map[string]corev1.Pod{}
	for _, p := range pods.Items {
		byNode[p.Spec.NodeName] = p
	}
	return byNode, nil
}
