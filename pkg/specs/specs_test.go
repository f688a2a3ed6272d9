package specs_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
	"github.com/nri-gpu/nri-gpu/test/harness"
)

func gpuSpec(env string) string {
	return `cdiVersion: "0.6.0"
kind: nvidia.com/gpu
devices:
  - name: "0"
    containerEdits:
      env: ["` + env + `"]
      deviceNodes: [{path: /dev/nvidia0, hostPath: /dev/null}]
`
}

func write(t testing.TB, dir, name, content string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func open(t *testing.T, dirs ...string) *specs.Registry {
	t.Helper()
	r, err := specs.Open(dirs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func TestResolve(t *testing.T) {
	low, high := filepath.Join(t.TempDir(), "etc"), filepath.Join(t.TempDir(), "run")
	write(t, low, "gpu.yaml", gpuSpec("FROM=etc"))
	write(t, high, "gpu.yaml", gpuSpec("FROM=run"))
	write(t, high, "broken.yaml", "cdiVersion: [\n")
	r := open(t, low, high)

	devs, err := r.Snapshot().Resolve([]string{"nvidia.com/gpu=0"})
	if err != nil {
		t.Fatal(err)
	}
	if got := devs[0].Device.ContainerEdits.Env; len(got) != 1 || got[0] != "FROM=run" {
		t.Errorf("env %v: the spec of the later directory must win", got)
	}

	_, err = r.Snapshot().Resolve([]string{"nvidia.com/gpu=0", "nvidia.com/gpu=9", "example.com/x=1"})
	if !errors.Is(err, specs.ErrUnresolvable) {
		t.Fatalf("error %v does not wrap ErrUnresolvable", err)
	}
	for _, want := range []string{`"nvidia.com/gpu=9"`, `"example.com/x=1"`, "no CDI spec in " + low + ", " + high, "broken.yaml"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if strings.Contains(err.Error(), `"nvidia.com/gpu=0"`) {
		t.Errorf("error %q names a device that resolved", err)
	}
}

func TestMissingDirIsNotABrokenSpec(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "absent")
	r := open(t, missing)
	_, err := r.Snapshot().Resolve([]string{"nvidia.com/gpu=0"})
	if err == nil || strings.Contains(err.Error(), "failed to load") {
		t.Errorf("error %v: a missing directory is no spec problem", err)
	}
}

func TestSpecChangesArePickedUp(t *testing.T) {
	dir := t.TempDir()
	r := open(t, dir)
	if _, err := r.Snapshot().Resolve([]string{"nvidia.com/gpu=0"}); err == nil {
		t.Fatal("resolved a device before any spec was written")
	}
	write(t, dir, "gpu.yaml", gpuSpec("A=1"))
	deadline := time.Now().Add(2 * time.Second)
	for {
		if _, err := r.Snapshot().Resolve([]string{"nvidia.com/gpu=0"}); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a new spec was not picked up within 2s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := os.Remove(filepath.Join(dir, "gpu.yaml")); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(2 * time.Second)
	for {
		if _, err := r.Snapshot().Resolve([]string{"nvidia.com/gpu=0"}); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a removed spec still resolved after 2s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestUntrustedSpecs(t *testing.T) {
	tests := []struct {
		name    string
		prepare func(t *testing.T, dir, file string)
		want    string
		notRead bool // the directory is not read: its devices are unknown
	}{
		{
			name:    "world-writable file",
			prepare: func(t *testing.T, _, file string) { chmod(t, file, 0o666) },
			want:    "is writable by group or others (mode 0666)",
		},
		{
			name:    "group-writable directory: not read at all",
			prepare: func(t *testing.T, dir, _ string) { chmod(t, dir, 0o775) },
			want:    "is writable by group or others (mode 0775)",
			notRead: true,
		},
		{
			name: "directory owned by another user: not read at all",
			prepare: func(t *testing.T, dir, _ string) {
				if os.Geteuid() != 0 {
					t.Skip("changing a directory's owner needs root")
				}
				if err := os.Chown(dir, 4242, 4242); err != nil {
					t.Fatal(err)
				}
			},
			want:    "is owned by uid 4242, neither root nor this plugin's user",
			notRead: true,
		},
		{
			name: "file owned by another user",
			prepare: func(t *testing.T, _, file string) {
				if os.Geteuid() != 0 {
					t.Skip("changing a file's owner needs root")
				}
				if err := os.Chown(file, 4242, 4242); err != nil {
					t.Fatal(err)
				}
			},
			want: "is owned by uid 4242, neither root nor this plugin's user",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "cdi")
			write(t, dir, "gpu.yaml", gpuSpec("A=1"))
			chmod(t, dir, 0o755)
			tc.prepare(t, dir, filepath.Join(dir, "gpu.yaml"))
			r := open(t, dir)
			_, err := r.Snapshot().Resolve([]string{"nvidia.com/gpu=0"})
			sentinel, problemAt := specs.ErrUntrusted, filepath.Join(dir, "gpu.yaml")
			if tc.notRead {
				sentinel, problemAt = specs.ErrUnresolvable, dir
			}
			if !errors.Is(err, sentinel) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), `device "nvidia.com/gpu=0"`) {
				t.Errorf("error %v, want one wrapping %v naming the device and saying %q", err, sentinel, tc.want)
			}
			if c := r.Snapshot().Candidates("nvidia.com/gpu"); len(c) != 0 {
				t.Errorf("candidates %v from an untrusted spec", c)
			}
			found := false
			for path, errs := range r.Snapshot().Problems {
				if path == problemAt && strings.Contains(errors.Join(errs...).Error(), tc.want) {
					found = true
				}
			}
			if !found {
				t.Errorf("Problems %v does not report the untrusted spec", r.Snapshot().Problems)
			}
		})
	}
}

func chmod(t *testing.T, path string, mode os.FileMode) {
	t.Helper()
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

func TestCandidates(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "gpu.yaml", `cdiVersion: "0.6.0"
kind: nvidia.com/gpu
devices:
  - name: "10"
    containerEdits: {deviceNodes: [{path: /dev/nvidia10, hostPath: /dev/null}]}
  - name: "2"
    containerEdits: {deviceNodes: [{path: /dev/nvidia2, hostPath: /dev/zero}]}
  - name: GPU-2
    containerEdits: {deviceNodes: [{path: /dev/nvidia2, hostPath: /dev/zero}]}
  - name: "3"
    containerEdits: {deviceNodes: [{path: /dev/full}]}
  - name: all
    containerEdits: {deviceNodes: [{path: /dev/nvidia2, hostPath: /dev/zero}, {path: /dev/nvidia10, hostPath: /dev/null}]}
`)
	write(t, dir, "nic.yaml", `cdiVersion: "0.6.0"
kind: example.com/nic
devices:
  - name: "0"
    containerEdits: {env: [A=1]}
`)
	var got []string
	for _, d := range open(t, dir).Snapshot().Candidates("nvidia.com/gpu") {
		got = append(got, d.Name+"@"+strings.Join(d.Nodes, ","))
	}
	want := []string{"nvidia.com/gpu=2@c 1:5", "nvidia.com/gpu=3@c 1:7", "nvidia.com/gpu=10@c 1:3", "nvidia.com/gpu=GPU-2@c 1:5"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("candidates %v, want %v (no all, numbers in numeric order, footprints by the host nodes' numbers, the path where no host path is given)", got, want)
	}
}

func TestSpecChurn(t *testing.T) {
	envOf := func(r *specs.Registry) string {
		e, err := r.Snapshot().Resolve([]string{"nvidia.com/gpu=0"})
		if err != nil {
			return ""
		}
		return e[0].Device.ContainerEdits.Env[0]
	}
	root := t.TempDir()
	dir := filepath.Join(root, "cdi")
	write(t, dir, "gpu.yaml", gpuSpec("V=1"))
	write(t, dir, "nic.yaml", `cdiVersion: "0.6.0"
kind: example.com/nic
devices: [{name: "0", containerEdits: {env: [NIC=0]}}]
`)
	r := open(t, dir)
	if got := envOf(r); got != "V=1" {
		t.Fatalf("env %q at start", got)
	}

	// Replaced by an atomic rename.
	write(t, root, "gpu.yaml.tmp", gpuSpec("V=2"))
	if err := os.Rename(filepath.Join(root, "gpu.yaml.tmp"), filepath.Join(dir, "gpu.yaml")); err != nil {
		t.Fatal(err)
	}
	testutil.Within(t, 2*time.Second, "a spec replaced by rename", func() bool { return envOf(r) == "V=2" })

	// Edited in place.
	write(t, dir, "gpu.yaml", gpuSpec("V=3"))
	testutil.Within(t, 2*time.Second, "a spec edited in place", func() bool { return envOf(r) == "V=3" })

	// Broken: logged by file name with the parse error; others unaffected.
	write(t, dir, "gpu.yaml", "cdiVersion: [\n")
	testutil.Within(t, 2*time.Second, "a broken spec", func() bool { return envOf(r) == "" })
	if _, err := r.Snapshot().Resolve([]string{"example.com/nic=0"}); err != nil {
		t.Errorf("a broken spec affected another: %v", err)
	}
	if errs := r.Snapshot().Problems[filepath.Join(dir, "gpu.yaml")]; len(errs) == 0 {
		t.Errorf("the broken spec is not reported by file name: %v", r.Snapshot().Problems)
	}

	// Removed.
	write(t, dir, "gpu.yaml", gpuSpec("V=4"))
	testutil.Within(t, 2*time.Second, "a spec mended", func() bool { return envOf(r) == "V=4" })
	if err := os.Remove(filepath.Join(dir, "gpu.yaml")); err != nil {
		t.Fatal(err)
	}
	testutil.Within(t, 2*time.Second, "a spec removed", func() bool { return envOf(r) == "" })

	// The directory deleted and created again.
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	testutil.Within(t, 2*time.Second, "a spec dir deleted", func() bool {
		_, err := r.Snapshot().Resolve([]string{"example.com/nic=0"})
		return err != nil
	})
	write(t, dir, "gpu.yaml", gpuSpec("V=5"))
	testutil.Within(t, 2*time.Second, "a spec dir created again", func() bool { return envOf(r) == "V=5" })
	write(t, dir, "gpu.yaml", gpuSpec("V=6"))
	testutil.Within(t, 2*time.Second, "a change in the recreated dir", func() bool { return envOf(r) == "V=6" })
}

// BenchmarkLoad measures a full load of the spec dirs (what every refresh
// does) with 10, 100 and 1000 spec files.
func BenchmarkLoad(b *testing.B) {
	for _, n := range []int{10, 100, 1000} {
		dir := b.TempDir()
		if err := harness.WriteBenchSpecs(dir, n); err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("specs=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				r, err := specs.Open([]string{dir})
				if err != nil {
					b.Fatal(err)
				}
				if got := len(r.Snapshot().Entries()); got != n-1+64 {
					b.Fatalf("%d devices, want %d", got, n)
				}
				r.Close()
			}
		})
	}
}

// TestSpecDirNotADirectory: a spec "directory" that is a file is reported
// as a problem (and with CheckDir), and its neighbours are still read.
func TestSpecDirNotADirectory(t *testing.T) {
	root := t.TempDir()
	file := filepath.Join(root, "not-a-dir")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "cdi")
	write(t, dir, "gpu.yaml", gpuSpec("A=1"))
	chmod(t, dir, 0o755)
	r := open(t, file, dir)
	if _, err := r.Snapshot().Resolve([]string{"nvidia.com/gpu=0"}); err != nil {
		t.Errorf("the spec beside a bad directory: %v", err)
	}
	if errs := r.Snapshot().Problems[file]; len(errs) == 0 || !strings.Contains(errors.Join(errs...).Error(), "not a directory") {
		t.Errorf("Problems %v does not report %s", r.Snapshot().Problems, file)
	}
	if err := specs.CheckDir(file); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("CheckDir(%s) = %v", file, err)
	}
	if err := specs.CheckDir(dir); err != nil {
		t.Errorf("CheckDir(%s) = %v", dir, err)
	}
}
