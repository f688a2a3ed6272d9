package record

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

func TestStateFileRoundTrip(t *testing.T) {
	f := Open(filepath.Join(t.TempDir(), "sub", "allocations.json"))
	holdings := []policy.Holding{
		{Pod: policy.Pod{ID: "id-a", Namespace: "ns", Name: "a"},
			Named:   []specs.Device{{Name: "nvidia.com/gpu=0", Nodes: []string{"c 195:0"}}},
			Counted: []specs.Device{{Name: "nvidia.com/gpu=1", Nodes: []string{"c 195:1"}}, {Name: "nvidia.com/gpu=2:1", Nodes: []string{"c 195:2", "c 508:21", "c 508:22"}, Parts: []string{"c 508:21", "c 508:22"}}}},
		{Pod: policy.Pod{ID: "id-b", Namespace: "ns", Name: "b"},
			Named:   []specs.Device{{Name: "vendor.com/dev=x"}, {Name: "nvidia.com/gpu=2", Nodes: []string{"c 195:2"}}},
			Kubelet: []string{"nvidia.com/gpu=2"}},
		{Pod: policy.Pod{ID: "id-c", Namespace: "ns", Name: "c"}, Claims: []string{"uid-1"}},
	}
	claims := []policy.ClaimHolding{{
		Claim: policy.Claim{UID: "uid-1", Namespace: "ns", Name: "c", Pods: []policy.PodName{{Namespace: "ns", Name: "a"}, {Namespace: "ns", Name: "b"}}},
		Devices: []policy.ClaimDevice{
			{Device: specs.Device{Name: "nvidia.com/gpu=3", Nodes: []string{"c 195:3"}}, Requests: []string{"gpu"}},
			{Device: specs.Device{Name: "nvidia.com/gpu=1", Nodes: []string{"c 195:1"}}, Requests: []string{"shared"}, Use: policy.Use{Shares: 2, Memory: 10 << 30},
				GpuConfig: policy.GpuConfig{Strategy: config.StrategyMPS, ActiveThreadPercentage: 40, PinnedMemory: 8 << 30}},
		},
	}}
	if err := f.Save(func() Content { return Content{Pods: holdings, Claims: claims} }); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(f.path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		t.Errorf("state file mode %v, want it readable by its owner only", fi.Mode())
	}
	if di, err := os.Stat(filepath.Dir(f.path)); err != nil || di.Mode() != os.ModeDir|0o700 {
		t.Errorf("the directory a save made: %v, %v; want one only its owner may enter", di.Mode(), err)
	}
	got, err := Open(f.path).Load()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got.Pods, holdings) {
		t.Errorf("loaded %+v, want %+v", got.Pods, holdings)
	}
	if !reflect.DeepEqual(got.Claims, claims) {
		t.Errorf("loaded claims %+v, want %+v", got.Claims, claims)
	}
	// Released: nothing held, and that is what a restart finds.
	if err := f.Save(func() Content { return Content{} }); err != nil {
		t.Fatal(err)
	}
	if got, err := f.Load(); err != nil || len(got.Pods) != 0 || len(got.Claims) != 0 {
		t.Errorf("after saving no holdings, loaded %v, %v", got, err)
	}
	entries, _ := os.ReadDir(filepath.Dir(f.path))
	if len(entries) != 1 {
		t.Errorf("the state dir holds %d files, want the state file only (no temp files left)", len(entries))
	}
}

// TestNegativeAmounts: a record whose claim was allocated a negative
// amount of a shared device (it would consume less than nothing) is not
// loaded.
func TestNegativeAmounts(t *testing.T) {
	for _, amounts := range []string{`"shares":-1`, `"memory":-1048576`} {
		path := filepath.Join(t.TempDir(), "allocations.json")
		if err := os.WriteFile(path, []byte(`{"version":1,"pods":[],"claims":[{"uid":"u","namespace":"ns","name":"c","devices":[`+
			`{"name":"nvidia.com/gpu=0","nodes":["c 195:0"],`+amounts+`}]}]}`), 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := Open(path).Load()
		if err == nil || !strings.Contains(err.Error(), `claim ns/c: device "nvidia.com/gpu=0": a negative amount allocated`) {
			t.Errorf("%s: loaded %+v, %v; want an error naming the claim and device", amounts, c, err)
		}
	}
}

// TestRecordedParts: a MIG device's parts are kept with it; parts a record
// names that are not among the device's nodes are none (the device is
// held whole, which overlaps more, never less), and a record from before
// parts were kept holds its devices whole.
func TestRecordedParts(t *testing.T) {
	path := filepath.Join(t.TempDir(), "allocations.json")
	if err := os.WriteFile(path, []byte(`{"version":1,"pods":[{"id":"x","namespace":"ns","name":"x","counted":[`+
		`{"name":"nvidia.com/gpu=0:1","nodes":["c 195:0","c 508:21"],"parts":["c 508:21","c 195:7"]},`+
		`{"name":"nvidia.com/gpu=0:2","nodes":["c 195:0","c 508:31"],"parts":["c 195:9"]},`+
		`{"name":"nvidia.com/gpu=0:3","nodes":["c 195:0","c 508:41"]}]}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := Open(path).Load()
	if err != nil {
		t.Fatal(err)
	}
	want := []specs.Device{
		{Name: "nvidia.com/gpu=0:1", Nodes: []string{"c 195:0", "c 508:21"}, Parts: []string{"c 508:21"}},
		{Name: "nvidia.com/gpu=0:2", Nodes: []string{"c 195:0", "c 508:31"}},
		{Name: "nvidia.com/gpu=0:3", Nodes: []string{"c 195:0", "c 508:41"}},
	}
	if len(got.Pods) != 1 || !reflect.DeepEqual(got.Pods[0].Counted, want) {
		t.Errorf("loaded %+v, want %+v", got.Pods, want)
	}
}

// TestStateFileTrust: a state file is read only if it is a regular file
// the plugin's user owns, that no one else may write, and of a sane size.
func TestStateFileTrust(t *testing.T) {
	valid := []byte(`{"version":1,"pods":[{"id":"x","namespace":"ns","name":"x","named":[{"name":"nvidia.com/gpu=0"}]}]}`)
	for _, tc := range []struct {
		name    string
		make    func(t *testing.T, path string)
		want    string // substring of the error; "" for none
		untrust bool
	}{
		{name: "missing", make: func(*testing.T, string) {}},
		{name: "valid", make: func(t *testing.T, path string) { write(t, path, valid, 0o600) }},
		{name: "group writable", make: func(t *testing.T, path string) { write(t, path, valid, 0o620) },
			want: "writable by group or others (mode 0620)", untrust: true},
		{name: "others may execute, not write", make: func(t *testing.T, path string) { write(t, path, valid, 0o601) }},
		{name: "owned by another user", make: func(t *testing.T, path string) {
			if os.Geteuid() != 0 {
				t.Skip("giving a file away needs root")
			}
			write(t, path, valid, 0o600)
			if err := os.Chown(path, 4242, 4242); err != nil {
				t.Fatal(err)
			}
		}, want: "owned by uid 4242", untrust: true},
		{name: "symlink", make: func(t *testing.T, path string) {
			write(t, path+".real", valid, 0o600)
			if err := os.Symlink(path+".real", path); err != nil {
				t.Fatal(err)
			}
		}, want: "too many levels of symbolic links"},
		{name: "fifo", make: func(t *testing.T, path string) {
			if err := syscall.Mkfifo(path, 0o600); err != nil {
				t.Fatal(err)
			}
		}, want: "not a regular file", untrust: true},
		{name: "too big", make: func(t *testing.T, path string) {
			write(t, path, valid, 0o600)
			if err := os.Truncate(path, maxStateSize+1); err != nil {
				t.Fatal(err)
			}
		}, want: "more than", untrust: true},
		{name: "not json", make: func(t *testing.T, path string) { write(t, path, []byte("pods: []"), 0o600) },
			want: "invalid character"},
		{name: "newer version", make: func(t *testing.T, path string) { write(t, path, []byte(`{"version":2}`), 0o600) },
			want: "written by a newer nri-gpu: format version 2, and this nri-gpu reads version 1 and older"},
		{name: "no version", make: func(t *testing.T, path string) { write(t, path, []byte(`{"pods":[]}`), 0o600) },
			want: "format version 0, which no nri-gpu writes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "allocations.json")
			tc.make(t, path)
			done := make(chan struct{})
			var (
				got []policy.Holding
				err error
			)
			go func() { defer close(done); var c Content; c, err = Open(path).Load(); got = c.Pods }()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				t.Fatal("load blocked")
			}
			if tc.want == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				if tc.name == "valid" && len(got) != 1 {
					t.Errorf("loaded %v, want pod x", got)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one saying %q", err, tc.want)
			}
			if errors.Is(err, ErrUntrusted) != tc.untrust {
				t.Errorf("errors.Is(%v, ErrUntrusted) = %v, want %v", err, !tc.untrust, tc.untrust)
			}
			if len(got) != 0 {
				t.Errorf("with an error, loaded %v", got)
			}
		})
	}
}

func write(t *testing.T, path string, data []byte, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, data, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil { // past the umask
		t.Fatal(err)
	}
}

// TestStateFileLastSaveWins: of saves at once, the file ends with the
// latest state, never an earlier one written last.
func TestStateFileLastSaveWins(t *testing.T) {
	f := Open(filepath.Join(t.TempDir(), "allocations.json"))
	var (
		n  atomic.Int64
		wg sync.WaitGroup
	)
	for i := 0; i < 64; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n.Add(1) // the state changes, then it is saved
			if err := f.Save(func() Content {
				id := fmt.Sprint(n.Load())
				time.Sleep(time.Millisecond) // a slow read of the state
				return Content{Pods: []policy.Holding{{Pod: policy.Pod{ID: id}}}}
			}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	c, err := f.Load()
	got := c.Pods
	if err != nil || len(got) != 1 || got[0].Pod.ID != "64" {
		t.Errorf("after 64 changes saved at once, the file holds %v, %v; want the last state", got, err)
	}
}

// TestLock: one process per record. The lock file beside the record
// holds its holder's pid, readable by the owner only, in a directory only
// the owner may enter; a second lock of the record waits, then is refused
// naming the holder, and so it is once the lock file was removed (the
// directory is what is locked); once let go, the record can be locked
// again.
func TestLock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state", "allocations.json")
	first := Open(path)
	if err := first.Lock(); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path + ".lock")
	if err != nil || string(data) != fmt.Sprintf("%d\n", os.Getpid()) {
		t.Errorf("lock file %q, %v; want this pid", data, err)
	}
	for file, want := range map[string]os.FileMode{path + ".lock": 0o600, filepath.Dir(path): 0o700 | os.ModeDir} {
		if fi, err := os.Stat(file); err != nil || fi.Mode() != want {
			t.Errorf("%s: mode %v, %v; want %v", file, fi.Mode(), err, want)
		}
	}
	second := Open(path)
	start := time.Now()
	err = second.Lock()
	if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), fmt.Sprintf("pid %d holds %s.lock", os.Getpid(), path)) {
		t.Errorf("a second lock: %v, want ErrLocked naming this pid", err)
	}
	if waited := time.Since(start); waited < lockWait {
		t.Errorf("refused after %s, want a wait of %s first", waited, lockWait)
	}
	if err := os.Remove(path + ".lock"); err != nil {
		t.Fatal(err)
	}
	defer func(wait time.Duration) { lockWait = wait }(lockWait)
	lockWait = 100 * time.Millisecond
	if err := second.Lock(); !errors.Is(err, ErrLocked) {
		t.Errorf("a second lock once the lock file was removed: %v, want ErrLocked", err)
	}
	first.Unlock()
	if err := second.Lock(); err != nil {
		t.Errorf("once let go: %v", err)
	}
	second.Unlock()
}

// TestTakeOver: a take-over waits for as long as another holds the
// record, saying who, and has it the moment that one lets go; the wait
// ends when its context does, leaving the lock to the holder.
func TestTakeOver(t *testing.T) {
	defer func(wait time.Duration) { lockWait = wait }(lockWait)
	lockWait = 100 * time.Millisecond
	path := filepath.Join(t.TempDir(), "state", "allocations.json")
	first := Open(path)
	if err := first.Lock(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	var holders []string
	err := Open(path).TakeOver(ctx, func(pid string) { holders = append(holders, pid) })
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "waiting to take it over") {
		t.Errorf("a take-over whose wait ended: %v", err)
	}
	if want := []string{strconv.Itoa(os.Getpid())}; !slices.Equal(holders, want) {
		t.Errorf("told of holders %v, want %v", holders, want)
	}

	second := Open(path)
	took := make(chan error, 1)
	waiting := make(chan string, 1)
	go func() { took <- second.TakeOver(context.Background(), func(pid string) { waiting <- pid }) }()
	<-waiting
	select {
	case err := <-took:
		t.Fatalf("took over while the first held it: %v", err)
	case <-time.After(3 * lockWait / 2):
	}
	let := time.Now()
	first.Unlock()
	if err := <-took; err != nil {
		t.Fatal(err)
	}
	if d := time.Since(let); d > 100*time.Millisecond {
		t.Errorf("took over %s after the first let go", d)
	}
	if data, err := os.ReadFile(path + ".lock"); err != nil || string(data) != fmt.Sprintf("%d\n", os.Getpid()) {
		t.Errorf("lock file %q, %v; want the pid of the one that took over", data, err)
	}
	if err := Open(path).Lock(); !errors.Is(err, ErrLocked) {
		t.Errorf("a third nri-gpu beside the one that took over: %v, want ErrLocked", err)
	}
	second.Unlock()
	// Nothing held: no wait, and no word of one.
	third := Open(path)
	if err := third.TakeOver(context.Background(), func(pid string) { t.Errorf("told of holder %s with none", pid) }); err != nil {
		t.Fatal(err)
	}
	third.Unlock()
}

// TestHandoverWithASaveInFlight: a save still in flight when nri-gpu
// gives the record up (its request began before the handover) is written
// before the lock goes, so the nri-gpu that takes the record over reads
// it and its own saves are the last; a save that comes after the lock
// went is refused (ErrGivenUp) and writes nothing.
func TestHandoverWithASaveInFlight(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state", "allocations.json")
	old := Open(path)
	if err := old.Lock(); err != nil {
		t.Fatal(err)
	}
	held := func(id string) func() Content {
		return func() Content { return Content{Pods: []policy.Holding{{Pod: policy.Pod{ID: id}}}} }
	}
	if err := old.Save(held("a")); err != nil {
		t.Fatal(err)
	}
	// The old nri-gpu's request is inside its save when it gives up.
	inSave, resume := make(chan struct{}), make(chan struct{})
	old.step = func(name string) {
		if name == "create" {
			close(inSave)
			<-resume
		}
	}
	saved := make(chan error, 1)
	go func() { saved <- old.Save(held("in-flight")) }()
	<-inSave
	old.step = nil
	gaveUp := make(chan struct{})
	go func() { old.Unlock(); close(gaveUp) }()

	// The new nri-gpu waits for the lock; the save in flight goes on.
	next := Open(path)
	waited := false
	if err := next.TakeOver(context.Background(), func(string) { waited = true; close(resume) }); err != nil {
		t.Fatal(err)
	}
	defer next.Unlock()
	if !waited {
		t.Error("the record was taken over while a save of the nri-gpu giving it up was in flight")
		close(resume)
	}
	if err := <-saved; err != nil {
		t.Errorf("the save in flight: %v", err)
	}
	<-gaveUp
	c, err := next.Load()
	if err != nil || len(c.Pods) != 1 || c.Pods[0].Pod.ID != "in-flight" {
		t.Errorf("the new nri-gpu read %v, %v; want the save in flight, written before the lock went", c.Pods, err)
	}
	if err := next.Save(held("new")); err != nil {
		t.Fatal(err)
	}
	if err := old.Save(held("late")); !errors.Is(err, ErrGivenUp) {
		t.Errorf("a save after the record was given up: %v, want ErrGivenUp", err)
	}
	if c, err := next.Load(); err != nil || len(c.Pods) != 1 || c.Pods[0].Pod.ID != "new" {
		t.Errorf("the record holds %v, %v; want the new nri-gpu's save", c.Pods, err)
	}
}

// TestLockFileOfOneLink: a lock path that is not a regular file of one
// link is refused, and the file it names left as it was: a hard link to
// another file (writing the pid would truncate it), a symbolic link, a
// FIFO (an open would block), a directory.
func TestLockFileOfOneLink(t *testing.T) {
	for _, tc := range []struct {
		name string
		make func(t *testing.T, lock, other string)
		want error
	}{
		{"hard link", func(t *testing.T, lock, other string) {
			if err := os.Link(other, lock); err != nil {
				t.Fatal(err)
			}
		}, ErrLockFile},
		{"symbolic link", func(t *testing.T, lock, other string) {
			if err := os.Symlink(other, lock); err != nil {
				t.Fatal(err)
			}
		}, syscall.ELOOP},
		{"FIFO", func(t *testing.T, lock, _ string) {
			if err := syscall.Mkfifo(lock, 0o600); err != nil {
				t.Fatal(err)
			}
		}, ErrLockFile},
		{"directory", func(t *testing.T, lock, _ string) {
			if err := os.Mkdir(lock, 0o700); err != nil {
				t.Fatal(err)
			}
		}, syscall.EISDIR},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path, other := filepath.Join(dir, "allocations.json"), filepath.Join(dir, "precious")
			if err := os.WriteFile(other, []byte("keep me"), 0o600); err != nil {
				t.Fatal(err)
			}
			tc.make(t, path+".lock", other)
			f := Open(path)
			err := f.Lock()
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), path+".lock") {
				t.Errorf("Lock: %v, want %v naming the lock path", err, tc.want)
			}
			if data, err := os.ReadFile(other); err != nil || string(data) != "keep me" {
				t.Errorf("the other file holds %q, %v", data, err)
			}
			f.Unlock()
		})
	}
}
