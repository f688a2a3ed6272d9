// Package record keeps what nri-gpu's pods and DRA claims hold in a file
// only nri-gpu writes, so that a restarted nri-gpu learns it again: saved
// whole, flushed and renamed into place (a reader finds the old record or
// the new one), read back only when it is a regular file nri-gpu's user
// owns and no one else may write, locked for one nri-gpu at a time, and
// set aside for the operator when it cannot be read back. It decides
// nothing: pkg/policy's pool is what it keeps.
package record

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nri-gpu/nri-gpu/internal/perm"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/mps"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// DefaultPath is where nri-gpu keeps what pods hold (its --state-file).
// /run is emptied at boot, as are the pods.
const DefaultPath = "/run/nri-gpu/allocations.json"

// maxStateSize caps the state file read: far above what a node's pods
// hold (a few hundred bytes a pod).
const maxStateSize = 16 << 20

// ErrUntrusted is wrapped by Load's error for a file that is not one
// only nri-gpu's user could have written.
var ErrUntrusted = errors.New("not trusted")

// ErrLocked is wrapped by Lock's error when another process holds the
// file's lock: one nri-gpu per record.
var ErrLocked = errors.New("in use by another nri-gpu")

// ErrNewer is wrapped by Load's error for a record written by a newer
// nri-gpu, in a format this one does not read.
var ErrNewer = errors.New("written by a newer nri-gpu")

// lockWait is how long Lock waits for another process to let the lock go
// (the nri-gpu it replaces may still be stopping) before it refuses. A
// variable for the package's tests alone.
var lockWait = 5 * time.Second

// tempPrefix starts the names of the files a save of the state file at
// path writes before it renames one into place; those a killed save left
// are removed at start.
func tempPrefix(path string) string { return "." + filepath.Base(path) + ".tmp-" }

// File is the record at one path.
type File struct {
	path string
	// boot is the kernel's ID of the boot this process runs in ("" when
	// it cannot tell): a record kept in another boot holds nothing.
	boot string
	// readOnly files are read, never written (nri-gpu explain).
	readOnly bool
	// step, when set (the package's own tests), is called at each step
	// of a save with its name, so that a test can kill the process there.
	step func(name string)

	mu   sync.Mutex
	last []byte // what was last written, so unchanged state is not
	// lock holds the state directory open (and locked) while the plugin
	// runs; givenUp says it was let go, and the record is no longer
	// this process's to write.
	lock    *os.File
	givenUp bool
}

// Open returns the record at path, for reading and writing.
func Open(path string) *File { return &File{path: path, boot: bootID()} }

// OpenReadOnly returns the record at path, which Save then never writes
// (for nri-gpu explain and devices, beside the running plugin).
func OpenReadOnly(path string) *File {
	return &File{path: path, readOnly: true, boot: bootID()}
}

// bootIDPath is where the kernel says which boot this is: a random ID
// made anew at each boot.
const bootIDPath = "/proc/sys/kernel/random/boot_id"

func bootID() string {
	b, err := os.ReadFile(bootIDPath)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// Path is where the record is kept.
func (f *File) Path() string { return f.path }

// ReadOnly reports whether the record is only read.
func (f *File) ReadOnly() bool { return f.readOnly }

// Content is what the record keeps: the pods' holdings, the prepared
// DRA claims, and the MPS daemons nri-gpu starts, runs or stops (with
// the compute modes it set), kept before it acts.
type Content struct {
	Pods    []policy.Holding
	Claims  []policy.ClaimHolding
	Daemons []mps.Entry
	// EarlierBoot is the boot ID of the record Load read, when it was
	// kept before the node last booted: the containers and prepared
	// devices it listed went with that boot, and it holds nothing.
	EarlierBoot string
}

func (f *File) mark(name string) {
	if f.step != nil {
		f.step(name)
	}
}

// stateRecord is the file's content.
type stateRecord struct {
	Version int `json:"version"`
	// Boot is the kernel's boot ID when the record was kept; none in
	// records of nri-gpu before it, and where the kernel does not tell.
	Boot string      `json:"bootId,omitempty"`
	Pods []podRecord `json:"pods"`
	// Claims are the DRA claims prepared on the node.
	Claims []claimRecord `json:"claims,omitempty"`
	// Daemons are the MPS daemons nri-gpu started or is starting or
	// stopping, each with the compute mode its GPU was in.
	Daemons []mps.Entry `json:"mpsDaemons,omitempty"`
}

type claimRecord struct {
	UID       string              `json:"uid"`
	Namespace string              `json:"namespace"`
	Name      string              `json:"name"`
	Pods      []policy.PodName    `json:"pods,omitempty"`
	Devices   []claimDeviceRecord `json:"devices"`
}

type claimDeviceRecord struct {
	deviceRecord
	Requests []string `json:"requests,omitempty"`
	// Shares and Memory are what the claim was allocated of a device
	// shared by consumable capacity; none: one share and the default.
	Shares int   `json:"shares,omitempty"`
	Memory int64 `json:"memory,omitempty"`
	// Asked is what the claim asked of the device's sharing (GpuConfig):
	// a strategy, and bounds of its MPS clients.
	Asked *askedRecord `json:"asked,omitempty"`
}

type askedRecord struct {
	Strategy               config.Strategy `json:"strategy,omitempty"`
	ActiveThreadPercentage int             `json:"activeThreadPercentage,omitempty"`
	PinnedMemory           int64           `json:"pinnedMemory,omitempty"`
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
	// Claims are the UIDs of the prepared claims the pod's containers
	// used.
	Claims []string `json:"claims,omitempty"`
}

type deviceRecord struct {
	Name  string   `json:"name"`
	Nodes []string `json:"nodes,omitempty"`
	// Parts are those of Nodes that narrow the device to a part of its
	// GPU (a MIG device's); a record without them (older) holds the
	// device whole, which overlaps more, never less.
	Parts []string `json:"parts,omitempty"`
}

func recordOf(d specs.Device) deviceRecord {
	return deviceRecord{Name: d.Name, Nodes: d.Nodes, Parts: d.Parts}
}

// device is the device of a record: parts that are not among its nodes
// are none.
func (r deviceRecord) device() specs.Device {
	d := specs.Device{Name: r.Name, Nodes: r.Nodes}
	for _, n := range r.Parts {
		if slices.Contains(r.Nodes, n) {
			d.Parts = append(d.Parts, n)
		}
	}
	return d
}

// stateVersion is the record's format: the one this nri-gpu writes and
// the newest it reads. It goes up only when a reader of the format before
// would misjudge what a record holds; a key such a reader may ignore
// (bootId, a claim's asked bounds, a device's parts) is added within it.
// testdata/formats keeps a record of every format nri-gpu has written,
// and the tests read each.
const stateVersion = 1

// Save writes what held returns, unless it is what was last written; a
// read-only record is never written, nor one whose lock this process
// let go (ErrGivenUp). held is called under the file's
// lock, so that of two saves at once the later one writes the later
// state.
func (f *File) Save(held func() Content) error {
	if f.readOnly {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.givenUp {
		return fmt.Errorf("state file %s: %w", f.path, ErrGivenUp)
	}
	rec := stateRecord{Version: stateVersion, Boot: f.boot, Pods: []podRecord{}}
	c := held()
	for _, h := range c.Pods {
		rec.Pods = append(rec.Pods, podRecord{
			ID: h.Pod.ID, Namespace: h.Pod.Namespace, Name: h.Pod.Name,
			Named: deviceRecords(h.Named), Counted: deviceRecords(h.Counted), Kubelet: h.Kubelet, Sole: h.Sole, Claims: h.Claims,
		})
	}
	for _, c := range c.Claims {
		r := claimRecord{UID: c.Claim.UID, Namespace: c.Claim.Namespace, Name: c.Claim.Name, Pods: c.Claim.Pods}
		for _, d := range c.Devices {
			dr := claimDeviceRecord{deviceRecord: recordOf(d.Device), Requests: d.Requests, Shares: d.Use.Shares, Memory: d.Use.Memory}
			if d.GpuConfig != (policy.GpuConfig{}) {
				dr.Asked = &askedRecord{Strategy: d.GpuConfig.Strategy, ActiveThreadPercentage: d.GpuConfig.ActiveThreadPercentage, PinnedMemory: d.GpuConfig.PinnedMemory}
			}
			r.Devices = append(r.Devices, dr)
		}
		rec.Claims = append(rec.Claims, r)
	}
	rec.Daemons = c.Daemons
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if bytes.Equal(data, f.last) {
		return nil
	}
	if err := f.writeAtomic(data); err != nil {
		return fmt.Errorf("state file %s: %w", f.path, err)
	}
	f.last = data
	return nil
}

// writeAtomic writes data to a new file beside path, flushed to disk, and
// renames it into place: a reader, or the plugin after a crash or a
// power loss at any step, finds the old content or the new, whole.
func (f *File) writeAtomic(data []byte) error {
	path := f.path
	dir := filepath.Dir(path)
	if err := perm.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	f.mark("create")
	tmp, err := os.CreateTemp(dir, tempPrefix(path)+"*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // gone after the rename; removed if it failed
	f.mark("write")
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	f.mark("sync")
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	f.mark("rename")
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	f.mark("renamed")
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Lock locks the record for this process, waiting up to lockWait for
// another process to let it go; a lock whose process died is let go with
// it. It then removes what saves of an earlier process left half done.
//
// The lock is the state directory's (flock on the directory): a
// directory cannot be removed while it holds the record, where a lock
// file could be, and a second nri-gpu would then lock a new one and run
// on the same record. A file beside the record (PATH.lock) holds the
// holder's pid, for the message that refuses a second; a lock path that
// is not a regular file of one link (a hard link to another file, which
// writing the pid would truncate) is refused.
func (f *File) Lock() error {
	return f.lockWith(func(fd int, _ func() string) error {
		for deadline := time.Now().Add(lockWait); ; time.Sleep(100 * time.Millisecond) {
			err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
			if !errors.Is(err, unix.EWOULDBLOCK) || time.Now().After(deadline) {
				return err
			}
		}
	})
}

// TakeOver locks the record as Lock does, but waits for as long as
// another process holds it, until ctx is done: the nri-gpu it replaces
// (a rolling update with surge) serves until it stops, and lets the lock
// go only once it no longer serves. waiting is called, with the holder's
// pid, when it has to wait.
func (f *File) TakeOver(ctx context.Context, waiting func(holder string)) error {
	return f.lockWith(func(fd int, holder func() string) error {
		err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		if !errors.Is(err, unix.EWOULDBLOCK) {
			return err
		}
		waiting(holder())
		got := make(chan error, 1)
		go func() {
			// Woken the moment the holder lets go (or dies). Left
			// waiting when ctx ends first: its descriptor is then
			// closed, and a lock it gets is let go with it.
			for {
				err := unix.Flock(fd, unix.LOCK_EX)
				if !errors.Is(err, unix.EINTR) {
					got <- err
					return
				}
			}
		}()
		select {
		case err := <-got:
			return err
		case <-ctx.Done():
			return fmt.Errorf("waiting to take it over: %w", ctx.Err())
		}
	})
}

// lockWith opens the state directory and the lock path, locks the
// directory with acquire (given its descriptor, and what tells the
// holder's pid), writes this process's pid and removes what saves of an
// earlier process left half done.
func (f *File) lockWith(acquire func(fd int, holder func() string) error) error {
	dir := filepath.Dir(f.path)
	if err := perm.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("state file %s: %w", f.path, err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("state file %s: lock: %w", f.path, err)
	}
	name := f.path + ".lock"
	pidFile, err := openPidFile(name)
	if err != nil {
		d.Close()
		return fmt.Errorf("state file %s: lock: %w", f.path, err)
	}
	defer pidFile.Close()
	holder := func() string {
		b, _ := io.ReadAll(io.LimitReader(io.NewSectionReader(pidFile, 0, 32), 32))
		if pid := strings.TrimSpace(string(b)); pid != "" {
			return pid
		}
		return "unknown"
	}
	err = acquire(int(d.Fd()), holder)
	if errors.Is(err, unix.EWOULDBLOCK) {
		d.Close()
		return fmt.Errorf("state file %s: %w (pid %s holds %s): run one nri-gpu per state directory, or give this one a --state-file in another directory", f.path, ErrLocked, holder(), name)
	}
	if err == nil {
		err = pidFile.Truncate(0)
	}
	if err == nil {
		_, err = pidFile.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	if err != nil {
		d.Close()
		return fmt.Errorf("state file %s: lock: %w", f.path, err)
	}
	f.mu.Lock()
	f.lock, f.givenUp = d, false
	f.mu.Unlock()
	left, _ := filepath.Glob(filepath.Join(dir, tempPrefix(f.path)+"*"))
	for _, l := range left {
		_ = os.Remove(l)
	}
	return nil
}

// ErrLockFile is wrapped by Lock's error when the lock path is not a
// regular file of one link.
var ErrLockFile = errors.New("not a regular file of one link")

// openPidFile opens (or makes) the file at the lock path, refusing one
// that is not a regular file of one link: never follows a symbolic
// link, never blocks on a FIFO, never writes through a hard link.
func openPidFile(name string) (*os.File, error) {
	file, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0o600)
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(file.Fd()), &st); err != nil {
		file.Close()
		return nil, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Nlink != 1 {
		file.Close()
		return nil, fmt.Errorf("%s: %w: remove it", name, ErrLockFile)
	}
	return file, nil
}

// ErrGivenUp is wrapped by Save's error once this process has let the
// record's lock go: another nri-gpu may hold the record now.
var ErrGivenUp = errors.New("given up to another nri-gpu")

// Unlock lets the lock go, once a save in progress is done: a save that
// comes after is refused (ErrGivenUp), so that nothing this process
// still has in flight writes the record of the nri-gpu that takes it.
func (f *File) Unlock() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.lock != nil {
		f.lock.Close()
		f.lock = nil
		f.givenUp = true
	}
}

// SetAside renames an unusable state file (a file, a symlink, a
// directory) to a name of its own beside it, never over another, for the
// operator to look at, and returns that name.
func (f *File) SetAside() (string, error) {
	aside := fmt.Sprintf("%s.damaged-%s", f.path, time.Now().UTC().Format("20060102T150405.000000000Z"))
	if err := unix.Renameat2(unix.AT_FDCWD, f.path, unix.AT_FDCWD, aside, unix.RENAME_NOREPLACE); err != nil {
		return "", fmt.Errorf("state file %s: keeping it as %s: %w", f.path, aside, err)
	}
	return aside, nil
}

// Load reads what the record keeps. A missing file holds nothing, and so
// does a record kept before the node last booted (Content.EarlierBoot
// says so). A file nri-gpu's user does not own, that others may write,
// that is not a regular file or is too big is not read (ErrUntrusted). A
// record a newer nri-gpu wrote (a newer format version, or a field this
// one cannot read) is refused (ErrNewer), except for the claims it keeps
// as far as this format reads them, which Load returns with the error: a
// claim's devices are found nowhere else, and are not to be given away.
// Its boot is looked at first: a record of another boot holds nothing,
// whatever its format.
func (f *File) Load() (Content, error) {
	file, err := os.OpenFile(f.path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if errors.Is(err, os.ErrNotExist) {
		return Content{}, nil
	}
	if err != nil {
		return Content{}, fmt.Errorf("state file %s: %w", f.path, err)
	}
	defer file.Close()
	var st syscall.Stat_t
	if err := syscall.Fstat(int(file.Fd()), &st); err != nil {
		return Content{}, fmt.Errorf("state file %s: %w", f.path, err)
	}
	switch {
	case st.Mode&syscall.S_IFMT != syscall.S_IFREG:
		return Content{}, fmt.Errorf("state file %s: %w: not a regular file", f.path, ErrUntrusted)
	case int(st.Uid) != os.Geteuid():
		return Content{}, fmt.Errorf("state file %s: %w: owned by uid %d, not the plugin's %d", f.path, ErrUntrusted, st.Uid, os.Geteuid())
	case st.Mode&0o022 != 0:
		return Content{}, fmt.Errorf("state file %s: %w: writable by group or others (mode %#o)", f.path, ErrUntrusted, st.Mode&0o777)
	case st.Size > maxStateSize:
		return Content{}, fmt.Errorf("state file %s: %w: %d bytes, more than %d", f.path, ErrUntrusted, st.Size, maxStateSize)
	}
	data, err := io.ReadAll(io.LimitReader(file, maxStateSize))
	if err != nil {
		return Content{}, fmt.Errorf("state file %s: %w", f.path, err)
	}
	// Its boot first: a record of another boot holds nothing, whatever
	// its format.
	var format struct {
		Version int    `json:"version"`
		Boot    string `json:"bootId"`
	}
	if err := json.Unmarshal(data, &format); err != nil {
		return Content{}, fmt.Errorf("state file %s: %w", f.path, err)
	}
	if format.Boot != "" && f.boot != "" && format.Boot != f.boot {
		return Content{EarlierBoot: format.Boot}, nil
	}
	var rec stateRecord
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	err = dec.Decode(&rec)
	unknown, isUnknown := strings.CutPrefix(fmt.Sprint(err), "json: unknown field ")
	switch {
	case format.Version > stateVersion:
		return f.newer(data, fmt.Sprintf("format version %d, and this nri-gpu reads version %d and older", format.Version, stateVersion))
	case isUnknown:
		return f.newer(data, fmt.Sprintf("field %s, which this nri-gpu cannot read", unknown))
	case err != nil:
		return Content{}, fmt.Errorf("state file %s: %w", f.path, err)
	case rec.Version < 1:
		return Content{}, fmt.Errorf("state file %s: format version %d, which no nri-gpu writes", f.path, rec.Version)
	}
	c, err := rec.content()
	if err != nil {
		return Content{}, fmt.Errorf("state file %s: %w", f.path, err)
	}
	return c, nil
}

// newer refuses a record a newer nri-gpu wrote (ErrNewer, saying why),
// returning the claims it keeps as far as this format reads them: pods
// are found again in their containers, claims are not, and their
// devices are not to be given away.
func (f *File) newer(data []byte, why string) (Content, error) {
	var rec stateRecord
	_ = json.Unmarshal(data, &rec)
	c, _ := rec.content()
	return Content{Claims: c.Claims}, fmt.Errorf("state file %s: %w: %s", f.path, ErrNewer, why)
}

// content is what a record holds.
func (rec *stateRecord) content() (Content, error) {
	out := make([]policy.Holding, 0, len(rec.Pods))
	for _, r := range rec.Pods {
		out = append(out, policy.Holding{
			Pod:   policy.Pod{ID: r.ID, Namespace: r.Namespace, Name: r.Name},
			Named: devices(r.Named), Counted: devices(r.Counted), Kubelet: r.Kubelet, Sole: r.Sole, Claims: r.Claims,
		})
	}
	var claims []policy.ClaimHolding
	for _, r := range rec.Claims {
		c := policy.ClaimHolding{Claim: policy.Claim{UID: r.UID, Namespace: r.Namespace, Name: r.Name, Pods: r.Pods}}
		for _, d := range r.Devices {
			if d.Shares < 0 || d.Memory < 0 {
				return Content{}, fmt.Errorf("claim %s/%s: device %q: a negative amount allocated (%d shares, %d bytes of memory)", r.Namespace, r.Name, d.Name, d.Shares, d.Memory)
			}
			cd := policy.ClaimDevice{Device: d.device(), Requests: d.Requests, Use: policy.Use{Shares: d.Shares, Memory: d.Memory}}
			if a := d.Asked; a != nil {
				// Bounds kept as asked; one that is not positive bounds
				// nothing more than the allocation does.
				cd.GpuConfig = policy.GpuConfig{Strategy: a.Strategy, ActiveThreadPercentage: max(0, a.ActiveThreadPercentage), PinnedMemory: max(0, a.PinnedMemory)}
			}
			c.Devices = append(c.Devices, cd)
		}
		claims = append(claims, c)
	}
	var daemons []mps.Entry
	for _, d := range rec.Daemons {
		if d.State != mps.Running && d.State != mps.Stopping {
			d.State = mps.Starting // rolled back: what it is is not known
		}
		daemons = append(daemons, d)
	}
	return Content{Pods: out, Claims: claims, Daemons: daemons}, nil
}

func deviceRecords(devs []specs.Device) []deviceRecord {
	var out []deviceRecord
	for _, d := range devs {
		out = append(out, recordOf(d))
	}
	return out
}

func devices(recs []deviceRecord) []specs.Device {
	var out []specs.Device
	for _, r := range recs {
		out = append(out, r.device())
	}
	return out
}

// Inspect reads the record at path, never writing it, for nri-gpu
// check: the pods that hold devices found in their containers with no
// record of them ("namespace/name"), the unusable records set aside
// beside it, and why the file cannot be read back (nil when it can or
// there is none).
func Inspect(path string) (rebuilt, damaged []string, err error) {
	damaged, _ = filepath.Glob(path + ".damaged-*")
	c, err := OpenReadOnly(path).Load()
	for _, h := range c.Pods {
		if len(h.Sole) > 0 {
			rebuilt = append(rebuilt, h.Pod.String())
		}
	}
	return rebuilt, damaged, err
}
