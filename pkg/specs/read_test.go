package specs_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// TestHostileSpecFiles puts what a writer of a spec dir could put there
// beside a good spec: loading finishes, the good spec is used, and each
// file is reported, not read or not trusted, for the reason given.
func TestHostileSpecFiles(t *testing.T) {
	tests := []struct {
		name    string
		prepare func(t *testing.T, dir, path string)
		want    string
		usable  bool // the device of the file is usable after all
	}{
		{
			name: "a FIFO",
			prepare: func(t *testing.T, _, path string) {
				if err := syscall.Mkfifo(path, 0o644); err != nil {
					t.Fatal(err)
				}
			},
			want: "is not a regular file",
		},
		{
			name:    "a symlink to an endless device",
			prepare: func(t *testing.T, _, path string) { symlink(t, "/dev/zero", path) },
			want:    "/dev/zero is not a regular file",
		},
		{
			name: "a symlink to a spec in a directory others may write",
			prepare: func(t *testing.T, _, path string) {
				other := filepath.Join(t.TempDir(), "open")
				write(t, other, "x.yaml", otherSpec)
				chmod(t, other, 0o777)
				symlink(t, filepath.Join(other, "x.yaml"), path)
			},
			want: "is writable by group or others (mode 0777)",
		},
		{
			name: "a symlink to a spec in a trusted directory",
			prepare: func(t *testing.T, _, path string) {
				other := filepath.Join(t.TempDir(), "vendor")
				write(t, other, "x.yaml", otherSpec)
				symlink(t, filepath.Join(other, "x.yaml"), path)
			},
			usable: true,
		},
		{
			name: "a file over the size limit",
			prepare: func(t *testing.T, _, path string) {
				write(t, filepath.Dir(path), filepath.Base(path), otherSpec)
				if err := os.Truncate(path, 9<<20); err != nil {
					t.Fatal(err)
				}
			},
			want: "more than 8388608",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "cdi")
			write(t, dir, "gpu.yaml", gpuSpec("A=1"))
			path := filepath.Join(dir, "x.yaml")
			tc.prepare(t, dir, path)

			done := make(chan *specs.Snapshot)
			go func() {
				snap, _ := specs.Load([]string{dir})
				done <- snap
			}()
			var snap *specs.Snapshot
			select {
			case snap = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("loading the specs did not finish")
			}
			if _, err := snap.Lookup("nvidia.com/gpu=0"); err != nil {
				t.Errorf("the good spec beside it: %v", err)
			}
			_, err := snap.Lookup("example.com/x=a")
			if tc.usable {
				if err != nil {
					t.Errorf("its device: %v", err)
				}
				return
			}
			if err == nil {
				t.Error("its device resolved")
			}
			if got := errors.Join(snap.Problems[path]...); got == nil || !strings.Contains(got.Error(), tc.want) {
				t.Errorf("problems of %s: %v, want one saying %q", path, got, tc.want)
			}
		})
	}
}

const otherSpec = `cdiVersion: "0.6.0"
kind: example.com/x
devices:
  - name: a
    containerEdits: {env: [X=1]}
`

func symlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

// TestTrustedIsWhatWasRead swaps a trusted and an untrusted spec for one
// device under one name while specs load: a device whose spec is trusted
// always has the trusted spec's content.
func TestTrustedIsWhatWasRead(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cdi")
	write(t, dir, "good", gpuSpec("FROM=trusted"))
	write(t, dir, "bad", gpuSpec("FROM=untrusted"))
	chmod(t, filepath.Join(dir, "bad"), 0o666)
	var (
		stop atomic.Bool
		wg   sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; !stop.Load(); i++ {
			src := []string{"good", "bad"}[i%2]
			// A hard link renamed into place: gpu.yaml is always one of
			// the two files, with that file's mode.
			tmp := filepath.Join(dir, ".tmp")
			_ = os.Remove(tmp)
			if err := os.Link(filepath.Join(dir, src), tmp); err != nil {
				t.Error(err)
				return
			}
			if err := os.Rename(tmp, filepath.Join(dir, "gpu.yaml")); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	defer wg.Wait()
	defer stop.Store(true)
	trusted, untrusted := 0, 0
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); {
		snap, err := specs.Load([]string{dir})
		if err != nil {
			t.Fatal(err)
		}
		e, err := snap.Lookup("nvidia.com/gpu=0")
		switch {
		case err == nil:
			trusted++
			if !slices.Contains(e.Device.ContainerEdits.Env, "FROM=trusted") {
				t.Fatalf("a trusted device with the untrusted spec's content: env %v", e.Device.ContainerEdits.Env)
			}
		case errors.Is(err, specs.ErrUntrusted):
			untrusted++
		}
	}
	t.Logf("%d loads found the trusted spec, %d the untrusted one", trusted, untrusted)
}

// TestSpecDirThroughSymlink: a configured spec dir that is a symlink is
// judged by the directory it leads to, on the descriptor read from.
func TestSpecDirThroughSymlink(t *testing.T) {
	for _, tc := range []struct {
		name string
		mode os.FileMode
		want string // a problem of the link; "" when its spec is used
	}{
		{name: "to a trusted dir", mode: 0o755},
		{name: "to a dir others may write", mode: 0o777, want: "not read: CDI spec not trusted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			real := filepath.Join(t.TempDir(), "real")
			write(t, real, "gpu.yaml", gpuSpec("A=1"))
			chmod(t, real, tc.mode)
			link := filepath.Join(t.TempDir(), "cdi")
			symlink(t, real, link)
			snap, err := specs.Load([]string{link})
			if err != nil {
				t.Fatal(err)
			}
			_, err = snap.Lookup("nvidia.com/gpu=0")
			if tc.want == "" {
				if err != nil {
					t.Errorf("the spec of a trusted dir through a symlink: %v", err)
				}
				return
			}
			if err == nil {
				t.Error("a device of a dir others may write resolved")
			}
			if got := errors.Join(snap.Problems[link]...); got == nil || !strings.Contains(got.Error(), tc.want) {
				t.Errorf("problems of %s: %v, want one saying %q", link, got, tc.want)
			}
		})
	}
}

// TestConflictingSpecs: two specs of one directory defining one device
// make it unusable, and both are reported, as CDI's cache does; an
// earlier directory's definition does not stand in for it.
func TestConflictingSpecs(t *testing.T) {
	low, high := filepath.Join(t.TempDir(), "etc"), filepath.Join(t.TempDir(), "run")
	write(t, low, "a.yaml", gpuSpec("FROM=low"))
	write(t, high, "a.yaml", gpuSpec("FROM=a"))
	write(t, high, "b.yaml", gpuSpec("FROM=b"))
	snap, err := specs.Load([]string{low, high})
	if err != nil {
		t.Fatal(err)
	}
	if e, err := snap.Lookup("nvidia.com/gpu=0"); err == nil {
		t.Errorf("a device two specs of one dir define resolved, env %v", e.Device.ContainerEdits.Env)
	}
	for _, f := range []string{"a.yaml", "b.yaml"} {
		path := filepath.Join(high, f)
		if got := errors.Join(snap.Problems[path]...); got == nil || !strings.Contains(got.Error(), `conflicting device "nvidia.com/gpu=0"`) {
			t.Errorf("problems of %s: %v, want the conflict", path, got)
		}
	}
}
