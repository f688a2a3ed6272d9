package dra

import (
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"path/filepath"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
)

// unixPathMax is the longest path a unix socket is bound at and
// connected to (sun_path, which Linux takes without its NUL when full);
// the kubelet-plugin helper's own bound.
const unixPathMax = 108

// ErrSocketPath is wrapped by the error of a driver whose sockets do not
// fit a unix socket's path under kubelet's directories, however named.
var ErrSocketPath = errors.New("kubelet's directory is too long for a unix socket in it")

// Sockets are where the driver's two sockets go: its registration socket
// in kubelet's registry directory, its DRA service's in its own plugin
// directory, under names whose paths fit a unix socket's.
type Sockets struct {
	// Registrar and Plugin are the sockets' paths.
	Registrar, Plugin string
	// RollingUpdate says they are a rolling update's: named for the pod,
	// so that two instances serve at once.
	RollingUpdate bool
	// Why says why a rolling update's names did not fit, when the
	// driver registers without it.
	Why string
}

// socketsOf returns the sockets of the driver named driver, its plugin
// data in pluginDir and its registration in registryDir, for a rolling
// update as the pod uid when uid is set. The helper's own names come
// first ("<driver>-<uid>-reg.sock", or shorter; "dra-<uid>.sock"); where
// the DRA service's is too long, a shorter one of the pod ("dra-<hash of
// the uid>.sock"); where a rolling update's do not fit at all, the
// rolling update is left out (Why says so) for the plain names
// ("<driver>-reg.sock", "dra.sock"); where these do not fit either,
// ErrSocketPath names the path and its length.
func socketsOf(driver, pluginDir, registryDir string, uid types.UID) (Sockets, error) {
	plain := Sockets{Registrar: filepath.Join(registryDir, driver+"-reg.sock"), Plugin: filepath.Join(pluginDir, "dra.sock")}
	if uid != "" {
		s := Sockets{RollingUpdate: true, Registrar: filepath.Join(registryDir, kubeletplugin.RollingUpdateRegistrarSocketFile(registryDir, driver, uid))}
		for _, name := range []string{"dra-" + string(uid) + ".sock", "dra-" + shortOf(uid) + ".sock"} {
			if s.Plugin = filepath.Join(pluginDir, name); len(s.Plugin) <= unixPathMax {
				break
			}
		}
		long := tooLong(s.Registrar, s.Plugin)
		if long == "" {
			return s, nil
		}
		plain.Why = fmt.Sprintf("the rolling update's socket %s is %d bytes long, more than a unix socket's %d", long, len(long), unixPathMax)
	}
	if long := tooLong(plain.Registrar, plain.Plugin); long != "" {
		return Sockets{}, fmt.Errorf("%w: %s is %d bytes long, more than %d", ErrSocketPath, long, len(long), unixPathMax)
	}
	return plain, nil
}

// tooLong returns the first of paths too long for a unix socket, or "".
func tooLong(paths ...string) string {
	for _, p := range paths {
		if len(p) > unixPathMax {
			return p
		}
	}
	return ""
}

// shortOf is a short name of a pod UID, unique on a node: 11 characters
// of its SHA-256 digest, as the helper shortens a registration socket.
func shortOf(uid types.UID) string {
	sum := sha256.Sum256([]byte(uid))
	return base64.RawURLEncoding.EncodeToString(sum[:8])
}

// options are the helper's options that put the sockets where s says.
func (s Sockets) options(uid types.UID) []kubeletplugin.Option {
	opts := []kubeletplugin.Option{
		kubeletplugin.PluginDataDirectoryPath(filepath.Dir(s.Plugin)),
		kubeletplugin.PluginSocket(filepath.Base(s.Plugin)),
		kubeletplugin.RegistrarDirectoryPath(filepath.Dir(s.Registrar)),
	}
	if !s.RollingUpdate {
		return append(opts, kubeletplugin.RegistrarSocketFilename(filepath.Base(s.Registrar)))
	}
	// Both instances keep no state between calls: what is held is the
	// pool's, in the one nri-gpu that holds the record (the new
	// instance's calls wait until its nri-gpu has taken over). The pool
	// serializes its changes, so the helper's file lock across instances
	// is not taken: a call of the new instance waiting for the take-over
	// does not hold up the old one's.
	return append(opts, kubeletplugin.RollingUpdate(uid), kubeletplugin.Serialize(false))
}
