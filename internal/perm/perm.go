// Package perm makes the directories and sockets nri-gpu serves from with
// the modes it means, whatever the process's umask: the umask takes bits
// from what the kernel creates (a unix socket, asked for none, is 0777
// under umask 0; a directory asked 0711 is 0700 under umask 077), and a
// directory that already exists keeps its own mode.
package perm

import (
	"net"
	"os"
	"path/filepath"
)

// MkdirAll makes dir and its missing parents, as os.MkdirAll does, and
// gives dir, and each parent it made, mode.
func MkdirAll(dir string, mode os.FileMode) error {
	made := []string{dir}
	for d := filepath.Dir(filepath.Clean(dir)); d != filepath.Dir(d); d = filepath.Dir(d) {
		if _, err := os.Lstat(d); err == nil {
			break
		}
		made = append(made, d)
	}
	if err := os.MkdirAll(dir, mode); err != nil {
		return err
	}
	for _, d := range made {
		if err := os.Chmod(d, mode); err != nil {
			return err
		}
	}
	return nil
}

// ListenUnix listens on a unix socket at path that only its owner may
// connect to (0600); the socket is closed again where its mode cannot be
// set.
func ListenUnix(path string) (net.Listener, error) {
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}
