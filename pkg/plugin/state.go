package plugin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// DefaultStateFile is where the plugin keeps what pods hold, so that a
// restarted plugin knows it from a file only it writes. /run is emptied
// at boot, as are the pods.
const DefaultStateFile = "/run/nri-gpu/allocations.json"

// maxStateSize caps the state file read: far above what a node's pods
// hold (a few hundred bytes a pod).
const maxStateSize = 16 << 20

// errStateUntrusted is wrapped when the state file is not one only the
// plugin's user could have written.
var errStateUntrusted = errors.New("not trusted")

// ErrStateLocked is wrapped by New's error when another process holds
// the state file's lock: one nri-gpu per record.
var ErrStateLocked = errors.New("in use by another nri-gpu")

// ErrNotRecorded is wrapped by the error of a request whose grant could
// not be written to the state file: it is not given.
var ErrNotRecorded = errors.New("could not be recorded")

// lockWait is how long a starting plugin waits for the state file's lock
// (the nri-gpu it replaces may still be stopping) before it refuses.
var lockWait = 5 * time.Second

// saveStep, when set (tests), is called at each step of a save, with its
// name, so that a test can stop the process there.
var saveStep func(step string)

func step(name string) {
	if saveStep != nil {
		saveStep(name)
	}
}

// tempPrefix starts the names of the files a save of the state file at
// path writes before it renames one into place; those a killed save left
// are removed at start.
func tempPrefix(path string) string { return "." + filepath.Base(path) + ".tmp-" }

// stateFile keeps the allocations in a file, written whole and renamed
// into place, so that a reader sees the old state or the new one.
type stateFile struct {
	path string
	// readOnly files are read, never written (nri-gpu explain).
	readOnly bool

	mu   sync.Mutex
	last []byte // what was last written, so unchanged state is not
	// lock holds the lock file open (and locked) while the plugin runs.
	lock *os.File
}

// stateRecord is the file's content.
type stateRecord struct {
	Version int         `json:"version"`
	Pods    []podRecord `json:"pods"`
	// Claims are the DRA claims prepared on the node.
	Claims []claimRecord `json:"claims,omitempty"`
}

type claimRecord struct {
	UID       string              `json:"uid"`
	Namespace string              `json:"namespace"`
	Name      string              `json:"name"`
	Pods      []string            `json:"pods,omitempty"`
	Devices   []claimDeviceRecord `json:"devices"`
}

type claimDeviceRecord struct {
	deviceRecord
	Requests []string `json:"requests,omitempty"`
}

type podRecord struct {
	ID        string         `json:"id"`
	Namespace string         `json:"namespace"`
	Name      string         `json:"name"`
	Named     []deviceRecord `json:"named,omitempty"`
	Counted   []deviceRecord `json:"counted,omitempty"`
	// Kubelet names those of Named that kubelet allocated.
	Kubelet []string `json:"kubelet,omitempty"`
	// Sole names those of Named the pod holds alone: found in its
	// containers when no record had them.
	Sole []string `json:"sole,omitempty"`
}

type deviceRecord struct {
	Name  string   `json:"name"`
	Nodes []string `json:"nodes,omitempty"`
}

const stateVersion = 1

// save writes what held returns, unless it is what was last written.
// held is called under the file's lock, so that of two saves at once the
// later one writes the later state.
func (f *stateFile) save(held func() ([]policy.Holding, []policy.ClaimHolding)) error {
	if f.readOnly {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	rec := stateRecord{Version: stateVersion, Pods: []podRecord{}}
	pods, claims := held()
	for _, h := range pods {
		rec.Pods = append(rec.Pods, podRecord{
			ID: h.Pod.ID, Namespace: h.Pod.Namespace, Name: h.Pod.Name,
			Named: deviceRecords(h.Named), Counted: deviceRecords(h.Counted), Kubelet: h.Kubelet, Sole: h.Sole,
		})
	}
	for _, c := range claims {
		r := claimRecord{UID: c.Claim.UID, Namespace: c.Claim.Namespace, Name: c.Claim.Name, Pods: c.Claim.Pods}
		for _, d := range c.Devices {
			r.Devices = append(r.Devices, claimDeviceRecord{deviceRecord{Name: d.Name, Nodes: d.Nodes}, d.Requests})
		}
		rec.Claims = append(rec.Claims, r)
	}
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if bytes.Equal(data, f.last) {
		return nil
	}
	if err := writeAtomic(f.path, data); err != nil {
		return fmt.Errorf("state file %s: %w", f.path, err)
	}
	f.last = data
	return nil
}

// writeAtomic writes data to a new file beside path, flushed to disk, and
// renames it into place: a reader, or the plugin after a crash or a
// power loss at any step, finds the old content or the new, whole.
func writeAtomic(path string, data []byte) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	step("create")
	tmp, err := os.CreateTemp(dir, tempPrefix(path)+"*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // gone after the rename; removed if it failed
	step("write")
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	step("sync")
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	step("rename")
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	step("renamed")
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// acquire locks the state file for this process (a lock file beside it,
// holding the pid), waiting up to lockWait for another process to let it
// go; a lock whose process died is let go with it. It then removes what
// saves of an earlier process left half done.
func (f *stateFile) acquire() error {
	dir := filepath.Dir(f.path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("state file %s: %w", f.path, err)
	}
	name := f.path + ".lock"
	file, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("state file %s: lock: %w", f.path, err)
	}
	for deadline := time.Now().Add(lockWait); ; time.Sleep(100 * time.Millisecond) {
		err = unix.Flock(int(file.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if !errors.Is(err, unix.EWOULDBLOCK) || time.Now().After(deadline) {
			break
		}
	}
	if errors.Is(err, unix.EWOULDBLOCK) {
		holder, _ := io.ReadAll(io.LimitReader(file, 32))
		file.Close()
		pid := strings.TrimSpace(string(holder))
		if pid == "" {
			pid = "unknown"
		}
		return fmt.Errorf("state file %s: %w (pid %s holds %s): run one nri-gpu per state file, or give this one another --state-file", f.path, ErrStateLocked, pid, name)
	}
	if err == nil {
		err = file.Truncate(0)
	}
	if err == nil {
		_, err = file.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	if err != nil {
		file.Close()
		return fmt.Errorf("state file %s: lock: %w", f.path, err)
	}
	f.lock = file
	left, _ := filepath.Glob(filepath.Join(dir, tempPrefix(f.path)+"*"))
	for _, l := range left {
		_ = os.Remove(l)
	}
	return nil
}

// release lets the lock go.
func (f *stateFile) release() {
	if f.lock != nil {
		f.lock.Close()
		f.lock = nil
	}
}

// setAside renames an unusable state file (a file, a symlink, a
// directory) to a name of its own beside it, never over another, for the
// operator to look at, and returns that name.
func (f *stateFile) setAside() (string, error) {
	aside := fmt.Sprintf("%s.damaged-%s", f.path, time.Now().UTC().Format("20060102T150405.000000000Z"))
	if err := unix.Renameat2(unix.AT_FDCWD, f.path, unix.AT_FDCWD, aside, unix.RENAME_NOREPLACE); err != nil {
		return "", fmt.Errorf("state file %s: keeping it as %s: %w", f.path, aside, err)
	}
	return aside, nil
}

// load reads the holdings and claims saved. A missing file holds nothing. A file the
// plugin's user does not own, that others may write, that is not a
// regular file or is too big is not read (errStateUntrusted).
func (f *stateFile) load() ([]policy.Holding, []policy.ClaimHolding, error) {
	file, err := os.OpenFile(f.path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("state file %s: %w", f.path, err)
	}
	defer file.Close()
	var st syscall.Stat_t
	if err := syscall.Fstat(int(file.Fd()), &st); err != nil {
		return nil, nil, fmt.Errorf("state file %s: %w", f.path, err)
	}
	switch {
	case st.Mode&syscall.S_IFMT != syscall.S_IFREG:
		return nil, nil, fmt.Errorf("state file %s: %w: not a regular file", f.path, errStateUntrusted)
	case int(st.Uid) != os.Geteuid():
		return nil, nil, fmt.Errorf("state file %s: %w: owned by uid %d, not the plugin's %d", f.path, errStateUntrusted, st.Uid, os.Geteuid())
	case st.Mode&0o022 != 0:
		return nil, nil, fmt.Errorf("state file %s: %w: writable by group or others (mode %#o)", f.path, errStateUntrusted, st.Mode&0o777)
	case st.Size > maxStateSize:
		return nil, nil, fmt.Errorf("state file %s: %w: %d bytes, more than %d", f.path, errStateUntrusted, st.Size, maxStateSize)
	}
	data, err := io.ReadAll(io.LimitReader(file, maxStateSize))
	if err != nil {
		return nil, nil, fmt.Errorf("state file %s: %w", f.path, err)
	}
	var rec stateRecord
	if err := json.Unmarshal(data, &rec); err != nil {
		return nil, nil, fmt.Errorf("state file %s: %w", f.path, err)
	}
	if rec.Version != stateVersion {
		return nil, nil, fmt.Errorf("state file %s: version %d, want %d", f.path, rec.Version, stateVersion)
	}
	out := make([]policy.Holding, 0, len(rec.Pods))
	for _, r := range rec.Pods {
		out = append(out, policy.Holding{
			Pod:   policy.Pod{ID: r.ID, Namespace: r.Namespace, Name: r.Name},
			Named: devices(r.Named), Counted: devices(r.Counted), Kubelet: r.Kubelet, Sole: r.Sole,
		})
	}
	var claims []policy.ClaimHolding
	for _, r := range rec.Claims {
		c := policy.ClaimHolding{Claim: policy.Claim{UID: r.UID, Namespace: r.Namespace, Name: r.Name, Pods: r.Pods}}
		for _, d := range r.Devices {
			c.Devices = append(c.Devices, policy.ClaimDevice{Device: specs.Device{Name: d.Name, Nodes: d.Nodes}, Requests: d.Requests})
		}
		claims = append(claims, c)
	}
	return out, claims, nil
}

func deviceRecords(devs []specs.Device) []deviceRecord {
	var out []deviceRecord
	for _, d := range devs {
		out = append(out, deviceRecord{Name: d.Name, Nodes: d.Nodes})
	}
	return out
}

func devices(recs []deviceRecord) []specs.Device {
	var out []specs.Device
	for _, r := range recs {
		out = append(out, specs.Device{Name: r.Name, Nodes: r.Nodes})
	}
	return out
}

// InspectRecord reads the state file at path, never writing it, for
// nri-gpu check: the pods that hold devices found in their containers
// with no record of them ("namespace/name"), the unusable records set
// aside beside it, and why the file cannot be read back (nil when it can
// or there is none).
func InspectRecord(path string) (rebuilt, damaged []string, err error) {
	damaged, _ = filepath.Glob(path + ".damaged-*")
	pods, _, err := (&stateFile{path: path, readOnly: true}).load()
	for _, h := range pods {
		if len(h.Sole) > 0 {
			rebuilt = append(rebuilt, h.Pod.String())
		}
	}
	return rebuilt, damaged, err
}
