package perm_test

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/nri-gpu/nri-gpu/internal/perm"
	"github.com/nri-gpu/nri-gpu/internal/testutil"
)

// TestModesWhateverTheUmask: under umask 0 and umask 077, a directory
// made (and each parent made for it), or found with another mode, has
// the mode asked, and a socket only its owner may connect to.
func TestModesWhateverTheUmask(t *testing.T) {
	for _, umask := range []int{0, 0o077} {
		old := syscall.Umask(umask)
		t.Cleanup(func() { syscall.Umask(old) })
		root := testutil.ShortDir(t)
		made := filepath.Join(root, "a", "made")
		found := filepath.Join(root, "found")
		if err := os.Mkdir(found, 0o777); err != nil {
			t.Fatal(err)
		}
		if err := perm.MkdirAll(made, 0o711); err != nil {
			t.Fatal(err)
		}
		if err := perm.MkdirAll(found, 0o700); err != nil {
			t.Fatal(err)
		}
		for _, d := range []struct {
			dir  string
			mode os.FileMode
		}{{made, 0o711}, {filepath.Dir(made), 0o711}, {found, 0o700}} {
			if fi, err := os.Stat(d.dir); err != nil || fi.Mode().Perm() != d.mode {
				t.Errorf("umask %#o: %s: %v, %v; want %v", umask, d.dir, fi.Mode(), err, d.mode)
			}
		}
		sock := filepath.Join(made, "s.sock")
		l, err := perm.ListenUnix(sock)
		if err != nil {
			t.Fatal(err)
		}
		if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("umask %#o: socket %v, %v; want 0600", umask, fi.Mode(), err)
		}
		l.Close()
		syscall.Umask(old)
	}
}

// TestListenUnixFails: a path where no socket can be made is an error.
func TestListenUnixFails(t *testing.T) {
	if _, err := perm.ListenUnix(filepath.Join(t.TempDir(), "missing", "s.sock")); err == nil {
		t.Error("a socket in a missing directory: no error")
	}
}
