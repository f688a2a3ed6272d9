package plugin_test

import (
	"context"
	"fmt"
	"io"
	"testing"

	"github.com/containerd/nri/pkg/api"
	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/plugin"
	"github.com/nri-gpu/nri-gpu/test/harness"
)

// BenchmarkCreateContainer measures the request path: annotation parsing,
// policy, resolution in the snapshot and the adjustment, for 1, 8 and 64
// devices with 10, 100 and 1000 spec files loaded.
func BenchmarkCreateContainer(b *testing.B) {
	for _, specs := range []int{10, 100, 1000} {
		dir := b.TempDir()
		if err := harness.WriteBenchSpecs(dir, specs); err != nil {
			b.Fatal(err)
		}
		p, err := plugin.New(config.Default(), quiet(), plugin.WithSpecDirs([]string{dir}))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := p.Synchronize(context.Background(), nil, nil); err != nil {
			b.Fatal(err)
		}
		for _, n := range []int{1, 8, 64} {
			pod := &api.PodSandbox{Id: "p", Name: "p", Namespace: "ns", Annotations: map[string]string{"gpus.nri-gpu.io": harness.BenchRequest(n)}}
			ctr := &api.Container{Id: "c", PodSandboxId: "p", Name: "c", Linux: &api.LinuxContainer{}}
			b.Run(fmt.Sprintf("specs=%d/devices=%d", specs, n), func(b *testing.B) {
				b.ReportAllocs()
				for i := 0; i < b.N; i++ {
					adj, _, err := p.CreateContainer(context.Background(), pod, ctr)
					if err != nil || len(adj.GetLinux().GetDevices()) != n {
						b.Fatalf("%v, %d devices", err, len(adj.GetLinux().GetDevices()))
					}
				}
			})
		}
		p.Close()
	}
}

func quiet() *logrus.Logger {
	log := logrus.New()
	log.SetOutput(io.Discard)
	return log
}
