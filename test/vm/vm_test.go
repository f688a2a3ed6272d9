// Package vm tests nri-gpu on the node shape of current distributions:
// cgroup v2 alone, systemd as PID 1, runc's systemd cgroup driver. These
// machines are cgroup v1, so the node is a VM (hack/vm-root.sh builds its
// Debian root; qemu's software emulation boots it): TestCgroupV2Node
// boots it with a payload of the binaries under test and the tests that
// run inside (guest_test.go, built with the vmguest tag, and a selection
// of the end-to-end suite under the systemd driver), and fails with their
// failures. It needs root; without root or the VM's files it is skipped
// and says why, unless NRI_GPU_E2E_REQUIRED=1 (make test) makes that a
// failure.
package vm

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nri-gpu/nri-gpu/test/harness"
)

// Environment the tools are named by (`make test` sets them).
const (
	imageEnv = "NRI_GPU_IMAGE"
	cniEnv   = "NRI_GPU_CNI"
)

// e2eOnTheNode are the end-to-end tests that also run on the node, under
// runc's systemd cgroup driver: where nri-gpu reads cgroups (a container
// created while it was away and stopped by its cgroup, a pod's sandbox
// found by its cgroup, the record rebuilt from running containers), MPS
// clients, and the driver's GPU memory bounds (cgroup v2 only).
var e2eOnTheNode = []string{"TestPodAnnotationInjectsDevice", "TestUnservedStopped", "TestRebuiltRecord", "TestExclusiveUntilTheHolderIsRemoved", "TestSharingWithMPS", "TestDriverBoundsMemory"}

// clusterOnTheNode are the cluster tests that run on the node, its one
// GPU node with kubelet's defaults: the node's shape, nri-gpu installed by
// the chart, a pod of each door resized in place, and the crash and
// upgrade streams (pods of every door created throughout).
var clusterOnTheNode = []string{"TestNodeShape", "TestInstalled", "TestInPlaceResize", "TestCrashStream", "TestUpgradeStream", "TestDriverBoundsClaims"}

// clusterOnCRIO are the cluster tests that run again with CRI-O as the
// node's runtime (systemd's cgroup manager): the node's shape, the chart,
// a pod of each door resized in place. (The crash stream passed there
// too, but costs minutes CI's limit cannot spare; test/crio restarts
// nri-gpu on CRI-O.)
var clusterOnCRIO = []string{"TestNodeShape", "TestInstalled", "TestInPlaceResize", "TestDriverBoundsClaims"}

// crioMarker starts the CRI-O run's output.
const crioMarker = "== the cluster again, its node on CRI-O"

// guestTests are the guest's own tests (guest_test.go).
var guestTests = []string{"TestGuestNodeShape", "TestGuestDeviceCgroupHolds", "TestGuestSandboxWatch"}

// runScript is the payload's run, the node's service's one command: each
// suite from its package's directory (the chart and test data are where
// the tests look for them).
const runScript = `#!/bin/sh
# Runs on the cgroup v2 node (test/vm): the guest's tests, a selection of
# the end-to-end tests and of the cluster tests, every containerd with
# runc's systemd cgroup driver.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root TMPDIR=/tmp
export NRI_GPU_TOOLS=/payload/bin NRI_GPU_CONTAINERD=/payload/containerd NRI_GPU_REFERENCE_CONTAINERD=/payload/containerd
export NRI_GPU_FAKE_DRIVER=/payload/fake-driver
export NRI_GPU_IMAGE=/payload/nri-gpu-image.tar NRI_GPU_KUBERNETES=/payload/kubernetes NRI_GPU_HELM=/payload/bin/helm NRI_GPU_CNI=/payload/cni
export NRI_GPU_SYSTEMD_CGROUP=1 NRI_GPU_E2E_REQUIRED=1
echo "node: $(uname -r), $(stat -f -c %T /sys/fs/cgroup) at /sys/fs/cgroup, PID 1 $(cat /proc/1/comm), $(nproc) CPUs, $(awk '/MemTotal/ {print int($2 / 1024)}' /proc/meminfo) MiB"
rc=0
part() { case ",PARTS," in *",$1,"*) return 0;; esac; return 1; }
if part guest; then cd /payload/test/vm && ./vm.test -test.v -test.run 'GUEST_TESTS' -test.timeout 15m || rc=1; fi
if part e2e; then cd /payload/test/e2e && ./e2e.test -test.v -test.run 'E2E_ON_THE_NODE' -test.timeout 20m || rc=1; fi
if part cluster; then cd /payload/test/cluster && ./cluster.test -test.v -test.run 'CLUSTER_ON_THE_NODE' -test.timeout 30m || rc=1; fi
echo "CRIO_MARKER"
if part crio; then cd /payload/test/cluster && NRI_GPU_NODE_RUNTIME=crio NRI_GPU_CRIO=/payload/crio ./cluster.test -test.v -test.run 'CLUSTER_ON_CRIO' -test.timeout 30m || rc=1; fi
exit $rc
`

// kernelLines are the kernel's lines on the console ("[  120.429941] reboot: Power down").
var kernelLines = regexp.MustCompile(`(?m)^\[\s*[0-9]+\.[0-9]+\] .*\n?`)

// TestCgroupV2Node boots the cgroup v2 node and runs the tests inside
// it: its shape (TestGuestNodeShape), a pod's GPU through systemd's
// reloads, a resources update and restarts of containerd and nri-gpu
// (TestGuestDeviceCgroupHolds), a pod's sandbox found by its cgroup
// (TestGuestSandboxWatch), e2eOnTheNode, clusterOnTheNode (a cluster
// whose one GPU node is this one, kubelet with its defaults), and
// clusterOnCRIO (that node's runtime CRI-O, under systemd's cgroup
// manager).
func TestCgroupV2Node(t *testing.T) {
	tools, crio, img := needNode(t)
	dir := t.TempDir()
	payload := filepath.Join(dir, "payload")
	if err := buildPayload(t, tools, crio, payload); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	run, err := img.Boot(dir, payload, 40*time.Minute)
	t.Logf("the node (%s) ran %s", img.Source, time.Since(start).Round(time.Second))
	// What the payload printed, from its first line; the boot before it
	// only where the payload never ran.
	out := run.Console
	if i := strings.Index(out, "node: "); i >= 0 {
		out = kernelLines.ReplaceAllString(out[i:], "")
	}
	t.Logf("the node's console:\n%s", out)
	if err != nil {
		t.Fatal(err)
	}
	if run.Status != 0 {
		fails := regexp.MustCompile(`(?m)^\s*--- FAIL: .*$`).FindAllString(out, -1)
		t.Fatalf("the tests on the node exited %d; failed:\n%s", run.Status, strings.Join(fails, "\n"))
	}
	// Each test ran and passed: none was left out or skipped.
	onContainerd, onCRIO, _ := strings.Cut(out, crioMarker)
	for _, part := range vmParts() {
		names, where := map[string][]string{"guest": guestTests, "e2e": e2eOnTheNode, "cluster": clusterOnTheNode, "crio": clusterOnCRIO}[part], onContainerd
		if part == "crio" {
			where = onCRIO
		}
		for _, name := range names {
			if !strings.Contains(where, "--- PASS: "+name+" ") {
				t.Errorf("the node's output does not say %s (%s) passed", name, part)
			}
		}
	}
}

// needNode returns the tools (containerd 2.x), CRI-O's and the node's
// image, or skips saying why, a failure under NRI_GPU_E2E_REQUIRED=1.
func needNode(t *testing.T) (harness.Tools, harness.CRIOTools, harness.VMImage) {
	t.Helper()
	var why string
	tools, err := harness.FindTools("")
	crio, crioErr := harness.FindCRIO("")
	img, vmErr := harness.FindVM("")
	switch {
	case os.Geteuid() != 0:
		why = "the cgroup v2 node needs root (its disks, the tests inside it)"
	case err != nil:
		why = fmt.Sprintf("tools missing (run make test): %v", err)
	case !tools.Containerd2():
		why = fmt.Sprintf("containerd %s: the node runs 2.x (set %s)", tools.ContainerdVersion, harness.ContainerdEnv)
	case vmErr != nil:
		why = fmt.Sprintf("the node's files missing (run make test): %v", vmErr)
	case crioErr != nil:
		why = fmt.Sprintf("CRI-O missing (run make test): %v", crioErr)
	default:
		for _, name := range []string{imageEnv, cniEnv, harness.HelmEnv, harness.KubernetesEnv} {
			if os.Getenv(name) == "" {
				why = fmt.Sprintf("%s is not set (make test sets it)", name)
			}
		}
	}
	if why != "" {
		if os.Getenv("NRI_GPU_E2E_REQUIRED") == "1" {
			t.Fatalf("%s, and NRI_GPU_E2E_REQUIRED=1", why)
		}
		t.Skip(why)
	}
	return tools, crio, img
}

// buildPayload lays out what the node runs: nri-gpu, its image and its
// chart, the containerd 2.x under test with its runc, Kubernetes' binaries,
// Helm, the CNI plugins, the tests (built here) beside their packages'
// test data, and the run script.
func buildPayload(t *testing.T, tools harness.Tools, crio harness.CRIOTools, dir string) error {
	t.Helper()
	copies := map[string]string{os.Getenv(imageEnv): filepath.Join(dir, "nri-gpu-image.tar"), os.Getenv(harness.HelmEnv): filepath.Join(dir, "bin", "helm")}
	for _, name := range []string{"nri-gpu", "nri-gpu-dra", "crictl", "mps-control"} {
		copies[filepath.Join(tools.Dir, name)] = filepath.Join(dir, "bin", name)
	}
	for _, name := range []string{"containerd", "ctr", "containerd-shim-runc-v2"} {
		copies[tools.Path(name)] = filepath.Join(dir, "containerd", name)
	}
	copies[tools.Runc] = filepath.Join(dir, "containerd", "runc")
	for _, name := range []string{"etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "kubelet"} {
		copies[filepath.Join(os.Getenv(harness.KubernetesEnv), name)] = filepath.Join(dir, "kubernetes", name)
	}
	for _, name := range []string{"bridge", "host-local", "loopback"} {
		copies[filepath.Join(os.Getenv(cniEnv), name)] = filepath.Join(dir, "cni", name)
	}
	copies[crio.Crio], copies[crio.Pinns] = filepath.Join(dir, "crio", "crio"), filepath.Join(dir, "crio", "pinns")
	for from, to := range copies {
		if err := copyFile(from, to); err != nil {
			return err
		}
	}
	for _, tree := range []string{"deploy/helm/nri-gpu", "test/cluster/testdata"} {
		if err := os.CopyFS(filepath.Join(dir, tree), os.DirFS(filepath.Join("..", "..", tree))); err != nil {
			return err
		}
	}
	// The node has no compiler: the fake driver is built here.
	if err := harness.BuildFakeDriver(harness.GuestFakeDriver(), filepath.Join(dir, "fake-driver")); err != nil {
		return err
	}
	if err := harness.BuildFakeDriver(harness.ClusterFakeDriver(1), filepath.Join(dir, "fake-driver", harness.ClusterFakeDriverDir)); err != nil {
		return err
	}
	for _, pkg := range []string{"vm", "e2e", "cluster"} {
		out := filepath.Join(dir, "test", pkg, pkg+".test")
		cmd := exec.Command("go", "test", "-c", "-tags", "vmguest", "-o", out, "../"+pkg)
		if b, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("building test/%s's tests: %w: %s", pkg, err, b)
		}
	}
	script := strings.NewReplacer("GUEST_TESTS", runPattern(guestTests), "E2E_ON_THE_NODE", runPattern(e2eOnTheNode),
		"CLUSTER_ON_THE_NODE", runPattern(clusterOnTheNode), "CLUSTER_ON_CRIO", runPattern(clusterOnCRIO), "CRIO_MARKER", crioMarker, "PARTS", strings.Join(vmParts(), ",")).Replace(runScript)
	return os.WriteFile(filepath.Join(dir, "run"), []byte(script), 0o755)
}

// partsEnv names the parts of the node's run to run (a comma-separated
// list of guest, e2e, cluster, crio; all when unset), to run one again
// while changing it.
const partsEnv = "NRI_GPU_VM_PARTS"

// vmParts are the parts of the node's run partsEnv names.
func vmParts() []string {
	if p := os.Getenv(partsEnv); p != "" {
		return strings.Split(p, ",")
	}
	return []string{"guest", "e2e", "cluster", "crio"}
}

// runPattern is -test.run's pattern for exactly these tests.
func runPattern(names []string) string {
	return "^(" + strings.Join(names, "|") + ")$"
}

// copyFile copies a file, keeping its mode.
func copyFile(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	info, err := os.Stat(from)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		return err
	}
	return os.WriteFile(to, b, info.Mode().Perm())
}
