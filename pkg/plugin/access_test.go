package plugin_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/access"
)

// accessMount returns the mount of the access file in adj, or nil.
func accessMount(adj *api.ContainerAdjustment) *api.Mount {
	i := slices.IndexFunc(adj.GetMounts(), func(m *api.Mount) bool { return m.Destination == access.Path })
	if i < 0 {
		return nil
	}
	return adj.GetMounts()[i]
}

// TestAccessFile, over NRI's runtime side: a container given GPU 0 gets
// the access file of what it was given, read-only at access.Path and named by
// NRI_GPU_ACCESS: a CDI spec naming nvidia.com/gpu=0 with its node and
// the spec's environment, nothing of GPU 1. A container given nothing
// gets none. The access file goes with its container, with its pod, and, at a
// restart, with the pods the runtime no longer has.
func TestAccessFile(t *testing.T) {
	cfg := "policy: {exclusive: true}\n"
	dir := filepath.Join(testutil.ShortDir(t), "access")
	r := runtimeWith(t, "v2.3.7", cfg, func(r *testRuntime) { r.accessDir = dir })

	pod := gpuPod("a", map[string]string{"gpus.nri-gpu.io": "0"})
	ctr := ctrOf(pod, nil)
	adj, err := r.create(pod, ctr)
	if err != nil {
		t.Fatal(err)
	}
	m := accessMount(adj)
	if m == nil {
		t.Fatalf("no mount at %s in %v", access.Path, adj.GetMounts())
	}
	for _, o := range []string{"ro", "nosuid", "nodev", "noexec"} {
		if !slices.Contains(m.Options, o) {
			t.Errorf("the access file is mounted with %v, want %q among them", m.Options, o)
		}
	}
	if v := adj.GetEnv(); !slices.ContainsFunc(v, func(kv *api.KeyValue) bool { return kv.Key == access.EnvVar && kv.Value == access.Path }) {
		t.Errorf("environment %v, want %s=%s", v, access.EnvVar, access.Path)
	}
	rec, err := access.Read(m.Source)
	if err != nil {
		t.Fatal(err)
	}
	if got := rec.Annotations[access.DevicesAnnotation]; got != "nvidia.com/gpu=0" {
		t.Errorf("access file names devices %q, want nvidia.com/gpu=0", got)
	}
	if got := rec.Annotations[access.PodAnnotation]; got != "tenant/a" {
		t.Errorf("access file names pod %q, want tenant/a", got)
	}
	edits := rec.Devices[0].ContainerEdits
	if len(edits.DeviceNodes) != 1 || edits.DeviceNodes[0].Path != "/dev/nvidia0" || edits.DeviceNodes[0].Type != "c" || edits.DeviceNodes[0].Major != 1 || edits.DeviceNodes[0].Minor != 3 {
		t.Errorf("access file's device nodes %+v, want /dev/nvidia0 alone, c 1:3 (the host's /dev/null)", edits.DeviceNodes)
	}
	if !slices.Contains(edits.Env, "NVIDIA_VISIBLE_DEVICES=void") {
		t.Errorf("access file's environment %v, want the spec's NVIDIA_VISIBLE_DEVICES=void", edits.Env)
	}
	if info, err := os.Stat(m.Source); err != nil || info.Mode().Perm() != 0o444 {
		t.Errorf("access file file: %v, %v; want mode 0444", info, err)
	}

	plain := gpuPod("plain", nil)
	adj, err = r.create(plain, ctrOf(plain, nil))
	if err != nil || accessMount(adj) != nil {
		t.Errorf("a container given nothing: mount %v, %v; want no access file", accessMount(adj), err)
	}

	// A restart: the access file of a pod the runtime no longer has goes.
	gone := filepath.Join(r.accessDir, "id-gone", "gone-c.json")
	if err := os.MkdirAll(filepath.Dir(gone), 0o711); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(gone, []byte("{}"), 0o444); err != nil {
		t.Fatal(err)
	}
	r.restart(t, cfg)
	if _, err := os.Stat(gone); !os.IsNotExist(err) {
		t.Errorf("access file of a pod gone while nri-gpu was away: %v, want it removed", err)
	}
	if _, err := os.Stat(m.Source); err != nil {
		t.Errorf("access file of a running container after a restart: %v", err)
	}

	if err := r.RemoveContainer(context.Background(), &adaptation.RemoveContainerRequest{Pod: pod, Container: ctr}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(m.Source); !os.IsNotExist(err) {
		t.Errorf("access file after its container's removal: %v, want it removed", err)
	}
	if _, err := r.create(pod, ctrOf(pod, nil)); err != nil {
		t.Fatal(err)
	}
	if err := r.RemovePodSandbox(context.Background(), &adaptation.RemovePodSandboxRequest{Pod: pod}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Dir(m.Source)); !os.IsNotExist(err) {
		t.Errorf("access files after the pod's removal: %v, want them removed", err)
	}
}

// TestAccessFileUnwritable: where the access file cannot be kept, the
// container is refused saying so, and holds nothing: another pod gets
// its GPU.
func TestAccessFileUnwritable(t *testing.T) {
	cfg := "policy: {exclusive: true}\n"
	dir := filepath.Join(testutil.ShortDir(t), "access")
	if err := os.WriteFile(dir, nil, 0o644); err != nil { // not a directory
		t.Fatal(err)
	}
	r := runtimeWith(t, "v2.3.7", cfg, func(r *testRuntime) { r.accessDir = dir })
	pod := gpuPod("a", map[string]string{"gpus.nri-gpu.io": "0"})
	_, err := r.create(pod, ctrOf(pod, nil))
	testutil.ErrorSays(t, err, "writing the container's access file ("+access.Path+")")
	if err := os.Remove(r.accessDir); err != nil {
		t.Fatal(err)
	}
	other := gpuPod("b", map[string]string{"gpus.nri-gpu.io": "0"})
	if _, err := r.create(other, ctrOf(other, nil)); err != nil {
		t.Errorf("GPU 0 after a refused container: %v, want it free", err)
	}
}
