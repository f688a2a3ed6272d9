package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/nri-gpu/nri-gpu/test/harness"
)

// clusterKind is one kind of pod of the cluster section: where the
// scheduler may put it and what it asks for.
type clusterKind struct {
	name string
	node string // the node (by its hostname label) it must land on
	// other, when set, is the node every second pod of the kind lands on.
	other string
	gpus  int64
	// claim, when set, is the ResourceClaimTemplate each pod's claim is
	// made from (a GPU through nri-gpu's DRA driver).
	claim string
	ds    []time.Duration
}

// clusterBatch is how many pods of each kind are created at once: every
// GPU of a node.
const clusterBatch = 4

// cluster times pod start on a real control plane and two nodes of
// containerd 2.3.7 with its CDI on, nri-gpu installed by its chart on
// both with device-plugin resources: on bench-nri it hands kubelet's
// allocation over as its own annotation and injects the devices itself;
// on bench-cdi as CRI CDI devices, which containerd's own CDI injects.
// bench-nri has 4 more fake GPUs, which nri-gpu's DRA driver offers to
// claims. Batches of GPU pods placed by the scheduler on each, of claim
// pods, and of pods without GPUs, interleaved: the time from the pod's
// creation to its Running, as the API server reports it to a watch.
func (r *report) cluster(rounds int) {
	r.printf("## Cluster: pod creation to Running\n\n")
	kinds, err := r.runCluster(rounds)
	if err != nil {
		r.printf("not measured: %v\n\n", err)
		return
	}
	r.printf("Kubernetes v1.37.2 (etcd, API server, scheduler, controller manager and two kubelets), nodes on containerd %s with CDI on and 4 fake GPUs each, nri-gpu installed by its Helm chart on both with `nvidia.com/gpu` as a device-plugin resource; bench-nri has 4 more that nri-gpu's DRA driver offers to claims (a ResourceClaimTemplate of one GPU per pod). "+
		"%d rounds after one of warm-up; each creates a batch of %d pods of each kind at once, interleaved (each kind first in turn; the pods without GPUs half on each node), and waits until all run. The time is from the create call to the watch seeing the pod Running.\n\n", containerd2Version(), rounds, clusterBatch)
	r.printf("| pods | median | p90 |\n|---|---|---|\n")
	for _, k := range kinds {
		r.printf("| %s | %s | %s |\n", k.name, ms(percentile(k.ds, 50)), ms(percentile(k.ds, 90)))
	}
	r.printf("\n")
	ratio := float64(percentile(kinds[0].ds, 50)) / float64(percentile(kinds[1].ds, 50))
	r.results = append(r.results, target{"cluster pod start median, nri-gpu / containerd's own CDI", "≤ 1.02", fmt.Sprintf("%.3f", ratio), ratio <= 1.02,
		"kubelet's and the scheduler's own work, which dominates a pod's start, differs between the two nodes by more than nri-gpu's round trip"})
	dra := float64(percentile(kinds[2].ds, 50)) / float64(percentile(kinds[0].ds, 50))
	r.results = append(r.results, target{"cluster pod start median, DRA claim pods / device-plugin pods (both nri-gpu, one node)", "≤ 1.5", fmt.Sprintf("%.3f", dra), dra <= 1.5,
		"a claim pod waits for the claim made from its template, the scheduler's allocation and kubelet's prepare call to nri-gpu's DRA driver, none of which a device-plugin pod has"})
}

func containerd2Version() string {
	tools, err := harness.FindTools("")
	if err != nil {
		return "not found"
	}
	if tools, err = tools.WithContainerd(os.Getenv("NRI_GPU_REFERENCE_CONTAINERD")); err != nil {
		return "not found"
	}
	return tools.ContainerdVersion
}

// clusterValues are the chart values of a node's release: its node, and
// how kubelet's allocation reaches the runtime.
const clusterValues = `image: {pullPolicy: Never}
nodeSelector: {kubernetes.io/hostname: %s}
config:
  cdiSpecDirs: [%s]
  policy: {exclusive: true}
  devicePlugin:
    cdiDevices: %s
    resources: [{name: nvidia.com/gpu, devices: ["[0-3]"]}]
`

// draValues add DRA to bench-nri's release: GPUs 4 to 7, the API server
// reached through the port the bench forwards (no kube-proxy).
const draValues = `config:
  dra: {enabled: true, devices: ["[4-7]"]}
dra:
  apiServer: {host: 127.0.0.1, port: %d}
`

// draForwardPort is where bench-nri's nri-gpu reaches the API server.
const draForwardPort = 16445

func (r *report) runCluster(rounds int) ([]*clusterKind, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("needs root")
	}
	for _, env := range []string{harness.KubernetesEnv, harness.HelmEnv, "NRI_GPU_CNI", "NRI_GPU_IMAGE", "NRI_GPU_REFERENCE_CONTAINERD"} {
		if os.Getenv(env) == "" {
			return nil, fmt.Errorf("%s is not set (make bench sets it)", env)
		}
	}
	tools, err := harness.FindTools("")
	if err != nil {
		return nil, err
	}
	if tools, err = tools.WithContainerd(os.Getenv("NRI_GPU_REFERENCE_CONTAINERD")); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("/tmp", "nri-gpu-bench-cluster-") // short: it holds unix sockets
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	busybox := filepath.Join(dir, "busybox.tar")
	if err := harness.BuildImage(tools.Busybox, busybox); err != nil {
		return nil, err
	}
	c, err := harness.StartCluster(dir, os.Getenv(harness.KubernetesEnv))
	if err != nil {
		return nil, err
	}
	defer func() { _ = c.Stop() }()
	kinds := []*clusterKind{
		{name: "GPU pods, nri-gpu injecting (`cdiDevices: annotations`)", node: "bench-nri", gpus: 1},
		{name: "GPU pods, containerd's own CDI injecting (`cdiDevices: cri`)", node: "bench-cdi", gpus: 1},
		{name: "DRA claim pods, nri-gpu's DRA driver (bench-nri)", node: "bench-nri", claim: "bench-gpu"},
		// Half on each node: both nodes start as many pods a round.
		{name: "pods without GPUs", node: "bench-nri", other: "bench-cdi"},
	}
	for _, n := range []struct {
		name, mode string
		gpus       int
		dra        bool
	}{{"bench-nri", "annotations", 2 * clusterBatch, true}, {"bench-cdi", "cri", clusterBatch, false}} {
		node, err := c.AddNode(harness.NodeOptions{Name: n.name, Tools: tools, GPUs: n.gpus, EnableCDI: true,
			Images: []string{busybox, os.Getenv("NRI_GPU_IMAGE")}, CNIBin: os.Getenv("NRI_GPU_CNI")})
		if err != nil {
			return nil, err
		}
		values := filepath.Join(dir, n.name+".yaml")
		if err := os.WriteFile(values, []byte(fmt.Sprintf(clusterValues, n.name, harness.NodeSpecDir, n.mode)), 0o644); err != nil {
			return nil, err
		}
		args := []string{"install", "nri-gpu-" + n.mode, "deploy/helm/nri-gpu", "--namespace", "nri-gpu", "--create-namespace", "--values", values, "--wait", "--timeout", "3m"}
		if n.dra {
			fwd := node.ForwardToPods("app.kubernetes.io/name=nri-gpu", draForwardPort, strings.TrimPrefix(c.Server, "https://"))
			defer fwd.Stop()
			dra := filepath.Join(dir, n.name+"-dra.yaml")
			if err := os.WriteFile(dra, []byte(fmt.Sprintf(draValues, draForwardPort)), 0o644); err != nil {
				return nil, err
			}
			args = append(args, "--values", dra)
		}
		if _, err := c.Helm(os.Getenv(harness.HelmEnv), args...); err != nil {
			return nil, err
		}
	}
	tpl := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: "bench-gpu", Namespace: "default"},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: harness.ClaimSpec("gpu.nri-gpu.io", 1)}}
	if _, err := c.Client.ResourceV1().ResourceClaimTemplates("default").Create(context.Background(), tpl, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	for _, n := range c.Nodes {
		if err := n.WaitAllocatable(clusterBatch, 2*time.Minute); err != nil {
			return nil, err
		}
	}
	for round := 0; round < rounds+1; round++ {
		ds, err := startBatch(c, kinds, round)
		if err != nil {
			return nil, err
		}
		if round == 0 {
			continue // warm-up
		}
		for i, k := range kinds {
			k.ds = append(k.ds, ds[i]...)
		}
	}
	return kinds, nil
}

// startBatch creates clusterBatch pods of each kind, one of each in turn,
// waits until all run, and returns each kind's times; it then deletes
// them and waits until they are gone.
func startBatch(c *harness.Cluster, kinds []*clusterKind, round int) ([][]time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pods := c.Client.CoreV1().Pods("default")
	w, err := pods.Watch(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	defer w.Stop()
	var mu sync.Mutex
	created := map[string]time.Time{}
	kindOf := map[string]int{}
	ds := make([][]time.Duration, len(kinds))
	running := 0
	done := make(chan struct{})
	go func() {
		seen := map[string]bool{}
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok || ev.Type == watch.Deleted || p.Status.Phase != corev1.PodRunning || seen[p.Name] {
				continue
			}
			now := time.Now()
			mu.Lock()
			if start, ok := created[p.Name]; ok {
				seen[p.Name] = true
				ds[kindOf[p.Name]] = append(ds[kindOf[p.Name]], now.Sub(start))
				if running++; running == clusterBatch*len(kinds) {
					close(done)
				}
			}
			mu.Unlock()
		}
	}()
	var names []string
	for i := 0; i < clusterBatch; i++ {
		// Each kind goes first in turn, so that none is always created
		// before the others.
		for j := range kinds {
			k := (j + round + i) % len(kinds)
			node := kinds[k].node
			if kinds[k].other != "" && i%2 == 1 {
				node = kinds[k].other
			}
			name := fmt.Sprintf("r%d-k%d-%d", round, k, i)
			names = append(names, name)
			mu.Lock()
			created[name], kindOf[name] = time.Now(), k
			mu.Unlock()
			if _, err := pods.Create(ctx, benchPod(name, node, kinds[k].gpus, kinds[k].claim), metav1.CreateOptions{}); err != nil {
				return nil, err
			}
		}
	}
	select {
	case <-done:
	case <-ctx.Done():
		return nil, fmt.Errorf("round %d: %d of %d pods running after 3m", round, running, len(names))
	}
	zero := int64(0)
	for _, name := range names {
		if err := pods.Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
			return nil, err
		}
	}
	// The next round starts on idle nodes: the pods are gone from the API,
	// and their sandboxes stopped on the nodes (kubelet stops them a
	// moment after the API lets go of them; until then nri-gpu holds
	// their devices).
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		list, err := pods.List(context.Background(), metav1.ListOptions{})
		idle := err == nil && len(list.Items) == 0
		for _, n := range c.Nodes {
			out, err := n.Ctd.Crictl("pods", "-q", "--namespace", "default", "--state", "ready")
			idle = idle && err == nil && strings.TrimSpace(out) == ""
		}
		if idle {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("round %d: pods not gone in 2m", round)
		}
	}
	return ds, nil
}

// benchPod is a pod of the test image sleeping, on node, asking for gpus
// of the device plugin or, with claim, for a claim made from that
// template.
func benchPod(name, node string, gpus int64, claim string) *corev1.Pod {
	p := harness.SleepPod("default", name, gpus)
	p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": node}
	if claim != "" {
		harness.UseClaimTemplate(p, claim)
	}
	return p
}
