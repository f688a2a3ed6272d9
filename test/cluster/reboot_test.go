package cluster

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/test/harness"
)

// earlierBoot is the boot ID TestReboot gives node-a's kept record: the
// kernel's own cannot be changed, so the record is made one of an
// earlier boot.
const earlierBoot = "00000000-0000-4000-8000-000000000000"

// rebootPod is a pod of TestReboot: its door and node, whether it is
// created while the nodes are off (or before), and whether it is deleted
// while they are off. A device-plugin pod from before is a Deployment's:
// after a reboot, kubelet admits the pods it had before their device
// plugin registers again, and fails those asking for its resource
// (UnexpectedAdmissionError, kubernetes/kubernetes#125579, whatever the
// device plugin): a workload's controller makes another, a bare pod is
// lost.
type rebootPod struct {
	name, door string
	node       *harness.Node
	whileOff   bool
	deleted    bool
}

// deployment reports whether the pod is a Deployment's.
func (r rebootPod) deployment() bool { return r.door == "device plugin" && !r.whileOff }

// create creates the pod (or its Deployment), deleted when the test ends.
func (r rebootPod) create(t *testing.T) {
	t.Helper()
	if !r.deployment() {
		createPod(t, r.pod())
		return
	}
	labels := map[string]string{"app": r.name}
	one := int32(1)
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: r.name, Namespace: "default"},
		Spec: appsv1.DeploymentSpec{
			Replicas: &one,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: r.pod().Spec},
		},
	}
	if _, err := env.client.AppsV1().Deployments("default").Create(context.Background(), dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteDeployment(t, r.name, labels) })
}

// remove deletes the pod (or its Deployment) and waits until it is gone.
func (r rebootPod) remove(t *testing.T) {
	t.Helper()
	if r.deployment() {
		deleteDeployment(t, r.name, map[string]string{"app": r.name})
		return
	}
	deletePod(t, "default", r.name)
}

// current returns the pod, or the Deployment's pods.
func (r rebootPod) current(t *testing.T) []corev1.Pod {
	t.Helper()
	if r.deployment() {
		return labelled(t, map[string]string{"app": r.name})
	}
	p, err := env.client.CoreV1().Pods("default").Get(context.Background(), r.name, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	return []corev1.Pod{*p}
}

// pod is the pod's object.
func (r rebootPod) pod() *corev1.Pod {
	switch r.door {
	case "annotation":
		return scheduledOn(r.node, gpuPod("default", r.name, 0, map[string]string{"gpu-count.nri-gpu.io": "1"}, ""))
	case "device plugin":
		return scheduledOn(r.node, gpuPod("default", r.name, 1, nil, ""))
	}
	return claimPod("default", r.name, r.node, "reboot-gpu", "")
}

// running waits until every container of the pod runs, its GPU
// container another than the one was names (none before the reboot, the
// one from before it after), and returns the GPUs that container sees
// and its ID.
func (r rebootPod) running(t *testing.T, was string) (gpus []string, id string) {
	t.Helper()
	ctr := "main"
	if r.door == "DRA" {
		ctr = "gpu"
	}
	var pods []corev1.Pod
	var p *corev1.Pod
	defer func() {
		if t.Failed() {
			t.Logf("%s last seen:\n%s", r.name, describe(pods))
			for _, q := range pods {
				if e := warning("default", q.Name, "", nil); e != nil {
					t.Logf("%s's last warning: %s: %s", q.Name, e.Reason, e.Message)
				}
			}
		}
	}()
	testutil.Within(t, podWait, "pod "+r.name+" Running in a new container", func() bool {
		pods = r.current(t)
		for i, got := range pods {
			if got.Status.Phase != corev1.PodRunning || len(got.Status.ContainerStatuses) != len(got.Spec.Containers) {
				continue
			}
			if !slices.ContainsFunc(got.Status.ContainerStatuses, func(s corev1.ContainerStatus) bool {
				return s.State.Running == nil || s.Name == ctr && runtimeID(s.ContainerID) == was
			}) {
				p = &pods[i]
				return true
			}
		}
		return false
	})
	id = containerID(t, p, ctr)
	return gpusIn(t, r.node, id, r.name), id
}

// TestReboot: both nodes rebooted at once, as far as what a reboot loses
// goes (every container and its mounts, the pods' network, /run and
// containerd's state; the disk kept), while pods of every door hold
// GPUs on them. node-a (containerd 1.7.35) keeps nri-gpu's record, as a
// state file on a disk does, now one of an earlier boot; node-b (2.3.7)
// loses it with /run, as the chart's default keeps it. While the nodes
// are off, a claim pod of node-a is deleted and pods are created (kubelet
// starts them when it is back, before or after nri-gpu's own pod). Once
// they are back, every pod left runs again, in new containers, with
// exactly one GPU, none seen twice (the deleted pod's GPU and claim are
// not held by the kept record: node-a's nri-gpu says the record is of an
// earlier boot); with the pods deleted, every GPU is offered again.
func TestReboot(t *testing.T) {
	needCluster(t)
	createTemplate(t, "default", "reboot-gpu", harness.ClaimSpec(driverName, 1))
	pods := []rebootPod{
		{name: "reboot-a-plugin", door: "device plugin", node: env.a},
		{name: "reboot-a-claim", door: "DRA", node: env.a, deleted: true},
		{name: "reboot-a-count", door: "annotation", node: env.a, whileOff: true},
		{name: "reboot-b-count", door: "annotation", node: env.b},
		{name: "reboot-b-plugin", door: "device plugin", node: env.b},
		{name: "reboot-b-claim", door: "DRA", node: env.b},
		{name: "reboot-b-claim-off", door: "DRA", node: env.b, whileOff: true},
	}
	before := map[string]string{}
	for _, r := range pods {
		if !r.whileOff {
			r.create(t)
			_, before[r.name] = r.running(t, "")
		}
	}
	nodes := env.nodes
	record := filepath.Join(env.a.Dir, "run", "nri-gpu", "allocations.json")
	off := map[*harness.Node]bool{}
	t.Cleanup(func() {
		for _, n := range nodes {
			if off[n] {
				if err := n.PowerOn(); err != nil {
					t.Errorf("%s not booted again: %v", n.Name, err)
				}
			}
		}
	})
	for _, n := range nodes {
		off[n] = true
		keep := []string{}
		if n == env.a {
			keep = append(keep, "nri-gpu")
		}
		if err := n.PowerOff(keep...); err != nil {
			t.Fatalf("%s: power off: %v", n.Name, err)
		}
	}
	bootOf(t, record, earlierBoot)
	if _, err := os.Stat(filepath.Join(env.b.Dir, "run", "nri-gpu")); !os.IsNotExist(err) {
		t.Fatalf("node-b's /run/nri-gpu still there after its reboot (%v)", err)
	}
	ctx := context.Background()
	for _, r := range pods {
		switch {
		case r.deleted:
			if err := env.client.CoreV1().Pods("default").Delete(ctx, r.name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
				t.Fatal(err)
			}
		case r.whileOff:
			r.create(t)
		}
	}
	for _, n := range nodes {
		if err := n.PowerOn(); err != nil {
			t.Fatalf("%s: boot: %v", n.Name, err)
		}
		off[n] = false
	}
	for _, r := range pods {
		if r.deleted {
			continue
		}
		gpus, _ := r.running(t, before[r.name])
		if len(gpus) != 1 {
			t.Errorf("%s (%s on %s): Running with %v after the reboot, want one GPU", r.name, r.door, r.node.Name, gpus)
		}
		t.Logf("%s (%s on %s, created %s): Running with %v", r.name, r.door, r.node.Name, map[bool]string{true: "while the node was off", false: "before the reboot"}[r.whileOff], gpus)
	}
	for _, n := range nodes {
		noGPUTwice(t, n)
	}
	if log := nriLog(t, env.a); !strings.Contains(log, "kept before the node last booted (boot "+earlierBoot+")") {
		t.Errorf("node-a's nri-gpu does not say its record is of an earlier boot:\n%s", log)
	}
	if got := bootOf(t, record, ""); got == earlierBoot || got == "" {
		t.Errorf("node-a's record written again with boot ID %q, want this boot's", got)
	}
	for _, r := range pods {
		r.remove(t)
	}
	waitAllReleased(t, nodes)
}

// bootOf returns the boot ID of the record at path, and sets it to boot
// first unless boot is empty.
func bootOf(t *testing.T, path, boot string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rec map[string]any
	if err := json.Unmarshal(data, &rec); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	was, _ := rec["bootId"].(string)
	if boot == "" {
		return was
	}
	if was == "" {
		t.Fatalf("%s: no boot ID in the record: %s", path, data)
	}
	rec["bootId"] = boot
	if data, err = json.Marshal(rec); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return was
}
