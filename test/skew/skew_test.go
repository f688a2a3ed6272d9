// Package skew runs nri-gpu's DRA driver against the control plane and
// kubelet of the oldest Kubernetes release where DRA is GA (1.34, built
// by make from test/tools/kubernetes with go.1.34.mod): a claim's GPU is injected on
// containerd 1.7.35 with CDI off, as on the cluster of the current
// release, and what 1.34 does not have (consumable capacity, device
// taints) is off there, said in nri-gpu's log, never half-published.
package skew

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/test/harness"
)

const (
	// SkewEnv names the directory of the 1.34 components.
	SkewEnv     = "NRI_GPU_KUBERNETES_SKEW"
	requiredEnv = "NRI_GPU_E2E_REQUIRED"
	chartDir    = "../../deploy/helm/nri-gpu"
	driverName  = "gpu.nri-gpu.io"
	forwardPort = 16444
	wait        = 90 * time.Second
)

// values install nri-gpu with DRA on, the first GPU shared two ways with
// 80Gi (which a 1.37 control plane offers to two claims at once), bounded
// by agreement (no driver here bounds its holders' memory).
const values = `image: {pullPolicy: Never}
config:
  cdiSpecDirs: [%s]
  policy:
    exclusive: true
    memoryLimits: agreement
    sharing: [{devices: ["nvidia.com/gpu=0"], replicas: 2, memory: 80Gi}]
  dra: {enabled: true, unhealthyTaint: NoSchedule}
dra:
  apiServer: {host: 127.0.0.1, port: %d}
logLevel: debug
`

// TestDRAOn134: with Kubernetes 1.34's API server, scheduler, controller
// manager and kubelet, nri-gpu's DRA driver registers, publishes its
// slice (GPU 0, which policy.sharing shares, as one device: 1.34 has no
// consumable capacity, so one claim at a time), and a pod's claim gets
// its GPU injected on containerd 1.7.35 with CDI off; a second claim for
// GPU 0 waits until the first is gone. A GPU whose device node goes
// leaves the slice there (no device taints in 1.34) and comes back.
func TestDRAOn134(t *testing.T) {
	bin := os.Getenv(SkewEnv)
	tools, err := harness.FindTools("")
	skip := ""
	switch {
	case os.Geteuid() != 0:
		skip = "needs root"
	case err != nil:
		skip = fmt.Sprintf("end-to-end tools missing (run make test): %v", err)
	case bin == "" || os.Getenv(harness.HelmEnv) == "" || os.Getenv("NRI_GPU_IMAGE") == "" || os.Getenv("NRI_GPU_CNI") == "":
		skip = SkewEnv + ", " + harness.HelmEnv + ", NRI_GPU_IMAGE or NRI_GPU_CNI is not set (make test sets them)"
	}
	if skip != "" {
		if os.Getenv(requiredEnv) == "1" {
			t.Fatalf("%s, and %s=1", skip, requiredEnv)
		}
		t.Skip(skip)
	}
	if removed := harness.SweepKilledRun(); len(removed) > 0 {
		t.Logf("removed what a killed run left: %s", strings.Join(removed, ", "))
	}
	before := harness.Host()
	dir, err := os.MkdirTemp("/tmp", "nri-gpu-skew-") // short: it holds unix sockets
	if err != nil {
		t.Fatal(err)
	}
	busybox := filepath.Join(dir, "busybox.tar")
	if err := harness.BuildImage(tools.Busybox, busybox); err != nil {
		t.Fatal(err)
	}
	c, err := harness.StartCluster(dir, bin)
	if err != nil {
		t.Fatal(err)
	}
	var fwd *harness.PodForwarder
	t.Cleanup(func() {
		if fwd != nil {
			fwd.Stop()
		}
		if err := c.Stop(); err != nil {
			t.Error(err)
		}
		_ = os.RemoveAll(dir)
		if changes := harness.Host().Changes(before); len(changes) > 0 {
			t.Errorf("the run changed the machine:\n%s", strings.Join(changes, "\n"))
		}
	})
	n, err := c.AddNode(harness.NodeOptions{Name: "node-134", Tools: tools, GPUs: 2, Images: []string{busybox, os.Getenv("NRI_GPU_IMAGE")}, CNIBin: os.Getenv("NRI_GPU_CNI")})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	v, err := c.Client.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	if v.Minor != "34" {
		t.Fatalf("the API server is %s, want 1.34", v.GitVersion)
	}
	fwd = n.ForwardToPods("app.kubernetes.io/name=nri-gpu", forwardPort, strings.TrimPrefix(c.Server, "https://"))
	valuesFile := filepath.Join(dir, "values.yaml")
	if err := os.WriteFile(valuesFile, []byte(fmt.Sprintf(values, harness.NodeSpecDir, forwardPort)), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := c.Helm(os.Getenv(harness.HelmEnv), "install", "nri-gpu", chartDir, "--namespace", "nri-gpu", "--create-namespace",
		"--values", valuesFile, "--wait", "--timeout", "3m"); err != nil {
		t.Fatalf("helm install on 1.34: %v\n%s\n%s", err, out, n.KubeletLogTail(20))
	}
	t.Cleanup(func() {
		_, _ = c.Helm(os.Getenv(harness.HelmEnv), "uninstall", "nri-gpu", "--namespace", "nri-gpu", "--wait", "--timeout", "2m")
	})

	devices := func() map[string]resourceapi.Device {
		devs, err := c.SliceDevices(n.Name, driverName)
		if err != nil {
			return map[string]resourceapi.Device{}
		}
		return devs
	}
	names := func() []string {
		var out []string
		for name := range devices() {
			out = append(out, name)
		}
		slices.Sort(out)
		return out
	}
	testutil.Within(t, wait, "node-134's slice offers gpu-0 and gpu-1", func() bool { return slices.Equal(names(), []string{"gpu-0", "gpu-1"}) })
	// The driver published gpu-0 for several claims, the API server
	// dropped that, and the driver offers it to one claim from then on.
	testutil.Within(t, wait, "gpu-0 offered to one claim", func() bool {
		d := devices()["gpu-0"]
		for _, c := range d.Capacity {
			if c.RequestPolicy != nil {
				return false
			}
		}
		return d.AllowMultipleAllocations == nil
	})

	// The chart's DeviceClass selects the driver's devices.
	for _, name := range []string{"first", "second"} {
		spec := harness.ClaimSpec(driverName, 1)
		spec.Devices.Requests[0].Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.attributes["` + driverName + `"].index == 0`}}}
		tpl := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}, Spec: resourceapi.ResourceClaimTemplateSpec{Spec: spec}}
		if _, err := c.Client.ResourceV1().ResourceClaimTemplates("default").Create(ctx, tpl, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		p := harness.UseClaimTemplate(harness.SleepPod("default", name, 0), tpl.Name)
		if _, err := c.Client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pod := func(name string) *corev1.Pod {
		p, err := c.Client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return &corev1.Pod{}
		}
		return p
	}
	running := func(name string) bool { return pod(name).Status.Phase == corev1.PodRunning }
	testutil.Within(t, wait, "one of the two claim pods running", func() bool { return running("first") || running("second") })
	first, second := "first", "second"
	if !running(first) {
		first, second = second, first
	}
	p := pod(first)
	out, err := n.Ctd.Exec(strings.TrimPrefix(p.Status.ContainerStatuses[0].ContainerID, "containerd://"), "ls", "/dev")
	if err != nil || !slices.Contains(strings.Fields(out), "nvidia0") || slices.Contains(strings.Fields(out), "nvidia1") {
		t.Errorf("pod %s (claim on 1.34, containerd 1.7.35 with CDI off): /dev %v, %q; want nvidia0 only", first, err, out)
	}
	// The scheduler has looked at the other: it cannot allocate its
	// claim (GPU 0 is the first's).
	testutil.Within(t, wait, "pod "+second+" unschedulable", func() bool {
		for _, c := range pod(second).Status.Conditions {
			if c.Type == corev1.PodScheduled {
				return c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable
			}
		}
		return false
	})
	if running(second) {
		t.Errorf("pod %s runs beside %s: 1.34 allocated GPU 0 to two claims", second, first)
	}
	if err := c.Client.CoreV1().Pods("default").Delete(ctx, first, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	testutil.Within(t, wait, "pod "+second+" running once "+first+" is gone", func() bool { return running(second) })
	t.Logf("1.34 (%s): claim pod %s ran with nvidia0; %s waited and ran after it", v.GitVersion, first, second)

	// No device taints in 1.34: a GPU whose node is gone leaves the slice.
	if err := os.Remove(n.Dev("nvidia1")); err != nil {
		t.Fatal(err)
	}
	testutil.Within(t, wait, "gpu-1 leaves node-134's slice", func() bool { return slices.Equal(names(), []string{"gpu-0"}) })
	if err := n.RestoreGPU(1); err != nil {
		t.Fatal(err)
	}
	testutil.Within(t, wait, "gpu-1 back in node-134's slice", func() bool { return slices.Equal(names(), []string{"gpu-0", "gpu-1"}) })

	// nri-gpu said what 1.34 does not keep, once each.
	pods, err := c.Client.CoreV1().Pods("nri-gpu").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=nri-gpu"})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("nri-gpu's pods: %v, %v", err, pods)
	}
	log := n.PodLog("nri-gpu", pods.Items[0].Name, "nri-gpu")
	for _, want := range []string{"does not keep consumable capacity (DRAConsumableCapacity is off", "does not keep device taints (DRADeviceTaints is off"} {
		if got := strings.Count(log, want); got != 1 {
			t.Errorf("nri-gpu's log says %q %d times, want once:\n%s", want, got, log)
		}
	}
}
