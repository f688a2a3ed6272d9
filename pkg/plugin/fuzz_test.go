package plugin_test

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/plugin"
)

// FuzzRestoreAndErrors has a restarted plugin meet containers carrying
// any value in nri-gpu's own annotations, and then requests with any
// annotation values: Synchronize is quick and trusts none of them (GPU 0
// stays free), and every error returned to the runtime is short.
func FuzzRestoreAndErrors(f *testing.F) {
	for _, seed := range [][4]string{
		{"nvidia.com/gpu=0", "nvidia.com/gpu=0", "0", "nvidia.com/gpu=1"},
		{"", "", "all", "nvidia.com/gpu=all"},
		{"nvidia.com/gpu=0,0,0,0,0,0", ",,,", "0,1,2,3,4,5,6,7,8,9", "x/y=z,a/b=c"},
		{"\xff", "nvidia.com/gpu=../../etc", "GPU-\x00", "nvidia.com/gpu="},
	} {
		f.Add(seed[0], seed[1], seed[2], seed[3])
	}
	cfg, err := config.Parse([]byte("policy: {exclusive: true}"))
	if err != nil {
		f.Fatal(err)
	}
	log := logrus.New()
	log.SetOutput(io.Discard)
	f.Fuzz(func(t *testing.T, devices, counted, podValue, cdiValue string) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "gpu.yaml"), []byte(spec), 0o644); err != nil {
			t.Fatal(err)
		}
		p, err := plugin.New(cfg, log, plugin.WithSpecDirs([]string{dir}), plugin.WithStateFile(filepath.Join(dir, "state", "s.json")))
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		ctx := context.Background()

		forger := &api.PodSandbox{Id: "id-f", Name: "f", Namespace: "tenant"}
		start := time.Now()
		if _, err := p.Synchronize(ctx, []*api.PodSandbox{forger}, []*api.Container{{
			Id: "f", PodSandboxId: forger.Id, Name: "f", Linux: &api.LinuxContainer{},
			State:       api.ContainerState_CONTAINER_RUNNING,
			Annotations: map[string]string{plugin.DevicesAnnotation: devices, plugin.CountedAnnotation: counted},
		}}); err != nil {
			t.Fatalf("Synchronize: %v", err)
		}
		if d := time.Since(start); d > time.Second {
			t.Fatalf("Synchronize took %s", d)
		}
		c := &api.PodSandbox{Id: "id-c", Name: "c", Namespace: "tenant", Annotations: map[string]string{"gpus.nri-gpu.io": "0"}}
		if _, _, err := p.CreateContainer(ctx, c, &api.Container{Id: "c", PodSandboxId: c.Id, Name: "c", Linux: &api.LinuxContainer{}}); err != nil {
			t.Fatalf("forged annotations %q / %q decided state: GPU 0 was not free: %v", devices, counted, err)
		}

		h := &api.PodSandbox{Id: "id-h", Name: "h", Namespace: "tenant", Annotations: map[string]string{"gpus.nri-gpu.io": podValue}}
		_, _, err = p.CreateContainer(ctx, h, &api.Container{Id: "h", PodSandboxId: h.Id, Name: "h", Linux: &api.LinuxContainer{},
			Annotations: map[string]string{"cdi.k8s.io/x": cdiValue}})
		if err != nil && len(err.Error()) > 4096 {
			t.Fatalf("an error of %d bytes", len(err.Error()))
		}
	})
}
