package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestInstall: nri-gpu install DIR puts a copy of the running executable
// at DIR/nri-gpu, executable by all, replacing one there whole (renamed
// over it, so a hook running the old file is not disturbed) and leaving
// no temporary file; a relative or missing DIR is a usage error.
func TestInstall(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "opt", "nri-gpu", "bin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	old := filepath.Join(dir, "nri-gpu")
	if err := os.WriteFile(old, []byte("an older nri-gpu"), 0o700); err != nil {
		t.Fatal(err)
	}
	running, err := os.Open(old) // a hook running the old one
	if err != nil {
		t.Fatal(err)
	}
	defer running.Close()

	for _, tc := range []struct {
		name string
		args []string
		code int
	}{
		{"installed", []string{dir}, exitOK},
		{"installed again", []string{dir}, exitOK},
		{"relative", []string{"opt/nri-gpu/bin"}, exitUsage},
		{"no directory", nil, exitUsage},
		{"two", []string{dir, dir}, exitUsage},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := runInstall(tc.args, &stdout, &stderr); code != tc.code {
				t.Fatalf("exit %d, want %d: %s", code, tc.code, stderr.String())
			}
			if tc.code != exitOK {
				if !strings.Contains(stderr.String(), "usage: nri-gpu install DIR") {
					t.Errorf("stderr %q, want the usage", stderr.String())
				}
				return
			}
			got, err := os.ReadFile(old)
			if err != nil || !bytes.Equal(got, want) {
				t.Errorf("%s is not a copy of nri-gpu (%d bytes, %v)", old, len(got), err)
			}
			if fi, err := os.Stat(old); err != nil || fi.Mode().Perm() != 0o755 {
				t.Errorf("%s: mode %v (%v), want 0755", old, fi.Mode(), err)
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 1 {
				t.Errorf("%d files in %s, want only nri-gpu", len(entries), dir)
			}
		})
	}
	kept := make([]byte, 64)
	n, _ := running.ReadAt(kept, 0)
	if string(kept[:n]) != "an older nri-gpu" {
		t.Errorf("the file a running hook has open was changed: %q", kept[:n])
	}
}
