package specs

import (
	"errors"
	"fmt"
	"os"
)

// ErrUntrusted is wrapped by the error for a device whose spec is not
// trusted.
var ErrUntrusted = errors.New("CDI spec not trusted")

// CheckDir says why a spec directory is not to be trusted (writable by
// group or others, or owned by another user than root or this process's),
// or returns nil: the specs in it are not read. It judges the directory
// as loading does.
func CheckDir(dir string) error {
	d, err := openDir(dir)
	if err != nil {
		return err
	}
	return d.Close()
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
