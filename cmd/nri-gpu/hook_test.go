package main

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestHook runs nri-gpu as the CDI hook of the specs it generates, as a
// runtime does ("nri-gpu create-symlinks --link ...", the container's
// state on standard input): it makes the link libcuda.so -> libcuda.so.1
// in the container's root that lets a program load the driver by name.
func TestHook(t *testing.T) {
	bundle := t.TempDir()
	rootfs := filepath.Join(bundle, "rootfs")
	if err := os.MkdirAll(filepath.Join(rootfs, "usr/lib/x86_64-linux-gnu"), 0o755); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	withState(t, bundle, func() {
		if code := run([]string{"create-symlinks", "--link", "libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so"}, io.Discard, &stderr); code != exitOK {
			t.Fatalf("exit %d: %s", code, stderr.String())
		}
	})
	target, err := os.Readlink(filepath.Join(rootfs, "usr/lib/x86_64-linux-gnu/libcuda.so"))
	if err != nil || target != "libcuda.so.1" {
		t.Errorf("link %q, %v; want libcuda.so -> libcuda.so.1", target, err)
	}
	if code := run([]string{"hook", "noop"}, io.Discard, &stderr); code != exitOK {
		t.Errorf("nri-gpu hook noop: exit %d: %s", code, stderr.String())
	}
}

// TestHooksStayInRoot: each hook command that writes at a path of the
// image, run on a hostile image whose paths are symlinks to a host
// directory and a host file (absolute ones, and ones that climb out with
// ".."), changes nothing on the host: chmod leaves the host file's mode,
// create-symlinks, enable-cuda-compat and update-application-profile
// write no file in the host directory.
func TestHooksStayInRoot(t *testing.T) {
	host := t.TempDir()
	hostDir, hostFile := filepath.Join(host, "dir"), filepath.Join(host, "secret")
	if err := os.Mkdir(hostDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(hostFile, []byte("host"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		image map[string]string // symlinks of the image: path in root -> target
		files []string          // regular files of the image
		gpus  []string          // GPU char devices of the image (195:0 on)
		args  []string
	}{
		{"chmod absolute", map[string]string{"dev/nvidia0": hostFile}, nil, nil, []string{"chmod", "--mode", "777", "--path", "/dev/nvidia0"}},
		{"chmod climbing", map[string]string{"dev/nvidia0": "../../../../../../../../.." + hostFile}, nil, nil, []string{"chmod", "--mode", "777", "--path", "/dev/nvidia0"}},
		{"chmod through a dir", map[string]string{"dev": host}, nil, nil, []string{"chmod", "--mode", "777", "--path", "/dev/secret"}},
		{"create-symlinks", map[string]string{"usr/lib": hostDir}, nil, nil, []string{"create-symlinks", "--link", "libcuda.so.1::/usr/lib/libcuda.so"}},
		{"create-symlinks climbing", map[string]string{"usr/lib": "../../../../../../../.." + hostDir}, nil, nil, []string{"create-symlinks", "--link", "libcuda.so.1::/usr/lib/libcuda.so"}},
		{"enable-cuda-compat", map[string]string{"etc/ld.so.conf.d": hostDir}, []string{"usr/local/cuda/compat/libcuda.so.999.1"},
			nil, []string{"enable-cuda-compat", "--host-driver-version", "100.0"}},
		{"update-application-profile", map[string]string{"etc/nvidia": hostDir}, nil, []string{"dev/nvidia0"}, []string{"update-application-profile"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bundle := t.TempDir()
			rootfs := filepath.Join(bundle, "rootfs")
			for path, target := range tc.image {
				if err := os.MkdirAll(filepath.Dir(filepath.Join(rootfs, path)), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink(target, filepath.Join(rootfs, path)); err != nil {
					t.Fatal(err)
				}
			}
			for _, f := range tc.files {
				if err := os.MkdirAll(filepath.Dir(filepath.Join(rootfs, f)), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(rootfs, f), nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			for i, g := range tc.gpus {
				if err := os.MkdirAll(filepath.Dir(filepath.Join(rootfs, g)), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := unix.Mknod(filepath.Join(rootfs, g), unix.S_IFCHR|0o666, int(unix.Mkdev(195, uint32(i)))); err != nil {
					t.Fatalf("mknod (the tests run as root): %v", err)
				}
			}
			withState(t, bundle, func() {
				var stderr bytes.Buffer
				run(tc.args, io.Discard, &stderr)
				t.Logf("%v: %s", tc.args, stderr.String())
			})
			if fi, err := os.Stat(hostFile); err != nil || fi.Mode().Perm() != 0o600 {
				t.Errorf("the host file: %v, %v; want mode 0600 as before", fi.Mode(), err)
			}
			if entries, err := os.ReadDir(hostDir); err != nil || len(entries) > 0 {
				t.Errorf("the host dir holds %v (%v); want nothing", entries, err)
			}
		})
	}
}

// TestChmodInRoot: nri-gpu's chmod sets the mode of a path of the image,
// also through the image's own symlinks, within its root.
func TestChmodInRoot(t *testing.T) {
	bundle := t.TempDir()
	rootfs := filepath.Join(bundle, "rootfs")
	if err := os.MkdirAll(filepath.Join(rootfs, "dev/dri"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/dev/dri", filepath.Join(rootfs, "dri")); err != nil {
		t.Fatal(err)
	}
	withState(t, bundle, func() {
		var stderr bytes.Buffer
		if code := run([]string{"chmod", "--mode", "755", "--path", "/dri", "--path", "/dev/missing"}, io.Discard, &stderr); code != exitOK {
			t.Fatalf("exit %d: %s", code, stderr.String())
		}
	})
	if fi, err := os.Stat(filepath.Join(rootfs, "dev/dri")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("/dev/dri in the image: %v, %v; want 0755", fi.Mode(), err)
	}
}

// withState runs f with the OCI state of a container of bundle (its root
// rootfs) on standard input, as a runtime runs a hook.
func withState(t *testing.T, bundle string, f func()) {
	t.Helper()
	config, _ := json.Marshal(map[string]any{"ociVersion": "1.0.0", "root": map[string]any{"path": "rootfs"}})
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), config, 0o644); err != nil {
		t.Fatal(err)
	}
	state, _ := json.Marshal(map[string]any{"ociVersion": "1.0.0", "id": "c", "status": "creating", "pid": os.Getpid(), "bundle": bundle})
	stdin := filepath.Join(t.TempDir(), "state.json")
	if err := os.WriteFile(stdin, state, 0o644); err != nil {
		t.Fatal(err)
	}
	in, err := os.Open(stdin)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	saved := os.Stdin
	os.Stdin = in
	defer func() { os.Stdin = saved }()
	f()
}
