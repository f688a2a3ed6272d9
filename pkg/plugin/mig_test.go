package plugin_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
	"github.com/nri-gpu/nri-gpu/pkg/plugin"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
)

// TestAllBesideMIGInstance: a hand-written "all" that names only GPUs'
// nodes (no capability node) and a MIG device of one of those GPUs, as
// nvidia-ctk writes it (its GPU's node and two capability nodes, real
// char devices), are one piece of hardware for the pool whichever is held
// first, and through whichever door the MIG device is held (by name, for
// a count, by a DRA claim): the second is refused, with policy.exclusive
// on and off, the MIG device shared by policy.sharing or not, "all"
// covering one GPU or two. The one pair given is the one policy.exclusive:
// false allows (docs/policy.md): both named, neither shared.
func TestAllBesideMIGInstance(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("making device nodes needs root")
	}
	nodes := t.TempDir()
	// The capability nodes are known by their major, wherever they are.
	if err := os.Mkdir(filepath.Join(nodes, "caps"), 0o755); err != nil {
		t.Fatal(err)
	}
	capsMajor := plugin.WithPartMajors(func() []int64 { return []int64{511} })
	for path, dev := range map[string][2]uint32{"nvidia0": {195, 0}, "nvidia1": {195, 1}, "caps/nvidia-cap12": {511, 12}, "caps/nvidia-cap13": {511, 13}} {
		if err := unix.Mknod(filepath.Join(nodes, path), unix.S_IFCHR|0o666, int(unix.Mkdev(dev[0], dev[1]))); err != nil {
			t.Fatal(err)
		}
	}
	const (
		shareMIG = `, sharing: [{devices: ["nvidia.com/gpu=0:0"], replicas: 2}]`
		shareGPU = `, sharing: [{devices: ["nvidia.com/gpu=0"], replicas: 2}]`
	)
	for _, allGPUs := range []int{1, 2} {
		second := ""
		if allGPUs == 2 {
			second = ", {path: /dev/nvidia1, hostPath: " + nodes + "/nvidia1}"
		}
		specDir := specDirWith(t, t.TempDir(), "gpu.yaml", fmt.Sprintf(`cdiVersion: "0.6.0"
kind: nvidia.com/gpu
devices:
  - name: "0"
    containerEdits:
      deviceNodes: [{path: /dev/nvidia0, hostPath: %[1]s/nvidia0}]
  - name: "0:0"
    containerEdits:
      deviceNodes: [{path: /dev/nvidia0, hostPath: %[1]s/nvidia0}, {path: /dev/nvidia-caps/nvidia-cap12, hostPath: %[1]s/caps/nvidia-cap12}, {path: /dev/nvidia-caps/nvidia-cap13, hostPath: %[1]s/caps/nvidia-cap13}]
  - name: all
    containerEdits:
      deviceNodes: [{path: /dev/nvidia0, hostPath: %[1]s/nvidia0}%[2]s]
`, nodes, second))
		for _, exclusive := range []bool{true, false} {
			for _, sharing := range []string{"", shareMIG, shareGPU} {
				for _, door := range []string{"named", "counted", "claim"} {
					for _, migFirst := range []bool{true, false} {
						name := fmt.Sprintf("all of %d GPUs, exclusive %v, sharing %q, MIG device %s, MIG first %v", allGPUs, exclusive, sharing, door, migFirst)
						// all is GPU 0 itself when it covers GPU 0 alone:
						// its sharing then applies to it.
						given := !exclusive && door == "named" && (sharing == "" || sharing == shareGPU && allGPUs == 2)
						p := inProcess(t, fmt.Sprintf(`policy: {allowAll: true, devices: ["nvidia.com/gpu=0:0", "nvidia.com/gpu=all"], exclusive: %v%s}`, exclusive, sharing), specDir, capsMajor)
						holdMIG := func() error {
							switch door {
							case "named", "counted":
								ann := map[string]string{"gpus.nri-gpu.io": "0:0"}
								if door == "counted" {
									ann = map[string]string{"gpu-count.nri-gpu.io": "1"}
								}
								_, _, err := p.CreateContainer(context.Background(), gpuPod("mig", ann), ctrOf(gpuPod("mig", nil), nil))
								return err
							}
							return p.DRAView(config.Default().Start.DRA).Prepare(context.Background(), policy.Claim{UID: "u", Namespace: "tenant", Name: "mig"},
								[]link.Allocated{{CDI: "nvidia.com/gpu=0:0", Requests: []string{"gpu"}}})
						}
						holdAll := func() error {
							_, _, err := p.CreateContainer(context.Background(), gpuPod("all", map[string]string{"gpus.nri-gpu.io": "all"}), ctrOf(gpuPod("all", nil), nil))
							return err
						}
						first, then := holdMIG, holdAll
						if !migFirst {
							first, then = holdAll, holdMIG
						}
						if err := first(); err != nil {
							t.Fatalf("%s: the first: %v", name, err)
						}
						switch err := then(); {
						case given && err != nil:
							t.Errorf("%s: the second refused: %v", name, err)
						case !given && err == nil:
							t.Errorf("%s: the second given beside the first", name)
						}
					}
				}
			}
		}
	}
}
