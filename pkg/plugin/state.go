package plugin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"

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

// stateFile keeps the allocations in a file, written whole and renamed
// into place, so that a reader sees the old state or the new one.
type stateFile struct {
	path string
	// readOnly files are read, never written (nri-gpu explain).
	readOnly bool

	mu   sync.Mutex
	last []byte // what was last written, so unchanged state is not
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
			Named: deviceRecords(h.Named), Counted: deviceRecords(h.Counted), Kubelet: h.Kubelet,
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

func writeAtomic(path string, data []byte) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, ".allocations-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // gone after the rename; removed if it failed
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
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
			Named: devices(r.Named), Counted: devices(r.Counted), Kubelet: r.Kubelet,
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
