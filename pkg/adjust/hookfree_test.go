package adjust_test

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"
	"sigs.k8s.io/yaml"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/adjust"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
	"github.com/nri-gpu/nri-gpu/test/corpus"
)

// sharedObject returns a real shared library of the machine and its
// soname: the dynamic loader this test binary names as its interpreter.
func sharedObject(t *testing.T) (path, soname string) {
	t.Helper()
	f, err := elf.Open("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type != elf.PT_INTERP {
			continue
		}
		data := make([]byte, p.Filesz)
		if _, err := p.ReadAt(data, 0); err != nil {
			t.Fatal(err)
		}
		path, err = filepath.EvalSymlinks(strings.TrimRight(string(data), "\x00"))
		if err != nil {
			t.Fatal(err)
		}
		lib, err := elf.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer lib.Close()
		names, err := lib.DynString(elf.DT_SONAME)
		if err != nil || len(names) != 1 {
			t.Skipf("the loader %s has no soname (%v)", path, err)
		}
		return path, names[0]
	}
	t.Skip("the test binary is static: no shared object to read")
	return "", ""
}

// hookFreeSpec is shaped like nvidia-ctk's: a library mount, a node, and
// NVIDIA's hooks (%s is the library's host path, %s a hook more).
const hookFreeSpec = `
cdiVersion: "0.6.0"
kind: example.com/gpu
containerEdits:
  deviceNodes:
    - {path: /dev/examplectl, hostPath: /dev/zero}
  mounts:
    - {hostPath: %s, containerPath: /usr/lib/x86_64-linux-gnu/libexample.so.570.1, options: [ro, nosuid, nodev, bind]}
  hooks:
    - {hookName: createContainer, path: /usr/bin/nvidia-cdi-hook, args: [nvidia-cdi-hook, update-ldcache, --folder, /usr/lib/x86_64-linux-gnu]}
    - {hookName: createContainer, path: /usr/bin/nvidia-cdi-hook, args: [nvidia-cdi-hook, create-symlinks, --link, %s::/usr/lib/x86_64-linux-gnu/libexample.so]}
    - {hookName: createContainer, path: /usr/bin/nvidia-cdi-hook, args: [nvidia-cdi-hook, enable-cuda-compat, --host-driver-version=570.1]}
    - {hookName: createContainer, path: /usr/bin/nvidia-ctk, args: [nvidia-ctk, hook, disable-device-node-modification]}
%s
devices:
  - name: "0"
    containerEdits:
      deviceNodes:
        - {path: /dev/dri/card0, hostPath: /dev/null}
      hooks:
        - {hookName: createContainer, path: /usr/bin/nvidia-cdi-hook, args: [nvidia-cdi-hook, create-symlinks, --link, ../card0::/dev/dri/by-path/pci-0000:01:00.0-card]}
        - {hookName: createContainer, path: /usr/bin/nvidia-cdi-hook, args: [nvidia-cdi-hook, chmod, --mode, "755", --path, /dev/dri]}
        - {hookName: createContainer, path: /usr/bin/nvidia-cdi-hook, args: [nvidia-cdi-hook, create-symlinks, --link, /gone/libx.so::/usr/lib/libx.so]}
`

// TestHookFree: with HookFree, no hook reaches the container; each of
// NVIDIA's is replaced by what the runtime applies (the soname link
// ldconfig would make and a link to it as mounts of the library, a link
// to a device node as that node, chmod 755 of a directory of nodes left
// to runc), or left out saying what the container lacks; any other hook
// refuses the device, naming it. Without HookFree the hooks stay.
func TestHookFree(t *testing.T) {
	lib, soname := sharedObject(t)
	for _, tc := range []struct {
		name, link, more string
		hookFree         bool
		injected         bool
		wantErr          []string
	}{
		{name: "soname link", link: soname, hookFree: true},
		{name: "relative to a link of a link", link: "./" + soname, hookFree: true},
		{name: "another hook", link: soname, hookFree: true, more: "    - {hookName: createContainer, path: /usr/bin/nvidia-cdi-hook, args: [nvidia-cdi-hook, something-new]}",
			wantErr: []string{"/usr/bin/nvidia-cdi-hook nvidia-cdi-hook something-new", "hookFree refuses every other hook"}},
		{name: "chmod of another path", link: soname, hookFree: true, more: "    - {hookName: createContainer, path: /usr/bin/nvidia-cdi-hook, args: [nvidia-cdi-hook, chmod, --mode, \"700\", --path, /etc]}",
			wantErr: []string{"chmod", `path "/etc" (mode 700)`}},
		{name: "chmod beyond a permission", link: soname, hookFree: true, more: "    - {hookName: createContainer, path: /usr/bin/nvidia-cdi-hook, args: [nvidia-cdi-hook, chmod, --mode, \"1755\", --path, /dev/examplectl]}",
			wantErr: []string{"chmod", `mode "1755" is not an octal permission`}},
		{name: "a link not absolute", link: soname, hookFree: true, more: "    - {hookName: createContainer, path: /usr/bin/nvidia-cdi-hook, args: [nvidia-cdi-hook, create-symlinks, --link, libexample.so.570.1::lib/libexample.so]}",
			wantErr: []string{`create-symlinks link "libexample.so.570.1::lib/libexample.so" is not target::/absolute/link`}},
		{name: "a link of no target", link: soname, hookFree: true, more: "    - {hookName: createContainer, path: /usr/bin/nvidia-ctk, args: [nvidia-ctk, hook, create-symlinks, --link, \"::/usr/lib/libexample.so\"]}",
			wantErr: []string{`create-symlinks link "::/usr/lib/libexample.so" is not target::/absolute/link`}},
		{name: "hooks kept", link: soname},
		{name: "injected by the runtime", link: soname, hookFree: true, injected: true,
			wantErr: []string{"the runtime's own CDI injected it, with its 4 hooks", "cdiDevices: nri-gpu"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := fmt.Sprintf(hookFreeSpec, lib, tc.link, tc.more)
			devs, snap := load(t, map[string]string{"gpu.yaml": spec}, "example.com/gpu=0")
			opts := adjust.Options{HookFree: tc.hookFree, SpecPath: snap.SpecPath, Sonames: snap.Sonames}
			if tc.injected {
				opts.Injected = devs
			}
			res, err := adjust.Build(devs, snap.HostNodes, opts)
			if len(tc.wantErr) > 0 {
				testutil.ErrorSays(t, err, tc.wantErr...)
				if !errors.Is(err, adjust.ErrHook) {
					t.Errorf("error %v does not wrap ErrHook", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			adj := res.Adjustment
			if !tc.hookFree {
				if hooks := adj.GetHooks().GetCreateContainer(); len(hooks) != 7 {
					t.Errorf("without hookFree, %d createContainer hooks, want the spec's 7", len(hooks))
				}
				return
			}
			if h := adj.GetHooks(); h != nil && len(h.GetCreateContainer())+len(h.GetCreateRuntime())+len(h.GetPrestart())+len(h.GetStartContainer()) > 0 {
				t.Errorf("hookFree gave hooks: %v", h)
			}
			mounted := map[string]string{}
			for _, m := range adj.GetMounts() {
				mounted[m.Destination] = m.Source
			}
			// The library at its soname where every family's loader looks
			// (the test's spec is of an x86_64 host).
			wantAt := []string{"/usr/lib/x86_64-linux-gnu/libexample.so.570.1", "/usr/lib/x86_64-linux-gnu/" + soname, "/usr/lib/x86_64-linux-gnu/libexample.so"}
			if runtime.GOARCH == "amd64" {
				wantAt = append(wantAt, "/usr/lib64/"+soname, "/usr/lib/"+soname)
			}
			for _, at := range wantAt {
				if mounted[at] != lib {
					t.Errorf("%s mounts %q, want the library %s (mounts %v)", at, mounted[at], lib, mounted)
				}
			}
			if !slices.ContainsFunc(adj.GetLinux().GetDevices(), func(d *api.LinuxDevice) bool {
				return d.Path == "/dev/dri/by-path/pci-0000:01:00.0-card" && d.Major == 1 && d.Minor == 3
			}) {
				t.Errorf("the by-path link is not the card's node (1:3): %v", adj.GetLinux().GetDevices())
			}
			var left []string
			for _, l := range res.LeftOut {
				left = append(left, l.Hook+": "+l.Lacks)
			}
			for _, want := range []string{"enable-cuda-compat: CUDA forward compatibility", "disable-device-node-modification: the driver's ModifyDeviceFiles", "create-symlinks: the link /usr/lib/libx.so to /gone/libx.so"} {
				if !slices.ContainsFunc(left, func(l string) bool { return strings.HasPrefix(l, want) }) {
					t.Errorf("left out %q, want %q", left, want)
				}
			}
		})
	}
}

// TestHookFreeCorpus: every device of every published spec of the corpus
// is given with no hook in hook-free mode, each link of its
// create-symlinks at its path (or left out as dangling), unless it has
// a hook other than NVIDIA's, which refuses it naming the hook.
func TestHookFreeCorpus(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("making the corpus's device nodes needs root")
	}
	all, err := corpus.Specs()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range all {
		dir := t.TempDir()
		if _, err := s.Install(dir, t.TempDir(), "/usr/bin/recording-hook"); err != nil {
			t.Fatal(err)
		}
		for _, name := range s.Devices() {
			t.Run(s.File+"/"+name, func(t *testing.T) {
				devs, snap := loadDir(t, dir, name)
				res, err := adjust.Build(devs, snap.HostNodes, adjust.Options{HookFree: true, Sonames: snap.Sonames, Runtime: adjust.RuntimeOf("containerd", "v2.3.7", "v0.12.5")})
				var links, others []string
				for _, h := range hooksOf(devs) {
					switch {
					case len(h.Args) > 1 && h.Args[1] == "create-symlinks":
						for i, a := range h.Args {
							if a == "--link" && i+1 < len(h.Args) {
								_, link, _ := strings.Cut(h.Args[i+1], "::")
								links = append(links, filepath.Clean(link))
							}
						}
					case !isNVIDIAHook(h.Args):
						others = append(others, strings.Join(h.Args, " "))
					}
				}
				if len(others) > 0 {
					if !errors.Is(err, adjust.ErrHook) {
						t.Fatalf("hooks %q, not NVIDIA's: error %v, want ErrHook", others, err)
					}
					t.Logf("refused: hooks %q", others)
					return
				}
				if errors.Is(err, adjust.ErrUnsupportedEdit) {
					return // refused as on any runtime (TestCorpusParity)
				}
				if err != nil {
					t.Fatal(err)
				}
				if h := res.Adjustment.GetHooks(); h != nil {
					t.Errorf("hooks given: %v", h)
				}
				at := map[string]bool{}
				for _, m := range res.Adjustment.GetMounts() {
					at[m.Destination] = true
				}
				for _, d := range res.Adjustment.GetLinux().GetDevices() {
					at[d.Path] = true
				}
				for _, l := range res.LeftOut {
					if _, link, ok := strings.Cut(l.Lacks, "the link "); ok {
						at[strings.Fields(link)[0]] = true
					}
				}
				for _, l := range links {
					if !at[l] {
						t.Errorf("link %s neither given nor left out", l)
					}
				}
				var left []string
				for _, l := range res.LeftOut {
					left = append(left, l.Hook)
				}
				t.Logf("%d links given or left out, left out: %v", len(links), left)
			})
		}
	}
}

// loadDir loads the specs of dir and resolves names in them.
func loadDir(t *testing.T, dir string, names ...string) ([]*cdi.Device, *specs.Snapshot) {
	t.Helper()
	snap, err := specs.Load([]string{dir})
	if err != nil {
		t.Fatal(err)
	}
	entries, err := snap.Resolve(names)
	if err != nil {
		t.Fatal(err)
	}
	var out []*cdi.Device
	for _, e := range entries {
		out = append(out, e.Device)
	}
	return out, snap
}

// hooksOf returns the hooks of devices and their specs.
func hooksOf(devs []*cdi.Device) []*cdispec.Hook {
	var out []*cdispec.Hook
	for _, d := range devs {
		out = append(out, d.GetSpec().ContainerEdits.Hooks...)
		out = append(out, d.ContainerEdits.Hooks...)
	}
	return out
}

// isNVIDIAHook reports whether a hook's arguments run one of the NVIDIA
// hook commands docs/hook-free.md lists.
func isNVIDIAHook(args []string) bool {
	if len(args) > 1 && args[1] == "hook" {
		args = args[1:]
	}
	return len(args) > 1 && slices.Contains([]string{"create-symlinks", "update-ldcache", "create-soname-symlinks", "chmod", "enable-cuda-compat",
		"disable-device-node-modification", "update-application-profile", "apply-cuda-memory-limits"}, args[1])
}

// TestWithoutHooks: a spec written hook-free has no hook, the soname and
// link mounts and the link's device node in their places, and says what
// it left out; one with a hook nri-gpu cannot replace is refused and left
// as it was.
func TestWithoutHooks(t *testing.T) {
	lib, soname := sharedObject(t)
	for _, tc := range []struct {
		name, more string
		wantErr    string
	}{
		{name: "NVIDIA's hooks"},
		{name: "another hook", more: "    - {hookName: createContainer, path: /usr/bin/other, args: [other]}", wantErr: "/usr/bin/other other is not one of NVIDIA's hook commands"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var spec cdispec.Spec
			if err := yaml.Unmarshal([]byte(fmt.Sprintf(hookFreeSpec, lib, soname, tc.more)), &spec); err != nil {
				t.Fatal(err)
			}
			before := fmt.Sprint(spec.ContainerEdits.Hooks, spec.Devices[0].ContainerEdits.Hooks)
			left, err := adjust.WithoutHooks(&spec, specs.LibrarySonames(&spec))
			if tc.wantErr != "" {
				testutil.ErrorSays(t, err, tc.wantErr)
				if after := fmt.Sprint(spec.ContainerEdits.Hooks, spec.Devices[0].ContainerEdits.Hooks); after != before {
					t.Errorf("refused, yet the spec changed: %s", after)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if n := len(spec.ContainerEdits.Hooks) + len(spec.Devices[0].ContainerEdits.Hooks); n > 0 {
				t.Errorf("%d hooks left", n)
			}
			at := map[string]string{}
			for _, m := range spec.ContainerEdits.Mounts {
				at[m.ContainerPath] = m.HostPath
			}
			for _, p := range []string{"/usr/lib/x86_64-linux-gnu/" + soname, "/usr/lib/x86_64-linux-gnu/libexample.so"} {
				if at[p] != lib {
					t.Errorf("%s mounts %q, want %s", p, at[p], lib)
				}
			}
			if !slices.ContainsFunc(spec.Devices[0].ContainerEdits.DeviceNodes, func(n *cdispec.DeviceNode) bool {
				return n.Path == "/dev/dri/by-path/pci-0000:01:00.0-card" && n.HostPath == "/dev/null"
			}) {
				t.Errorf("device nodes %v lack the by-path link as the card's node", spec.Devices[0].ContainerEdits.DeviceNodes)
			}
			var hooks []string
			for _, l := range left {
				hooks = append(hooks, l.Hook)
			}
			if !slices.Contains(hooks, "enable-cuda-compat") || !slices.Contains(hooks, "disable-device-node-modification") {
				t.Errorf("left out %v", hooks)
			}
		})
	}
}

// TestHookFreeInjectedWithoutHooks: in hook-free mode a device the
// runtime's own CDI injected is refused only for its hooks: one with none
// is no error.
func TestHookFreeInjectedWithoutHooks(t *testing.T) {
	spec := "cdiVersion: \"0.6.0\"\nkind: example.com/gpu\ndevices:\n  - name: \"0\"\n    containerEdits:\n      deviceNodes: [{path: /dev/example0, hostPath: /dev/null}]\n"
	devs, snap := load(t, map[string]string{"gpu.yaml": spec}, "example.com/gpu=0")
	if _, err := adjust.Build(nil, snap.HostNodes, adjust.Options{HookFree: true, SpecPath: snap.SpecPath, Sonames: snap.Sonames, Injected: devs}); err != nil {
		t.Errorf("a device the runtime injected with no hook: %v", err)
	}
}
