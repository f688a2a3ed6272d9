package nvidia

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// Optional control nodes, added where present.
var controlNodes = []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"}

// Driver libraries of the compute set, without their ".so.<version>".
var (
	requiredLibraries = []string{"libcuda.so", "libnvidia-ml.so"}
	optionalLibraries = []string{
		"libnvidia-ptxjitcompiler.so", "libnvidia-nvvm.so", "libcudadebugger.so", "libnvidia-opencl.so",
		"libnvidia-gpucomp.so", "libnvidia-allocator.so", "libnvidia-cfg.so", "libnvidia-pkcs11.so",
		"libnvidia-pkcs11-openssl3.so",
	}
)

// libraryDirs are the standard library directories, searched after the
// directories the ld cache names.
var libraryDirs = []string{
	"/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/lib/x86_64-linux-gnu",
	"/lib/aarch64-linux-gnu", "/lib64", "/usr/lib", "/lib",
}

// Utilities, firmware and sockets, added where present.
var (
	utilities = []string{"/usr/bin/nvidia-smi", "/usr/bin/nvidia-debugdump", "/usr/bin/nvidia-persistenced"}
	sockets   = []string{"/run/nvidia-persistenced/socket", "/run/nvidia-fabricmanager/socket"}
)

var (
	readOnly     = []string{"ro", "nosuid", "nodev", "rbind", "rprivate"}
	readOnlyNoEx = []string{"ro", "nosuid", "nodev", "noexec", "rbind", "rprivate"}
)

// sharedEdits returns the edits every device of the spec shares.
func sharedEdits(r root, version, hookPath string) (*cdispec.ContainerEdits, error) {
	e := &cdispec.ContainerEdits{Env: []string{"NVIDIA_VISIBLE_DEVICES=void"}}
	for _, path := range controlNodes {
		if exists(r.host(path)) {
			e.DeviceNodes = append(e.DeviceNodes, &cdispec.DeviceNode{Path: path, HostPath: r.host(path)})
		}
	}

	libs, err := findLibraries(r, version)
	if err != nil {
		return nil, err
	}
	for _, lib := range libs {
		e.Mounts = append(e.Mounts, &cdispec.Mount{HostPath: r.host(lib), ContainerPath: lib, Options: readOnly})
	}
	for _, path := range utilities {
		if exists(r.host(path)) {
			e.Mounts = append(e.Mounts, &cdispec.Mount{HostPath: r.host(path), ContainerPath: path, Options: readOnly})
		}
	}
	if fw := "/lib/firmware/nvidia/" + version; exists(r.host(fw)) {
		e.Mounts = append(e.Mounts, &cdispec.Mount{HostPath: r.host(fw), ContainerPath: fw, Options: readOnlyNoEx})
	}
	for _, path := range sockets {
		if exists(r.host(path)) {
			e.Mounts = append(e.Mounts, &cdispec.Mount{HostPath: r.host(path), ContainerPath: path, Options: readOnlyNoEx})
		}
	}

	if hookPath != "" {
		e.Hooks = ldcacheHooks(hookPath, libs)
	}
	return e, nil
}

// ldcacheHooks returns the nvidia-cdi-hook createContainer hooks that make
// the mounted libraries usable: symlinks for libcuda.so, then the ld
// cache updated for their directories.
func ldcacheHooks(hookPath string, libs []string) []*cdispec.Hook {
	var dirs []string
	var links []string
	for _, lib := range libs {
		dir := filepath.Dir(lib)
		if !slices.Contains(dirs, dir) {
			dirs = append(dirs, dir)
		}
		if strings.HasPrefix(filepath.Base(lib), "libcuda.so.") {
			links = append(links, "--link", "libcuda.so.1::"+filepath.Join(dir, "libcuda.so"))
		}
	}
	var hooks []*cdispec.Hook
	if len(links) > 0 {
		hooks = append(hooks, &cdispec.Hook{
			HookName: "createContainer", Path: hookPath, Env: []string{specs.HookEnv},
			Args: append([]string{"nvidia-cdi-hook", "create-symlinks"}, links...),
		})
	}
	args := []string{"nvidia-cdi-hook", "update-ldcache"}
	for _, d := range dirs {
		args = append(args, "--folder", d)
	}
	return append(hooks, &cdispec.Hook{HookName: "createContainer", Path: hookPath, Env: []string{specs.HookEnv}, Args: args})
}

// findLibraries returns the container paths of the driver's compute
// libraries of the given version, "<name>.<version>", looked for in the
// directories the ld cache under the driver root names, then in the
// standard library directories. A required library missing is an error.
func findLibraries(r root, version string) ([]string, error) {
	dirs := append(ldCacheDirs(r), libraryDirs...)
	var libs []string
	for _, name := range append(slices.Clone(requiredLibraries), optionalLibraries...) {
		file := name + "." + version
		found := ""
		for _, d := range dirs {
			if p := filepath.Join(d, file); exists(r.host(p)) {
				found = p
				break
			}
		}
		if found == "" {
			if slices.Contains(requiredLibraries, name) {
				return nil, fmt.Errorf("driver library %s (the version NVML reports) not found under %s in the ld cache or %s",
					file, r, strings.Join(libraryDirs, ", "))
			}
			continue
		}
		libs = append(libs, found)
	}
	return libs, nil
}

// ldCacheDirs returns the directories of the NVIDIA libraries the ld cache
// (/etc/ld.so.cache under the driver root) lists, in order. The cache's
// string table holds the libraries' absolute paths.
func ldCacheDirs(r root) []string {
	data, err := os.ReadFile(r.host("/etc/ld.so.cache"))
	if err != nil {
		return nil
	}
	var dirs []string
	for _, s := range bytes.Split(data, []byte{0}) {
		p := string(s)
		if !strings.HasPrefix(p, "/") || !strings.HasPrefix(filepath.Base(p), "lib") {
			continue
		}
		base := filepath.Base(p)
		if !strings.HasPrefix(base, "libcuda.so") && !strings.HasPrefix(base, "libnvidia-") {
			continue
		}
		if d := filepath.Dir(p); !slices.Contains(dirs, d) {
			dirs = append(dirs, d)
		}
	}
	return dirs
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
