package e2e

import (
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"golang.org/x/sys/unix"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/specs/nvidia"
	"github.com/nri-gpu/nri-gpu/test/harness"
)

// driverVersion is the version of the fake driver's libraries.
const driverVersion = "570.133.20"

// fakeLibs are the driver libraries the fake driver builds: the file name
// stem, its soname, and the function a program calls, which returns a
// marker.
var fakeLibs = []struct{ stem, soname, fn, ret string }{
	{"libcuda.so", "libcuda.so.1", "cuInit", "42"},
	{"libnvidia-ml.so", "libnvidia-ml.so.1", "nvmlInit_v2", "43"},
	{"libnvidia-ptxjitcompiler.so", "libnvidia-ptxjitcompiler.so.1", "__cuda_ptx_jit_marker", "44"},
}

// probe dlopens the driver's libraries by soname, as CUDA programs and
// nvidia-smi do, and prints what their functions return and the file
// each came from ("cuInit=42 /usr/lib64/libcuda.so.1").
const probe = `#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
int main(void) {
	const char *libs[][2] = {%s};
	int failed = 0;
	for (int i = 0; i < %d; i++) {
		void *h = dlopen(libs[i][0], RTLD_NOW);
		if (!h) { printf("dlopen %%s: %%s\n", libs[i][0], dlerror()); failed = 1; continue; }
		int (*fn)(unsigned) = (int (*)(unsigned))dlsym(h, libs[i][1]);
		if (!fn) { printf("dlsym %%s: %%s\n", libs[i][1], dlerror()); failed = 1; continue; }
		Dl_info in;
		printf("%%s=%%d %%s\n", libs[i][1], fn(0), dladdr((void *)fn, &in) ? in.dli_fname : "?");
	}
	return failed;
}
`

// TestCUDALoads proves, without a GPU, that a container given an NVIDIA
// GPU through a spec nri-gpu generated loads the driver's libraries by
// soname: a fake driver whose libcuda, libnvidia-ml and
// libnvidia-ptxjitcompiler are real shared objects (right sonames, a
// function returning a marker), laid out as Debian/Ubuntu multiarch and as
// /usr/lib64, NVML mocked, and a dynamically linked program in the image
// that dlopens them by soname. nri-gpu, named by the spec as its hook,
// makes the links; without the hooks the same program cannot load them.
func TestCUDALoads(t *testing.T) {
	needEnv(t)
	dir := filepath.Join(env.dir, "cuda")
	build, image := probeImage(t, dir, nil)
	for _, layout := range []struct{ name, libDir string }{
		{"multiarch", "/usr/lib/x86_64-linux-gnu"},
		{"lib64", "/usr/lib64"},
	} {
		t.Run(layout.name, func(t *testing.T) {
			root := filepath.Join(dir, layout.name, "driver")
			fakeDriver(t, root, build, layout.libDir)
			specDir := filepath.Join(dir, layout.name, "cdi")
			writeSpecs(t, root, specDir)

			ctd := extraContainerd(t, "cuda-"+layout.name, harness.Options{Image: image})
			config := filepath.Join(ctd.Dir, "nri-gpu.yaml")
			if err := os.WriteFile(config, []byte(fmt.Sprintf("cdiSpecDirs: [%s]\npolicy:\n  devices: [\"*/*\"]\n", specDir)), 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := ctd.StartPlugin("--config", config); err != nil {
				t.Fatal(err)
			}

			podID, pod := newPod(t, ctd, map[string]string{"gpus.nri-gpu.io": "0"})
			id, _ := runContainer(t, ctd, podID, pod, harness.Container{Name: "cuda"})
			out, err := ctd.Exec(id, "/probe")
			if err != nil {
				t.Fatalf("the probe could not load the driver: %v\n%s", err, out)
			}
			t.Logf("the probe in a container given GPU 0:\n%s", out)
			for _, l := range fakeLibs {
				testutil.ErrorSays(t, fmt.Errorf("%s", out), l.fn+"="+l.ret)
			}

			// In a user namespace of its own (2.x), the hooks run as the
			// namespace's root, a host uid of no privilege: they do their
			// work in the container's root all the same.
			if env.tools.Containerd2() {
				userns := harness.Pod{Name: "cuda-userns-" + layout.name, Namespace: "e2e", UserNS: true, Annotations: map[string]string{"gpus.nri-gpu.io": "0"}}
				podID, err := ctd.RunPod(userns)
				if err != nil {
					t.Fatal(err)
				}
				id, _ := runContainer(t, ctd, podID, userns, harness.Container{Name: "cuda"})
				out, err := ctd.Exec(id, "sh", "-c", "head -n 1 /proc/self/uid_map; /probe")
				if err != nil {
					t.Fatalf("in a user namespace the probe could not load the driver: %v\n%s", err, out)
				}
				t.Logf("the probe in a user-namespaced container given GPU 0:\n%s", out)
				for _, l := range fakeLibs {
					testutil.ErrorSays(t, fmt.Errorf("%s", out), l.fn+"="+l.ret)
				}
				if f := strings.Fields(out); len(f) < 2 || f[0] != "0" || f[1] == "0" {
					t.Errorf("uid map %q, want root of a namespace mapped to another host uid", out)
				}
				hostileUserNS(t, layout.name, layout.libDir, config)
			}

			// The same spec without its hooks: nothing makes the links,
			// and the probe cannot load the driver.
			podID, pod = newPod(t, ctd, map[string]string{"gpus.nri-gpu.io": "example.com/nohooks=0"})
			id, _ = runContainer(t, ctd, podID, pod, harness.Container{Name: "cuda"})
			out, err = ctd.Exec(id, "/probe")
			t.Logf("the probe without the hooks:\n%s", out)
			if err == nil || !strings.Contains(out, "libcuda.so.1: cannot open shared object file") {
				t.Errorf("without the hooks the probe said %q (%v); want it unable to load libcuda.so.1", out, err)
			}
		})
	}
}

// probeImage builds, in dir, the fake driver's libraries (real shared
// objects with NVIDIA's sonames, needing no libc, so that glibc's and
// musl's loaders load them alike) into build and an image whose /probe
// dlopens them by soname, with the files extra makes from build, and
// returns build and the image's tar.
func probeImage(t *testing.T, dir string, extra func(build string, probe []harness.File) []harness.File) (build, image string) {
	t.Helper()
	build = filepath.Join(dir, "build")
	if err := os.MkdirAll(build, 0o755); err != nil {
		t.Fatal(err)
	}
	var libsC []string
	for _, l := range fakeLibs {
		src := filepath.Join(build, l.stem+".c")
		if err := os.WriteFile(src, []byte(fmt.Sprintf("int %s(unsigned f) { (void)f; return %s; }\n", l.fn, l.ret)), 0o644); err != nil {
			t.Fatal(err)
		}
		compileC(t, "-shared", "-fPIC", "-nostdlib", "-Wl,-soname,"+l.soname, "-o", filepath.Join(build, l.stem+"."+driverVersion), src)
		libsC = append(libsC, fmt.Sprintf("{%q, %q}", l.soname, l.fn))
	}
	probeC := filepath.Join(build, "probe.c")
	if err := os.WriteFile(probeC, []byte(fmt.Sprintf(probe, strings.Join(libsC, ", "), len(fakeLibs))), 0o644); err != nil {
		t.Fatal(err)
	}
	compileC(t, "-o", filepath.Join(build, "probe"), probeC, "-ldl")

	image = filepath.Join(dir, "image.tar")
	files, err := harness.ProgramFiles(filepath.Join(build, "probe"), "probe")
	if err != nil {
		t.Fatal(err)
	}
	if extra != nil {
		files = append(files, extra(build, files)...)
	}
	if err := harness.BuildImage(env.tools.Busybox, image, files...); err != nil {
		t.Fatal(err)
	}
	return build, image
}

// probeHost builds, in dir, the probe image (probeImage), a fake driver
// laid out as Debian/Ubuntu multiarch and the specs nri-gpu generates of
// it, and returns the image, the driver's root and the spec directory.
func probeHost(t *testing.T, dir string) (image, root, specDir string) {
	t.Helper()
	build, image := probeImage(t, dir, nil)
	root, specDir = filepath.Join(dir, "driver"), filepath.Join(dir, "cdi")
	fakeDriver(t, root, build, "/usr/lib/x86_64-linux-gnu")
	writeSpecs(t, root, specDir)
	return image, root, specDir
}

// fakeDriver lays out a driver root: the GPU's and nvidiactl's device
// nodes, and the built libraries in libDir.
func fakeDriver(t *testing.T, root, build, libDir string) {
	t.Helper()
	for name, minor := range map[string]uint32{"nvidia0": 0, "nvidiactl": 255} {
		p := filepath.Join(root, "dev", name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(harness.NvidiaMajor, minor))); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(root, libDir), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, l := range fakeLibs {
		data, err := os.ReadFile(filepath.Join(build, l.stem+"."+driverVersion))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, libDir, l.stem+"."+driverVersion), data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// writeSpecs generates the spec of one mocked GPU on the driver root, as
// nri-gpu generate does, with the nri-gpu under test as its hook, and a
// copy without hooks of kind example.com/nohooks.
func writeSpecs(t *testing.T, root, specDir string) {
	t.Helper()
	lib := testutil.NVML(1)
	lib.SystemGetDriverVersionFunc = func() (string, nvml.Return) { return driverVersion, nvml.SUCCESS }
	spec, err := nvidia.Generate(lib, nvidia.Options{DriverRoot: root, HookPath: env.tools.Path("nri-gpu")})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(specDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := nvidia.Write(spec, filepath.Join(specDir, "nvidia.yaml"), "yaml", nil); err != nil {
		t.Fatal(err)
	}
	spec.Kind = "example.com/nohooks"
	spec.ContainerEdits.Hooks = nil
	for i := range spec.Devices {
		spec.Devices[i].ContainerEdits.Hooks = nil
	}
	if err := nvidia.Write(spec, filepath.Join(specDir, "nohooks.yaml"), "yaml", nil); err != nil {
		t.Fatal(err)
	}
}

// hostileUserNS: a hostile image whose library directory and ld.so.conf.d
// are symlinks to host directories (absolute paths of the host), in a
// user-namespaced pod given GPU 0 of the spec nri-gpu generated: the
// runtime's mounts and nri-gpu's hooks (create-symlinks, update-ldcache),
// run as the namespace's root, resolve those paths in the container's
// root: nothing lands in the host directories.
func hostileUserNS(t *testing.T, name, libDir, config string) {
	t.Helper()
	hostile(t, name, libDir, config, true)
}

// hostile runs a hostile image in a pod given GPU 0 (in a user namespace
// of its own when userNS): its library directory and ld.so.conf.d are
// symlinks to host directories, and its LD_PRELOAD names a library that
// would leave a file in a third one wherever it is loaded on the host.
// Nothing lands in any of them.
func hostile(t *testing.T, name, libDir, config string, userNS bool) {
	t.Helper()
	dir := filepath.Join(env.dir, "cuda-hostile-"+name)
	hostLib, hostConf, hostMark := filepath.Join(dir, "host-lib"), filepath.Join(dir, "host-conf"), filepath.Join(dir, "host-mark")
	evilC := filepath.Join(dir, "evil.c")
	for _, d := range []string{hostLib, hostConf, hostMark} {
		if err := os.MkdirAll(d, 0o777); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, 0o777); err != nil { // writable even by the namespace's root
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(evilC, []byte(fmt.Sprintf("#include <stdio.h>\n__attribute__((constructor)) static void mark(void) { FILE *f = fopen(%q, \"w\"); if (f) fclose(f); }\n", filepath.Join(hostMark, "loaded"))), 0o644); err != nil {
		t.Fatal(err)
	}
	compileC(t, "-shared", "-fPIC", "-o", filepath.Join(dir, "evil.so"), evilC)
	evil, err := os.ReadFile(filepath.Join(dir, "evil.so"))
	if err != nil {
		t.Fatal(err)
	}
	image := filepath.Join(dir, "image.tar")
	if err := harness.BuildImage(env.tools.Busybox, image,
		harness.File{Name: strings.TrimPrefix(libDir, "/"), Link: hostLib},
		harness.File{Name: "etc/ld.so.conf.d", Link: hostConf},
		harness.File{Name: "evil.so", Data: evil, Mode: 0o755}); err != nil {
		t.Fatal(err)
	}
	ctd := extraContainerd(t, "cuda-hostile-"+name, harness.Options{Image: image})
	if _, err := ctd.StartPlugin("--config", config); err != nil {
		t.Fatal(err)
	}
	pod := harness.Pod{Name: "hostile", Namespace: "e2e", UserNS: userNS, Annotations: map[string]string{"gpus.nri-gpu.io": "0"}}
	podID, err := ctd.RunPod(pod)
	if err != nil {
		t.Fatal(err)
	}
	id, err := ctd.CreateContainer(podID, pod, harness.Container{Name: "hostile", Env: map[string]string{"LD_PRELOAD": "/evil.so"}})
	if err == nil {
		err = ctd.StartContainer(id)
	}
	where := map[bool]string{true: "in a user namespace", false: "as root"}[userNS]
	if err != nil {
		t.Logf("the hostile image %s does not start: %s", where, harness.LastLine(err.Error()))
	} else {
		t.Logf("the hostile image %s started", where)
	}
	for _, d := range []string{hostLib, hostConf, hostMark} {
		if entries, err := os.ReadDir(d); err != nil || len(entries) > 0 {
			t.Errorf("the host directory %s holds %v (%v); want nothing", d, entries, err)
		}
	}
}

// compileC runs the C compiler with args (make test needs one for cgo
// too).
func compileC(t *testing.T, args ...string) {
	t.Helper()
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Fatalf("a C compiler is needed (make test needs one for cgo too): %v", err)
	}
	if out, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
		t.Fatalf("cc %v: %v\n%s", args, err, out)
	}
}

// TestHookFreeCUDALoads: with hookFree, a container given GPU 0 of the
// spec nri-gpu generated (its hooks create-symlinks and update-ldcache
// among others) gets no OCI hook, and the probe loads the driver's
// libraries by soname all the same, on a host laid out as Debian/Ubuntu
// multiarch and as /usr/lib64, in an image of each loader family (glibc
// with an ld.so.cache that does not list the driver, as a Debian or
// Ubuntu image has; glibc with no cache at all, a minimal root; a glibc
// loader whose system directories are RHEL's /lib64 and /usr/lib64,
// which must find the libraries there; musl, as Alpine; glibc with
// LD_LIBRARY_PATH set, as NVIDIA's CUDA images set it), as root, as another user and in a user namespace (2.x). On
// containerd 2.x with the default validator's
// reject_oci_hook_adjustment, the same device with its hooks is refused
// by the runtime.
func TestHookFreeCUDALoads(t *testing.T) {
	needEnv(t)
	musl, err := exec.LookPath("musl-gcc")
	if err != nil {
		t.Fatalf("musl-gcc (musl-tools, hack/install-deps.sh) builds the musl probe: %v", err)
	}
	dir := filepath.Join(env.dir, "cuda-hookfree")
	build, image := probeImage(t, dir, func(build string, probe []harness.File) []harness.File {
		files := append(muslProbe(t, musl, build), ldCache(t, filepath.Join(build, "cache-root"), probe)...)
		return append(files, lib64Loader(t)...)
	})
	reject := env.tools.Containerd2()
	// The families' loaders; in, where one must have found each library
	// (RHEL's directories, which its loader searches before Debian's
	// libc6-amd64 adds /lib and /usr/lib).
	families := []struct {
		name, cmd string
		in        []string
	}{
		{name: "glibc, ld.so.cache without the driver", cmd: "/probe"},
		{name: "glibc, no ld.so.cache", cmd: "/lib64/ld-linux-x86-64.so.2 --inhibit-cache /probe"},
		{name: "glibc, RHEL-like (/lib64, /usr/lib64)", cmd: lib64LoaderPath + " --inhibit-cache /probe", in: []string{"/lib64/", "/usr/lib64/"}},
		{name: "musl", cmd: "/probe-musl"},
		{name: "glibc, LD_LIBRARY_PATH of CUDA images", cmd: "LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64 /probe"},
	}
	user := int64(1000)
	users := []struct {
		name   string
		user   *int64
		userNS bool
	}{{name: "root"}, {name: "user 1000", user: &user}, {name: "user namespace", userNS: true}}
	for _, layout := range []struct{ name, libDir string }{
		{"multiarch", "/usr/lib/x86_64-linux-gnu"},
		{"lib64", "/usr/lib64"},
	} {
		t.Run(layout.name, func(t *testing.T) {
			root := filepath.Join(dir, layout.name, "driver")
			fakeDriver(t, root, build, layout.libDir)
			specDir := filepath.Join(dir, layout.name, "cdi")
			writeSpecs(t, root, specDir)
			ctd := extraContainerd(t, "cuda-hookfree-"+layout.name, harness.Options{Image: image, RejectHooks: reject})
			config := func(hookFree bool) string {
				path := filepath.Join(ctd.Dir, fmt.Sprintf("nri-gpu-%v.yaml", hookFree))
				if err := os.WriteFile(path, []byte(fmt.Sprintf("cdiSpecDirs: [%s]\nhookFree: %v\npolicy:\n  devices: [\"*/*\"]\n", specDir, hookFree)), 0o644); err != nil {
					t.Fatal(err)
				}
				return path
			}
			if reject {
				plug, err := ctd.StartPlugin("--config", config(false))
				if err != nil {
					t.Fatal(err)
				}
				podID, pod := newPod(t, ctd, map[string]string{"gpus.nri-gpu.io": "0"})
				_, err = ctd.CreateContainer(podID, pod, harness.Container{Name: "hooks"})
				testutil.ErrorSays(t, err, "restricted OCI hook injection")
				plug.Stop()
			}
			if _, err := ctd.StartPlugin("--config", config(true)); err != nil {
				t.Fatal(err)
			}
			for _, u := range users {
				t.Run(u.name, func(t *testing.T) {
					if u.userNS && !env.tools.Containerd2() {
						t.Skip("user namespaces of pods: containerd 2.x")
					}
					pod := harness.Pod{Name: "hookfree-" + strings.ReplaceAll(u.name, " ", "-"), Namespace: "e2e", UserNS: u.userNS, Annotations: map[string]string{"gpus.nri-gpu.io": "0"}}
					podID, err := ctd.RunPod(pod)
					if err != nil {
						t.Fatal(err)
					}
					id, spec := runContainer(t, ctd, podID, pod, harness.Container{Name: "cuda", User: u.user})
					if h := spec.Hooks; h != nil && len(h.CreateRuntime)+len(h.CreateContainer)+len(h.StartContainer)+len(h.Prestart)+len(h.Poststart) > 0 {
						t.Errorf("hook-free container has hooks: %+v", h)
					}
					for _, f := range families {
						out, err := ctd.Exec(id, "sh", "-c", f.cmd)
						if err != nil {
							t.Errorf("%s: the probe could not load the driver hook-free: %v\n%s", f.name, err, out)
							continue
						}
						var from []string
						for _, l := range fakeLibs {
							_, after, ok := strings.Cut(out, l.fn+"="+l.ret+" ")
							file, _, _ := strings.Cut(after, "\n")
							if !ok {
								t.Errorf("%s: the probe said %q, want %s=%s", f.name, out, l.fn, l.ret)
							} else if f.in != nil && !slices.ContainsFunc(f.in, func(d string) bool { return file == d+l.soname }) {
								t.Errorf("%s: %s loaded from %s, want it found in %v", f.name, l.soname, file, f.in)
							}
							from = append(from, file)
						}
						t.Logf("%s: loaded %d libraries by soname, from %v", f.name, len(fakeLibs), from)
					}
				})
			}
			// The hostile image, hook-free: runc makes every mount in the
			// container's root, and nothing runs on the host.
			cfg := config(true)
			hostile(t, "hookfree-"+layout.name, layout.libDir, cfg, false)
			if env.tools.Containerd2() {
				hostile(t, "hookfree-userns-"+layout.name, layout.libDir, cfg, true)
			}
		})
	}
}

// lib64LoaderPath is where the hook-free probe image has a glibc loader
// whose system directories are RHEL's (make e2e-tools puts it in the
// tools: hack/glibc-lib64.sh).
const lib64LoaderPath = "/opt/glibc-lib64/ld.so"

// lib64Loader returns the image's RHEL-like loader at lib64LoaderPath
// and its libc in /lib64, where that loader finds it (the image's
// Debian loader does not look there).
func lib64Loader(t *testing.T) []harness.File {
	t.Helper()
	dir := filepath.Join(env.tools.Dir, "glibc-lib64")
	var files []harness.File
	for _, f := range []struct{ name, at string }{{"ld.so", lib64LoaderPath}, {"libc.so.6", "/lib64/libc.so.6"}} {
		data, err := os.ReadFile(filepath.Join(dir, f.name))
		if err != nil {
			t.Fatalf("the RHEL-like loader (make e2e-tools: hack/glibc-lib64.sh): %v", err)
		}
		files = append(files, harness.File{Name: strings.TrimPrefix(f.at, "/"), Data: data, Mode: 0o755})
	}
	return files
}

// muslProbe returns the image's /probe-musl, the probe built with musl,
// and musl's loader at its path.
func muslProbe(t *testing.T, muslGCC, build string) []harness.File {
	t.Helper()
	out := filepath.Join(build, "probe-musl")
	if b, err := exec.Command(muslGCC, "-o", out, filepath.Join(build, "probe.c")).CombinedOutput(); err != nil {
		t.Fatalf("musl-gcc: %v\n%s", err, b)
	}
	interp := elfInterp(t, out)
	probe, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	loader, err := os.ReadFile(interp) // through its link: musl's libc
	if err != nil {
		t.Fatal(err)
	}
	return []harness.File{{Name: "probe-musl", Data: probe, Mode: 0o755}, {Name: strings.TrimPrefix(interp, "/"), Data: loader, Mode: 0o755}}
}

// elfInterp returns the program interpreter an executable names.
func elfInterp(t *testing.T, path string) string {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			data := make([]byte, p.Filesz)
			if _, err := p.ReadAt(data, 0); err != nil {
				t.Fatal(err)
			}
			return strings.TrimRight(string(data), "\x00")
		}
	}
	t.Fatalf("%s names no interpreter", path)
	return ""
}

// ldCache returns an /etc/ld.so.conf and the /etc/ld.so.cache ldconfig
// builds of the image's files (the probe's libc and loader), as a Debian
// or Ubuntu image has: a cache that does not list the driver.
func ldCache(t *testing.T, root string, files []harness.File) []harness.File {
	t.Helper()
	conf := harness.File{Name: "etc/ld.so.conf", Data: []byte("include /etc/ld.so.conf.d/*.conf\n"), Mode: 0o644}
	for _, f := range append(files, conf) {
		p := filepath.Join(root, f.Name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, f.Data, os.FileMode(f.Mode)); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := exec.Command("ldconfig", "-r", root).CombinedOutput(); err != nil {
		t.Fatalf("ldconfig -r: %v\n%s", err, out)
	}
	cache, err := os.ReadFile(filepath.Join(root, "etc", "ld.so.cache"))
	if err != nil {
		t.Fatal(err)
	}
	return []harness.File{conf, {Name: "etc/ld.so.cache", Data: cache, Mode: 0o644}}
}

// TestHookFreeDevicePlugin: the device plugin's door, hook-free. nri-gpu
// in device-plugin mode beside a real kubelet, with hookFree and the spec
// nri-gpu generated (its hooks among its edits), on a containerd that
// refuses every OCI hook a plugin adds (2.x): a pod asking for
// nvidia.com/gpu in its limits runs with one GPU, no OCI hook reaches its
// container, and the probe loads the driver's libraries by soname.
func TestHookFreeDevicePlugin(t *testing.T) {
	needEnv(t)
	image, _, specDir := probeHost(t, filepath.Join(env.dir, "hookfree-device-plugin"))
	ctd := extraContainerd(t, "hookfree-device-plugin", harness.Options{Image: image, RejectHooks: env.tools.Containerd2()})
	k := startKubelet(t, ctd)
	config := filepath.Join(ctd.Dir, "nri-gpu.yaml")
	cfg := fmt.Sprintf("cdiSpecDirs: [%s]\nhookFree: true\npolicy:\n  devices: [nvidia.com/gpu=*]\n"+
		"devicePlugin:\n  kubeletDir: %s\n  resources: [{name: nvidia.com/gpu}]\n", specDir, filepath.Join(k.VarLib, "kubelet", "device-plugins"))
	if err := os.WriteFile(config, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	plugin, err := ctd.StartPlugin("--config", config)
	if err != nil {
		t.Fatal(err)
	}
	// A pod kubelet admits before the resource is registered runs with
	// nothing (TestDevicePlugin): first nri-gpu tells kubelet the GPU.
	testutil.Within(t, podWait, "nri-gpu telling kubelet its GPU", func() bool {
		return strings.Contains(plugin.Log(), `devices="0 healthy"`)
	})
	if err := k.WaitDevices(0, podWait, "nvidia.com/gpu", 1); err != nil { // kubelet took it in
		t.Fatal(err)
	}
	addPod(t, k, harness.StaticPod{Name: "hookfree", Limits: map[string]string{"nvidia.com/gpu": "1"}})
	id, err := k.RunningContainer("hookfree", podWait)
	if err != nil {
		t.Fatal(err)
	}
	spec, err := ctd.ContainerSpec(id)
	if err != nil {
		t.Fatal(err)
	}
	if h := spec.Hooks; h != nil && len(h.CreateRuntime)+len(h.CreateContainer)+len(h.StartContainer)+len(h.Prestart)+len(h.Poststart) > 0 {
		t.Errorf("the hook-free container has OCI hooks: %+v", h)
	}
	if got := gpusInside(t, ctd, id); len(got) != 1 {
		t.Errorf("the pod sees GPUs %v, want one", got)
	}
	out, err := ctd.Exec(id, "/probe")
	if err != nil {
		t.Fatalf("the probe could not load the driver hook-free: %v\n%s", err, out)
	}
	for _, l := range fakeLibs {
		testutil.ErrorSays(t, fmt.Errorf("%s", out), l.fn+"="+l.ret)
	}
	t.Logf("a device-plugin pod, hook-free:\n%s", out)
}
