package plugin_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/plugin"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// TestGenerateSpecs runs the plugin with generateSpecs on a mock DGX A100
// (while it has no runtime to connect to): it writes the spec into the
// last spec dir, and writes it again when a GPU appears.
func TestGenerateSpecs(t *testing.T) {
	root, err := filepath.Abs("../specs/nvidia/testdata/minimal-root")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse([]byte("generateSpecs: true\ngenerateInterval: 50ms\ndriverRoot: " + root + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	var gpus atomic.Int32
	gpus.Store(2)
	lib := testutil.NVML(8)
	lib.DeviceGetCountFunc = func() (int, nvml.Return) { return int(gpus.Load()), nvml.SUCCESS }

	low, high := t.TempDir(), filepath.Join(t.TempDir(), "run-cdi")
	log := logrus.New()
	log.SetOutput(io.Discard)
	p, err := plugin.New(cfg, log, plugin.WithSpecDirs([]string{low, high}), plugin.WithNVML(lib))
	if err != nil {
		t.Fatal(err)
	}
	synchronized(t, p)
	defer p.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() {
		done <- p.Serve(ctx, stub.WithSocketPath(filepath.Join(testutil.ShortDir(t), "none.sock")),
			stub.WithPluginName("nri-gpu"), stub.WithPluginIdx("10"))
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve after cancel: %v", err)
		}
	}()

	reg, err := specs.Open([]string{high})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	resolves := func(name string) func() bool {
		return func() bool {
			_, err := reg.Snapshot().Resolve([]string{name})
			return err == nil
		}
	}
	testutil.Within(t, 5*time.Second, "the generated spec of 2 GPUs", resolves("nvidia.com/gpu=1"))
	if resolves("nvidia.com/gpu=2")() {
		t.Fatal("GPU 2 before it appeared")
	}
	uuid, _ := lib.Devices[0].GetUUID()
	if !resolves("nvidia.com/gpu=" + uuid)() {
		t.Errorf("GPU 0 not named by its UUID %s", uuid)
	}
	if _, err := reg.Snapshot().Resolve([]string{"nvidia.com/gpu=all"}); err != nil {
		t.Error(err)
	}
	gpus.Store(3)
	testutil.Within(t, 5*time.Second, "the spec regenerated for a third GPU", resolves("nvidia.com/gpu=2"))
	// Its hooks run the plugin's own executable, which the policy allows
	// though policy.hookPaths does not list it: a container gets GPU 1.
	self, _ := os.Executable()
	pod := &api.PodSandbox{Id: "p", Name: "p", Namespace: "ns", Annotations: map[string]string{"gpus.nri-gpu.io": "1"}}
	ctr := &api.Container{Id: "c", PodSandboxId: "p", Name: "c", Linux: &api.LinuxContainer{}}
	testutil.Within(t, 5*time.Second, "the plugin's snapshot of the generated spec", func() bool {
		_, _, err := p.CreateContainer(context.Background(), pod, ctr)
		return err == nil
	})
	adj, _, err := p.CreateContainer(context.Background(), pod, ctr)
	if err != nil {
		t.Fatal(err)
	}
	if hooks := adj.GetHooks().GetCreateContainer(); len(hooks) == 0 || hooks[0].Path != self {
		t.Errorf("hooks %v, want the plugin's own executable %s", hooks, self)
	}

	// The spec came from the file generateSpecs writes, in the last dir.
	e, err := reg.Snapshot().Lookup("nvidia.com/gpu=2")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := e.Spec, filepath.Join(high, "nvidia.com-gpu.yaml"); got != want {
		t.Errorf("spec read from %s, want %s", got, want)
	}
	if entries, _ := os.ReadDir(low); len(entries) != 0 {
		t.Errorf("the first spec dir holds %v; the spec belongs in the last one", entries)
	}
	// The last dir, made for it, is readable by all (containerd's own
	// CDI, nri-gpu check) and writable by root alone.
	if fi, err := os.Stat(high); err != nil {
		t.Error(err)
	} else if fi.Mode().Perm() != 0o755 {
		t.Errorf("the spec dir made for it has mode %v, want 0755", fi.Mode().Perm())
	}
}

// TestGenerateOnlyOnChange: the spec is written when the GPUs or the
// driver's control nodes change, or the file is gone, not at every look;
// each write is logged with what the GPUs are.
func TestGenerateOnlyOnChange(t *testing.T) {
	root := t.TempDir()
	if err := os.CopyFS(root, os.DirFS("../specs/nvidia/testdata/minimal-root")); err != nil {
		t.Fatal(err)
	}
	specDir := filepath.Join(t.TempDir(), "cdi")
	lib := testutil.NVML(1)
	// looks counts the generator's looks: each asks the driver's version.
	var looks atomic.Int32
	version := lib.SystemGetDriverVersionFunc
	lib.SystemGetDriverVersionFunc = func() (string, nvml.Return) { looks.Add(1); return version() }
	p, hook := logged(t, "generateSpecs: true\ngenerateInterval: 20ms\ndriverRoot: "+root+"\n",
		plugin.WithSpecDirs([]string{specDir}), plugin.WithNVML(lib))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		_ = p.Serve(ctx, stub.WithSocketPath(filepath.Join(testutil.ShortDir(t), "none.sock")), stub.WithPluginName("nri-gpu"), stub.WithPluginIdx("10"))
	}()
	path := filepath.Join(specDir, plugin.GeneratedSpecName)
	// written says when the file was last written (its change time: a
	// rename of a new file changes it, while inode numbers are reused).
	written := func() int64 {
		fi, err := os.Stat(path)
		if err != nil {
			return 0
		}
		st := fi.Sys().(*syscall.Stat_t)
		return st.Ctim.Nano()
	}
	generated := func() []*logrus.Entry { return entries(hook, logrus.InfoLevel, "generated the CDI spec of the GPUs") }
	testutil.Within(t, 5*time.Second, "the spec written", func() bool { return written() != 0 && len(generated()) == 1 })
	first, from := written(), looks.Load()
	testutil.Within(t, 10*time.Second, "ten looks more", func() bool { return looks.Load() >= from+10 })
	if written() != first || len(generated()) != 1 {
		t.Errorf("the spec was written again though nothing changed (%d writes logged)", len(generated()))
	}
	if msg := generated()[0].Message; !strings.Contains(msg, "control nodes none") || !strings.Contains(msg, "GPUs GPU-") {
		t.Errorf("logged %q, want the GPUs' UUIDs and no control node", msg)
	}

	if err := os.MkdirAll(filepath.Join(root, "dev"), 0o755); err != nil {
		t.Fatal(err)
	}
	// A real char device node (/dev/null's numbers), as the driver makes.
	if err := syscall.Mknod(filepath.Join(root, "dev", "nvidia-uvm"), syscall.S_IFCHR|0o666, 1<<8|3); err != nil {
		t.Fatal(err)
	}
	testutil.Within(t, 5*time.Second, "the spec written again for nvidia-uvm", func() bool {
		g := generated()
		return len(g) == 2 && strings.Contains(g[1].Message, "control nodes nvidia-uvm")
	})
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	testutil.Within(t, 5*time.Second, "the spec written again once removed", func() bool { return written() != 0 })
}

// TestGenerateDriverChange: the driver changes under a running nri-gpu
// generating the spec (a fake driver root of real files, NVML mocked):
// the spec is written again and containers created afterwards are given
// the new driver's files, not the old ones, whether its version changed
// or only its files did.
func TestGenerateDriverChange(t *testing.T) {
	const old = "550.54.15"
	for _, tc := range []struct {
		name    string
		version string   // the driver's version after the change
		remove  []string // files of the driver removed
		add     []string // files of the driver added
		want    string   // the file containers get afterwards
		gone    string   // the file they no longer get ("" for none)
	}{
		{name: "upgraded", version: "560.35.03",
			remove: []string{"usr/lib64/libcuda.so." + old, "usr/lib64/libnvidia-ml.so." + old},
			add:    []string{"usr/lib64/libcuda.so.560.35.03", "usr/lib64/libnvidia-ml.so.560.35.03"},
			want:   "/usr/lib64/libcuda.so.560.35.03", gone: "/usr/lib64/libcuda.so." + old},
		{name: "a library installed", version: old,
			add:  []string{"usr/lib64/libnvidia-ptxjitcompiler.so." + old},
			want: "/usr/lib64/libnvidia-ptxjitcompiler.so." + old},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			if err := os.CopyFS(root, os.DirFS("../specs/nvidia/testdata/minimal-root")); err != nil {
				t.Fatal(err)
			}
			var version atomic.Value
			version.Store(old)
			lib := testutil.NVML(1)
			// told counts the times NVML told the version after the change.
			var told atomic.Int32
			lib.SystemGetDriverVersionFunc = func() (string, nvml.Return) {
				v := version.Load().(string)
				if v == tc.version {
					told.Add(1)
				}
				return v, nvml.SUCCESS
			}
			specDir := filepath.Join(t.TempDir(), "cdi")
			p, hook := logged(t, "generateSpecs: true\ngenerateInterval: 20ms\ndriverRoot: "+root+"\npolicy:\n  devices: [\"*/*\"]\n",
				plugin.WithSpecDirs([]string{specDir}), plugin.WithNVML(lib))
			ctx, cancel := context.WithCancel(context.Background())
			served := make(chan struct{})
			defer func() { cancel(); <-served }() // before the dirs go
			go func() {
				defer close(served)
				_ = p.Serve(ctx, stub.WithSocketPath(filepath.Join(testutil.ShortDir(t), "none.sock")), stub.WithPluginName("nri-gpu"), stub.WithPluginIdx("10"))
			}()
			n := 0
			mounts := func() []string {
				n++
				pod := gpuPod(fmt.Sprintf("p%d", n), map[string]string{"gpus.nri-gpu.io": "0"})
				ctr := &api.Container{Id: fmt.Sprintf("c%d", n), PodSandboxId: pod.Id, Name: "c", Linux: &api.LinuxContainer{}}
				adj, _, err := p.CreateContainer(context.Background(), pod, ctr)
				if err != nil {
					return nil
				}
				var hosts []string
				for _, m := range adj.GetMounts() {
					hosts = append(hosts, strings.TrimPrefix(m.Source, root))
				}
				return hosts
			}
			testutil.Within(t, 5*time.Second, "a container given the driver's files", func() bool { return slices.Contains(mounts(), "/usr/lib64/libcuda.so."+old) })

			// The old files go, the module changes, the new files come. The
			// spec holds files, not the version (the log line says it, read
			// before the files): the new files are added once the generator
			// has asked NVML the new version a few times, so that the spec
			// of the new files is written by a look that began after the
			// version changed.
			for _, f := range tc.remove {
				if err := os.Remove(filepath.Join(root, f)); err != nil {
					t.Fatal(err)
				}
			}
			told.Store(0)
			version.Store(tc.version)
			testutil.Within(t, 5*time.Second, "NVML asked the new version", func() bool { return told.Load() >= 5 })
			for _, f := range tc.add {
				if err := os.WriteFile(filepath.Join(root, f), []byte("\x7fELF"), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			var got []string
			testutil.Within(t, 5*time.Second, "a container given "+tc.want, func() bool {
				got = mounts()
				return slices.Contains(got, tc.want)
			})
			if tc.gone != "" && slices.Contains(got, tc.gone) {
				t.Errorf("a container created after the change is given %s, which is gone: %v", tc.gone, got)
			}
			// The change is not one step: a spec may be written in between
			// (without the old files, before the new ones); the last is of
			// the new driver (logged once written: the container may have
			// its files first).
			testutil.Within(t, 5*time.Second, "the last spec written of driver "+tc.version, func() bool {
				g := entries(hook, logrus.InfoLevel, "generated the CDI spec of the GPUs")
				return len(g) >= 2 && strings.Contains(g[len(g)-1].Message, "driver "+tc.version)
			})
		})
	}
}

// TestDriverReplacedUnderNVML: the driver's kernel module is replaced
// under the NVML the plugin has loaded, which then fails with
// NVML_ERROR_LIB_RM_VERSION_MISMATCH. Once it has answered before, Serve
// ends with ErrDriverChanged (nri-gpu then starts again with the new
// NVML); an NVML that never answered (a library newer than the loaded
// module) is an error logged, and the plugin serves on.
func TestDriverReplacedUnderNVML(t *testing.T) {
	for _, tc := range []struct {
		name     string
		answered bool // NVML answered before the mismatch
	}{
		{name: "replaced after it answered", answered: true},
		{name: "mismatched from the start", answered: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			if err := os.CopyFS(root, os.DirFS("../specs/nvidia/testdata/minimal-root")); err != nil {
				t.Fatal(err)
			}
			var replaced atomic.Bool
			replaced.Store(!tc.answered)
			lib := testutil.NVML(1)
			lib.InitFunc = func() nvml.Return {
				if replaced.Load() {
					return nvml.ERROR_LIB_RM_VERSION_MISMATCH
				}
				return nvml.SUCCESS
			}
			specDir := filepath.Join(t.TempDir(), "cdi")
			p, hook := logged(t, "generateSpecs: true\ngenerateInterval: 20ms\ndriverRoot: "+root+"\n",
				plugin.WithSpecDirs([]string{specDir}), plugin.WithNVML(lib))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			served := make(chan error, 1)
			go func() {
				served <- p.Serve(ctx, stub.WithSocketPath(filepath.Join(testutil.ShortDir(t), "none.sock")), stub.WithPluginName("nri-gpu"), stub.WithPluginIdx("10"))
			}()
			if tc.answered {
				testutil.Within(t, 5*time.Second, "the spec written", func() bool {
					return len(entries(hook, logrus.InfoLevel, "generated the CDI spec")) == 1
				})
				replaced.Store(true)
			}
			select {
			case err := <-served:
				if !tc.answered {
					t.Fatalf("Serve ended (%v), though this NVML never answered", err)
				}
				if !errors.Is(err, plugin.ErrDriverChanged) || !errors.Is(err, nvml.ERROR_LIB_RM_VERSION_MISMATCH) {
					t.Errorf("Serve ended with %v, want ErrDriverChanged and NVML's mismatch", err)
				}
			case <-time.After(2 * time.Second):
				if tc.answered {
					t.Fatal("Serve goes on with an NVML the driver no longer runs")
				}
				if len(entries(hook, logrus.ErrorLevel, "generating the CDI spec of the GPUs")) != 1 {
					t.Error("the mismatch of an NVML that never answered is not logged, once")
				}
			}
		})
	}
}

// TestHealthAfterDriverReload: without spec generation, the health
// monitor is what asks NVML after start. When the driver's kernel module
// is reloaded under it (NVML answers LIB_RM_VERSION_MISMATCH for the
// GPUs it had), it opens NVML again and says so; where this process
// still gets the old NVML (the mismatch again), Serve ends with
// ErrDriverChanged, so that nri-gpu starts again with the new driver's,
// as generation does.
func TestHealthAfterDriverReload(t *testing.T) {
	for _, tc := range []struct {
		name string
		// reloads says opening NVML again loads the new driver's.
		reloads bool
	}{
		{name: "NVML loaded anew", reloads: true},
		{name: "the old NVML stays loaded", reloads: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var replaced atomic.Bool
			lib := testutil.NVML(1)
			lib.InitFunc = func() nvml.Return {
				if replaced.Load() {
					if !tc.reloads {
						return nvml.ERROR_LIB_RM_VERSION_MISMATCH
					}
					replaced.Store(false)
				}
				return nvml.SUCCESS
			}
			lib.ShutdownFunc = func() nvml.Return { return nvml.SUCCESS }
			dev := lib.Devices[0].(*dgxa100.Device)
			uuid := dev.GetUUIDFunc
			dev.GetUUIDFunc = func() (string, nvml.Return) {
				if replaced.Load() {
					return "", nvml.ERROR_LIB_RM_VERSION_MISMATCH
				}
				return uuid()
			}
			p, hook := logged(t, "version: v1\nstart:\n  health: {interval: 20ms}\n",
				plugin.WithSpecDirs([]string{t.TempDir()}), plugin.WithNVML(lib))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			served := make(chan error, 1)
			go func() {
				served <- p.Serve(ctx, stub.WithSocketPath(filepath.Join(testutil.ShortDir(t), "none.sock")), stub.WithPluginName("nri-gpu"), stub.WithPluginIdx("10"))
			}()
			testutil.Within(t, 5*time.Second, "the GPUs' health watched", func() bool {
				return len(entries(hook, logrus.InfoLevel, "watching the health of NVIDIA GPUs")) == 1
			})
			replaced.Store(true)
			if tc.reloads {
				testutil.Within(t, 5*time.Second, "told NVML was opened again", func() bool {
					return len(entries(hook, logrus.InfoLevel, "opened it again, watching the GPUs' health again")) == 1
				})
				select {
				case err := <-served:
					t.Fatalf("Serve ended (%v), though NVML answers again", err)
				default:
				}
				return
			}
			select {
			case err := <-served:
				if !errors.Is(err, plugin.ErrDriverChanged) || !errors.Is(err, nvml.ERROR_LIB_RM_VERSION_MISMATCH) {
					t.Errorf("Serve ended with %v, want ErrDriverChanged and NVML's mismatch", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("Serve goes on with a health monitor that watches nothing")
			}
		})
	}
}

// TestGenerateFlagOverEveryConfiguration: --generate-specs (WithGenerate)
// turns generation on whatever the configuration in force says, the
// one the runtime hands over at Configure included, as --cdi-spec-dirs
// does.
func TestGenerateFlagOverEveryConfiguration(t *testing.T) {
	root, err := filepath.Abs("../specs/nvidia/testdata/minimal-root")
	if err != nil {
		t.Fatal(err)
	}
	specDir := t.TempDir()
	yaml := "version: v1\nstart:\n  driverRoot: " + root + "\ngenerate: {interval: 20ms}\n"
	p, _ := logged(t, yaml, plugin.WithSpecDirs([]string{specDir}), plugin.WithNVML(testutil.NVML(1)), plugin.WithGenerate())
	if _, err := p.Configure(context.Background(), yaml, "containerd", "v1.7.35"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		_ = p.Serve(ctx, stub.WithSocketPath(filepath.Join(testutil.ShortDir(t), "none.sock")), stub.WithPluginName("nri-gpu"), stub.WithPluginIdx("10"))
	}()
	testutil.Within(t, 5*time.Second, "the spec generated under the runtime's configuration", func() bool {
		_, err := os.Stat(filepath.Join(specDir, plugin.GeneratedSpecName))
		return err == nil
	})
}
