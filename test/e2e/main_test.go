// Package e2e tests nri-gpu against a real containerd 1.7 (built from its
// Go module), runc, crictl and a fake GPU host. It needs root; without root
// every test is skipped and says why.
package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/nri-gpu/nri-gpu/test/harness"
)

// RequiredEnv, when set to 1 (as `make test` sets it), turns missing root
// or tools into a failure instead of a skip.
const RequiredEnv = "NRI_GPU_E2E_REQUIRED"

// env is the shared setup: one containerd with CDI off and nri-gpu
// connected, and the fake GPU host its specs describe.
var env struct {
	skip   string
	dir    string
	tools  harness.Tools
	image  string
	host   *harness.GPUHost
	config string
	// churnDir is a second spec dir, the tests' to change.
	churnDir string
	ctd      *harness.Containerd
	nri      *harness.Plugin
}

// suitePolicy is the policy of the suite's nri-gpu: a multi-tenant one.
var suitePolicy = []string{
	"namespaces: [e2e, tenant-*]",
	"devices: [nvidia.com/gpu=*, " + harness.BadHookKind + "=*, " + harness.UntrustedKind + "=*, " + churnKind + "=*]",
	"maxDevicesPerPod: 3",
	"exclusive: true",
}

// suiteArgs are the arguments of the suite's nri-gpu: its config, and
// metrics on a free port of the loopback.
func suiteArgs() []string {
	return []string{"--config", env.config, "--metrics-address", "127.0.0.1:0"}
}

func TestMain(m *testing.M) {
	code, err := setup()
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e setup: %v\n", err)
		code = 1
	}
	if code == 0 {
		code = m.Run()
	}
	if err := teardown(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e teardown: %v\n", err)
		code = 1
	}
	os.Exit(code)
}

func setup() (int, error) {
	required := os.Getenv(RequiredEnv) == "1"
	if os.Geteuid() != 0 {
		env.skip = "the end-to-end tests need root (device nodes, mounts, runc)"
	} else if tools, err := harness.FindTools(""); err != nil {
		env.skip = fmt.Sprintf("end-to-end tools missing (run make test): %v", err)
	} else {
		env.tools = tools
	}
	if env.skip != "" {
		if required {
			return 1, fmt.Errorf("%s, and %s=1", env.skip, RequiredEnv)
		}
		fmt.Fprintf(os.Stderr, "SKIP e2e: %s\n", env.skip)
		return 0, nil
	}

	var err error
	// Under /tmp, short: it holds unix sockets, whatever TMPDIR is.
	if env.dir, err = os.MkdirTemp("/tmp", "nri-gpu-e2e-"); err != nil {
		return 1, err
	}
	// A user-namespaced container's root (a host uid of its range)
	// reaches its bundle under it.
	if err := os.Chmod(env.dir, 0o711); err != nil {
		return 1, err
	}
	env.image = filepath.Join(env.dir, "busybox.tar")
	if err := harness.BuildImage(env.tools.Busybox, env.image); err != nil {
		return 1, err
	}
	if env.host, err = harness.NewGPUHost(env.dir, 4); err != nil {
		return 1, err
	}
	env.churnDir = filepath.Join(env.dir, "cdi-churn")
	env.config = filepath.Join(env.dir, "nri-gpu.yaml")
	if err := os.WriteFile(env.config, []byte(env.host.PluginConfig([]string{env.churnDir}, suitePolicy...)), 0o644); err != nil {
		return 1, err
	}
	if env.ctd, err = harness.StartContainerd(filepath.Join(env.dir, "ctd"), env.tools, harness.Options{Image: env.image}); err != nil {
		return 1, err
	}
	if env.nri, err = env.ctd.StartPlugin(suiteArgs()...); err != nil {
		return 1, err
	}
	return 0, nil
}

func teardown() error {
	if env.dir == "" {
		return nil
	}
	if env.ctd != nil {
		if err := env.ctd.Stop(); err != nil {
			return err
		}
	}
	if os.Getenv("NRI_GPU_E2E_KEEP") == "" {
		return os.RemoveAll(env.dir)
	}
	return nil
}

// needEnv skips a test when the suite could not be set up.
func needEnv(t *testing.T) {
	t.Helper()
	if env.skip != "" {
		t.Skip(env.skip)
	}
}

// extraContainerd starts another containerd for one test (the image
// imported), stopped when the test ends. name names its directory.
func extraContainerd(t *testing.T, name string, opts harness.Options) *harness.Containerd {
	t.Helper()
	return extraContainerdWith(t, env.tools, name, opts)
}

// extraContainerdWith is extraContainerd with other tools (another
// containerd version).
func extraContainerdWith(t *testing.T, tools harness.Tools, name string, opts harness.Options) *harness.Containerd {
	t.Helper()
	if opts.Image == "" {
		opts.Image = env.image
	}
	ctd, err := harness.StartContainerd(filepath.Join(env.dir, name), tools, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ctd.Stop(); err != nil {
			t.Error(err)
		}
	})
	return ctd
}

// startPlugin starts nri-gpu on ctd with the fake host's specs and the
// given policy keys.
func startPlugin(t *testing.T, ctd *harness.Containerd, policy ...string) *harness.Plugin {
	t.Helper()
	config := filepath.Join(ctd.Dir, "nri-gpu.yaml")
	if err := os.WriteFile(config, []byte(env.host.PluginConfig(nil, policy...)), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := ctd.StartPlugin("--config", config)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
