package harness

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// KubernetesEnv names the directory holding the Kubernetes components
// the cluster tests run (`make test` builds them from k8s.io/kubernetes
// and etcd's server module, test/tools/kubernetes): etcd, kube-apiserver,
// kube-scheduler, kube-controller-manager and kubelet.
const KubernetesEnv = "NRI_GPU_KUBERNETES"

// ControlPlane is a real Kubernetes control plane of a test: etcd,
// kube-apiserver, kube-controller-manager and kube-scheduler, each its
// own process listening on the loopback only, with certificates and
// service-account keys made for it under Dir.
type ControlPlane struct {
	Dir string
	// Server is the API server's URL.
	Server string
	// Kubeconfig is an administrator's (system:masters) kubeconfig.
	Kubeconfig string
	// Client is a client of the API server as that administrator.
	Client *kubernetes.Clientset

	bin   string
	pki   *pki
	procs []*process
}

// StartControlPlane starts etcd, the API server, the controller manager
// and the scheduler from the binaries in bin, all under dir, and waits
// until the API server is ready and the default namespace has its
// service account. On error it stops what it started.
func StartControlPlane(dir, bin string) (cp *ControlPlane, err error) {
	cp = &ControlPlane{Dir: dir, bin: bin}
	defer func() {
		if err != nil {
			cp.Stop()
		}
	}()
	if cp.pki, err = newPKI(filepath.Join(dir, "pki")); err != nil {
		return cp, err
	}
	etcdURL, err := cp.startEtcd()
	if err != nil {
		return cp, err
	}
	if err := cp.startAPIServer(etcdURL); err != nil {
		return cp, err
	}
	for _, c := range []struct{ name, user string }{
		{"kube-controller-manager", "system:kube-controller-manager"},
		{"kube-scheduler", "system:kube-scheduler"},
	} {
		kubeconfig, err := cp.pki.kubeconfig(c.name, c.user, nil, cp.Server)
		if err != nil {
			return cp, err
		}
		args := []string{"--kubeconfig", kubeconfig, "--bind-address", "127.0.0.1", "--secure-port", "0", "--leader-elect=false", "--v", "2"}
		if c.name == "kube-controller-manager" {
			args = append(args,
				"--service-account-private-key-file", filepath.Join(cp.pki.dir, "sa.key"),
				"--root-ca-file", cp.pki.CAPath(),
				"--use-service-account-credentials",
				// No pod CIDRs to hand out: each node's pod network is
				// its own bridge (see Node).
				"--controllers", "*,-nodeipam",
			)
		}
		if _, err := cp.start(c.name, args...); err != nil {
			return cp, err
		}
	}
	// Pods can be created once their namespace's service account is,
	// which the controller manager makes.
	ctx := context.Background()
	return cp, cp.procs[2].waitFor("default service account", 60*time.Second, func() error {
		_, err := cp.Client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		return err
	})
}

// start starts the component name from the binaries with args.
func (cp *ControlPlane) start(name string, args ...string) (*process, error) {
	p, err := startProcess(name, filepath.Join(cp.Dir, name+".log"), append([]string{filepath.Join(cp.bin, name)}, args...)...)
	if err != nil {
		return nil, err
	}
	cp.procs = append(cp.procs, p)
	return p, nil
}

// startEtcd starts etcd on two free loopback ports and waits for it to
// be healthy; it returns its client URL.
func (cp *ControlPlane) startEtcd() (string, error) {
	client, err := freePort()
	if err != nil {
		return "", err
	}
	peer, err := freePort()
	if err != nil {
		return "", err
	}
	clientURL := "http://127.0.0.1:" + strconv.Itoa(client)
	peerURL := "http://127.0.0.1:" + strconv.Itoa(peer)
	p, err := cp.start("etcd",
		"--name", "e2e", "--data-dir", filepath.Join(cp.Dir, "etcd"),
		"--listen-client-urls", clientURL, "--advertise-client-urls", clientURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "e2e="+peerURL, "--listen-metrics-urls", "",
		"--log-level", "warn")
	if err != nil {
		return "", err
	}
	return clientURL, p.waitFor("health", 30*time.Second, func() error {
		resp, err := http.Get(clientURL + "/health")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %s", resp.Status)
		}
		return nil
	})
}

// startAPIServer makes the API server's certificates and starts it on a
// free loopback port, and waits until it is ready.
func (cp *ControlPlane) startAPIServer(etcdURL string) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	cp.Server = "https://127.0.0.1:" + strconv.Itoa(port)
	crt, key, err := cp.pki.issue("apiserver", "kube-apiserver", nil,
		[]net.IP{net.ParseIP("127.0.0.1"), net.ParseIP(serviceIP)},
		[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"})
	if err != nil {
		return err
	}
	saKey, saPub, err := cp.pki.serviceAccountKeys()
	if err != nil {
		return err
	}
	if cp.Kubeconfig, err = cp.pki.kubeconfig("admin", "e2e-admin", []string{"system:masters"}, cp.Server); err != nil {
		return err
	}
	p, err := cp.start("kube-apiserver",
		"--etcd-servers", etcdURL,
		"--bind-address", "127.0.0.1", "--secure-port", strconv.Itoa(port),
		// Endpoints may not hold a loopback address: the kubernetes
		// Service gets none (nothing in the tests uses it).
		"--advertise-address", "127.0.0.1", "--endpoint-reconciler-type", "none",
		"--tls-cert-file", crt, "--tls-private-key-file", key,
		"--client-ca-file", cp.pki.CAPath(),
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file", saPub, "--service-account-signing-key-file", saKey,
		"--service-cluster-ip-range", serviceCIDR,
		"--authorization-mode", "Node,RBAC",
		"--enable-admission-plugins", "NodeRestriction",
		"--allow-privileged=true",
		"--profiling=false",
		"--v", "1")
	if err != nil {
		return err
	}
	rest, err := clientcmd.BuildConfigFromFlags("", cp.Kubeconfig)
	if err != nil {
		return err
	}
	if cp.Client, err = kubernetes.NewForConfig(rest); err != nil {
		return err
	}
	ctx := context.Background()
	return p.waitFor("/readyz", 120*time.Second, func() error {
		body, err := cp.Client.RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err != nil {
			return fmt.Errorf("%w: %s", err, body)
		}
		return nil
	})
}

// The Service network of the cluster: nothing routes it (there is no
// kube-proxy); it only has to exist.
const (
	serviceCIDR = "10.0.0.0/24"
	serviceIP   = "10.0.0.1"
)

// Stop stops the components, newest first.
func (cp *ControlPlane) Stop() {
	for i := len(cp.procs) - 1; i >= 0; i-- {
		cp.procs[i].Stop(10 * time.Second)
	}
}

// KubeconfigFor issues a client certificate for user cn in the groups
// orgs and writes a kubeconfig with it, named name.
func (cp *ControlPlane) KubeconfigFor(name, cn string, orgs ...string) (string, error) {
	return cp.pki.kubeconfig(name, cn, orgs, cp.Server)
}

// Cluster is a control plane and the nodes registered with it.
type Cluster struct {
	*ControlPlane
	// Dir holds the control plane's directory and each node's.
	Dir   string
	Nodes []*Node
}

// StartCluster starts a control plane under dir from the Kubernetes
// binaries in bin; AddNode adds nodes to it.
func StartCluster(dir, bin string) (*Cluster, error) {
	// The nodes' fake GPUs are seen under NodeDevDir, which must be a
	// directory to bind onto.
	if err := os.Mkdir(NodeDevDir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, err
	}
	cp, err := StartControlPlane(filepath.Join(dir, "control-plane"), bin)
	if err != nil {
		_ = os.Remove(NodeDevDir)
		return nil, err
	}
	return &Cluster{ControlPlane: cp, Dir: dir}, nil
}

// RemoveNode stops node n, deletes its Node object and forgets it. It
// returns what went wrong, after doing all it can.
func (c *Cluster) RemoveNode(n *Node) error {
	errs := []error{n.Stop()}
	if err := c.Client.CoreV1().Nodes().Delete(context.Background(), n.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		errs = append(errs, err)
	}
	c.Nodes = slices.DeleteFunc(c.Nodes, func(m *Node) bool { return m == n })
	return errors.Join(errs...)
}

// Stop stops the nodes, newest first, and the control plane, and removes
// NodeDevDir. It returns what went wrong, after doing all it can.
func (c *Cluster) Stop() error {
	var errs []error
	for i := len(c.Nodes) - 1; i >= 0; i-- {
		errs = append(errs, c.Nodes[i].Stop())
	}
	c.ControlPlane.Stop()
	errs = append(errs, os.Remove(NodeDevDir))
	return errors.Join(errs...)
}

// HelmEnv names Helm's CLI (`make test` builds it from Helm's module).
const HelmEnv = "NRI_GPU_HELM"

// Helm runs Helm's CLI (helm, the binary) against the cluster as its
// administrator, with Helm's cache, configuration and data in the
// cluster's directory, not the user's.
func (c *Cluster) Helm(helm string, args ...string) (string, error) {
	home := filepath.Join(c.Dir, "helm")
	cmd := exec.Command(helm, append([]string{"--kubeconfig", c.Kubeconfig}, args...)...)
	cmd.Env = append(os.Environ(),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("helm %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}
