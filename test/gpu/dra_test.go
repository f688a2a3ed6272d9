package gpu

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/sirupsen/logrus"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/dra"
	"github.com/nri-gpu/nri-gpu/pkg/plugin"
	"github.com/nri-gpu/nri-gpu/test/harness"
)

// TestRealGPUAttributes: on a real GPU the DRA driver's devices carry
// what the driver's NVML says (product, architecture, versions, memory)
// and the PCIe root sysfs gives, with nothing made up: it prints each
// device as a ResourceSlice would have it.
func TestRealGPUAttributes(t *testing.T) {
	if os.Getenv(RealEnv) != "1" {
		t.Skipf("needs an NVIDIA GPU and root: run test/gpu/run.sh on a GPU node (it sets %s=1)", RealEnv)
	}
	tools, err := harness.FindTools("")
	if err != nil {
		t.Fatal(err)
	}
	specDir := t.TempDir()
	if out, err := exec.Command(tools.Path("nri-gpu"), "generate", "--output", filepath.Join(specDir, "nvidia.yaml")).CombinedOutput(); err != nil {
		t.Fatalf("nri-gpu generate: %v\n%s", err, out)
	}
	log := logrus.New()
	log.SetOutput(io.Discard)
	p, err := plugin.New(config.Default(), log, plugin.WithSpecDirs([]string{specDir}))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	// As a runtime running no pod synchronizes it: its doors open.
	if _, err := p.Synchronize(context.Background(), nil, nil); err != nil {
		t.Fatal(err)
	}
	offered, err := p.DRAView(config.Default().Start.DRA).Devices(context.Background())
	if err != nil || len(offered) == 0 {
		t.Fatalf("no device offered (%v)", err)
	}
	for _, o := range offered {
		// As the DRA driver publishes it, PCIe root from the host's /sys.
		d := struct {
			CDI    string
			Device resourceapi.Device
		}{o.CDI, dra.DeviceOf(o.Info, nil)}
		t.Logf("%s (%s): attributes %v, capacity %v", d.Device.Name, d.CDI, d.Device.Attributes, d.Device.Capacity)
		if d.Device.Attributes["type"].StringValue == nil || *d.Device.Attributes["type"].StringValue != "gpu" {
			continue
		}
		for _, a := range []string{"uuid", "productName", "brand", "architecture", "pcieBusID", "resource.kubernetes.io/pcieRoot"} {
			if v := d.Device.Attributes[resourceapi.QualifiedName(a)].StringValue; v == nil || *v == "" {
				t.Errorf("%s: no %s", d.Device.Name, a)
			}
		}
		for _, a := range []string{"driverVersion", "cudaComputeCapability"} {
			if v := d.Device.Attributes[resourceapi.QualifiedName(a)].VersionValue; v == nil {
				t.Errorf("%s: no %s", d.Device.Name, a)
			}
		}
		if m, ok := d.Device.Capacity["memory"]; !ok || m.Value.IsZero() {
			t.Errorf("%s: no memory capacity", d.Device.Name)
		}
	}
}
