package plugin_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/mps"
	"github.com/nri-gpu/nri-gpu/pkg/plugin"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
)

// namedTwice is a spec of two GPUs, each by index and, with uuids, by
// UUID (GPU-0000 and GPU-1111), their nodes files under dir.
func namedTwice(t *testing.T, dir string, uuids bool) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("cdiVersion: \"0.6.0\"\nkind: nvidia.com/gpu\ndevices:\n")
	for i := range 2 {
		node := filepath.Join(dir, fmt.Sprintf("nvidia%d", i))
		writeFile(t, node, nil)
		names := []string{fmt.Sprint(i)}
		if uuids {
			names = append(names, fmt.Sprintf("GPU-%d%d%d%d", i, i, i, i))
		}
		for _, name := range names {
			fmt.Fprintf(&b, "  - name: %q\n    containerEdits: {deviceNodes: [{path: /dev/nvidia%d, hostPath: %s, type: c, major: 195, minor: %d}]}\n", name, i, node, i)
		}
	}
	return b.String()
}

// TestSharingByHardware: a GPU policy.sharing shares with MPS by its UUID
// is shared with MPS by its index too, over the request path: a pod
// asking by index gets the same daemon and bounds as one asking by UUID,
// and counts among its replicas (before, it got the GPU unbounded, and
// beyond the replicas).
func TestSharingByHardware(t *testing.T) {
	dir, root := t.TempDir(), testutil.ShortDir(t)
	specDir := specDirWith(t, dir, "gpu.yaml", namedTwice(t, dir, true))
	ctl := standin(t)
	p, _ := logged(t, fmt.Sprintf(`policy:
  sharing: [{devices: ["nvidia.com/gpu=GPU-0000"], replicas: 2, strategy: mps, pinnedMemoryLimit: 1Gi}]
mps: {daemon: external, controlCommand: %s, root: %s}
`, ctl, root), plugin.WithSpecDirs([]string{specDir}))
	gpuDir := filepath.Join(root, "GPU-0000")
	d := mps.Daemon{Control: ctl, Dir: gpuDir}
	t.Cleanup(func() { quitAll(root) })
	if err := d.Start(context.Background(), mps.Limits{ActiveThreadPercentage: 50, PinnedMemoryMiB: 1024}, startedInDir); err != nil {
		t.Fatal(err)
	}
	ask := func(name, devices string) (*api.ContainerAdjustment, error) {
		pod := gpuPod(name, map[string]string{"gpus.nri-gpu.io": devices})
		adj, _, err := p.CreateContainer(context.Background(), pod, ctrOf(pod, nil))
		return adj, err
	}
	for _, tc := range []struct{ pod, devices string }{{"a", "GPU-0000"}, {"b", "0"}} {
		adj, err := ask(tc.pod, tc.devices)
		if err != nil {
			t.Fatalf("pod %s asking for %s: %v", tc.pod, tc.devices, err)
		}
		wantClient(t, adj, gpuDir, 50, 1024)
	}
	_, err := ask("c", "0")
	wantRule(t, err, policy.RuleSharing, `device "nvidia.com/gpu=0" is shared by policy.sharing[0] (replicas 2, mps) and used by 2 already: pod tenant/a, pod tenant/b`)
	if _, err := ask("c", "1"); err != nil {
		t.Errorf("GPU 1, not shared: %v", err)
	}
}

// wantRule fails unless err is a policy denial by rule that says each of
// want.
func wantRule(t *testing.T, err error, rule string, want ...string) {
	t.Helper()
	var d *policy.Denial
	if !errors.As(err, &d) || d.Rule != rule {
		t.Fatalf("error %v, want a denial by rule %s", err, rule)
	}
	testutil.ErrorSays(t, err, want...)
}

// TestSharingTwiceRefused: two policy.sharing entries that match one GPU,
// by its index and by its UUID, are refused at start and at reload,
// naming both (the configuration in force stays); when the specs change
// so that two entries come to match one GPU, its pods are refused naming
// both and it is logged once, until the specs change back.
func TestSharingTwiceRefused(t *testing.T) {
	dir := t.TempDir()
	specDir := specDirWith(t, dir, "gpu.yaml", namedTwice(t, dir, true))
	const twice = `policy:
  sharing:
  - {devices: ["nvidia.com/gpu=GPU-*"], replicas: 2, strategy: mps, pinnedMemoryLimit: 1Gi}
  - {devices: ["nvidia.com/gpu=1"], replicas: 4, strategy: timeSlicing}
`
	const want = `two policy.sharing entries match one device: policy.sharing[0] matches "nvidia.com/gpu=GPU-1111" and policy.sharing[1] matches "nvidia.com/gpu=1"`
	cfg, err := config.Parse([]byte(twice))
	if err != nil {
		t.Fatal(err)
	}
	_, err = plugin.New(cfg, quiet(), plugin.WithSpecDirs([]string{specDir}))
	if !errors.Is(err, policy.ErrSharedTwice) {
		t.Fatalf("start: %v, want ErrSharedTwice", err)
	}
	testutil.ErrorSays(t, err, want)

	p, hook := logged(t, "policy: {sharing: [{devices: [\"nvidia.com/gpu=1\"], replicas: 4, strategy: timeSlicing}]}\n", plugin.WithSpecDirs([]string{specDir}))
	err = p.Reload(cfg)
	if !errors.Is(err, policy.ErrSharedTwice) {
		t.Fatalf("reload: %v, want ErrSharedTwice", err)
	}
	testutil.ErrorSays(t, err, want)
	ask := func(name, devices string) error {
		pod := gpuPod(name, map[string]string{"gpus.nri-gpu.io": devices})
		_, _, err := p.CreateContainer(context.Background(), pod, ctrOf(pod, nil))
		return err
	}
	for _, pod := range []string{"a", "b", "c", "d"} {
		if err := ask(pod, "GPU-1111"); err != nil { // the configuration in force: 4 replicas, by either name
			t.Fatalf("pod %s: %v", pod, err)
		}
	}

	// Entries that match apart; then a new spec names GPU 0 by a name
	// the second entry matches.
	apart, err := config.Parse([]byte(`policy:
  sharing:
  - {devices: ["nvidia.com/gpu=0", "nvidia.com/gpu=GPU-0000"], replicas: 2, strategy: timeSlicing}
  - {devices: ["nvidia.com/gpu=x*"], replicas: 3, strategy: timeSlicing}
`))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Reload(apart); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(specDir, "more.yaml"), []byte(fmt.Sprintf(`cdiVersion: "0.6.0"
kind: nvidia.com/gpu
devices:
  - name: x0
    containerEdits: {deviceNodes: [{path: /dev/nvidia0, hostPath: %s, type: c, major: 195, minor: 0}]}
`, filepath.Join(dir, "nvidia0"))))
	var denied error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if denied = ask("e", "0"); denied != nil {
			break
		}
		if err := p.RemovePodSandbox(context.Background(), gpuPod("e", nil)); err != nil {
			t.Fatal(err)
		}
	}
	wantRule(t, denied, policy.RuleSharing, `device "nvidia.com/gpu=0": two policy.sharing entries match one device: policy.sharing[0] matches "nvidia.com/gpu=0" and policy.sharing[1] matches "nvidia.com/gpu=x0"`)
	if err := ask("f", "1"); err != nil {
		t.Errorf("GPU 1, which one entry at most matches: %v", err)
	}
	// The warning comes from the specs' reload, told after the snapshot
	// that refuses is in use.
	warned := func() int {
		n := 0
		for _, e := range hook.AllEntries() {
			if strings.Contains(e.Message, `policy.sharing[1] matches "nvidia.com/gpu=x0"`) && strings.HasSuffix(e.Message, "until then the device is refused") {
				n++
			}
		}
		return n
	}
	testutil.Within(t, 10*time.Second, "the conflict warned of", func() bool { return warned() > 0 })
	if n := warned(); n != 1 {
		t.Errorf("the conflict warned of %d times, want once", n)
	}
	if err := os.Remove(filepath.Join(specDir, "more.yaml")); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if denied = ask("e", "0"); denied == nil {
			break
		}
	}
	if denied != nil {
		t.Errorf("GPU 0 once the spec that named it twice is gone: %v", denied)
	}
}
