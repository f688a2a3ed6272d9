package specs

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// ErrUntrusted is wrapped by the error for a device whose spec is not
// trusted.
var ErrUntrusted = errors.New("CDI spec not trusted")

// CheckDir says why a spec directory is not to be trusted (writable by
// group or others, or owned by another user than root or this process's),
// or returns nil: the specs in it are not read.
func CheckDir(dir string) error { return trusted(dir) }

// trusted checks each path as CheckDir describes.
func trusted(paths ...string) error {
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("%w: %s: %w", ErrUntrusted, p, err)
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("%w: %s: no owner information", ErrUntrusted, p)
		}
		if err := ownerAndMode(p, st.Uid, fi.Mode().Perm()); err != nil {
			return err
		}
	}
	return nil
}

// ownerAndMode says why a file or directory of this owner and mode is not
// to be trusted: writable by group or others, or owned by a user other
// than root or this process's, someone other than the node's
// administrator could make the plugin inject what they like.
func ownerAndMode(path string, uid uint32, mode os.FileMode) error {
	if mode&0o022 != 0 {
		return fmt.Errorf("%w: %s is writable by group or others (mode %04o)", ErrUntrusted, path, mode)
	}
	if uid != 0 && int(uid) != os.Geteuid() {
		return fmt.Errorf("%w: %s is owned by uid %d, neither root nor this plugin's user", ErrUntrusted, path, uid)
	}
	return nil
}
