package specs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// ErrUntrusted is wrapped by the error for a device whose spec is not
// trusted.
var ErrUntrusted = errors.New("CDI spec not trusted")

// checkTrust says why a spec file is not to be trusted, or returns nil.
// A spec is trusted when neither the file nor its directory is writable
// by group or others, and both are owned by root or by this process's
// user: otherwise someone other than the node's administrator could make
// the plugin inject what they like.
func checkTrust(path string) error {
	return trusted(path, filepath.Dir(path))
}

// CheckDir says why a spec directory is not to be trusted (writable by
// group or others, or owned by another user than root or this process's),
// or returns nil: the specs in it would not be.
func CheckDir(dir string) error { return trusted(dir) }

// trusted checks each path as checkTrust describes.
func trusted(paths ...string) error {
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("%w: %s: %w", ErrUntrusted, p, err)
		}
		if mode := fi.Mode().Perm(); mode&0o022 != 0 {
			return fmt.Errorf("%w: %s is writable by group or others (mode %04o)", ErrUntrusted, p, mode)
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("%w: %s: no owner information", ErrUntrusted, p)
		}
		if uid := int(st.Uid); uid != 0 && uid != os.Geteuid() {
			return fmt.Errorf("%w: %s is owned by uid %d, neither root nor this plugin's user", ErrUntrusted, p, uid)
		}
	}
	return nil
}
