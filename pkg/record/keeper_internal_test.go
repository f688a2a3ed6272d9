package record

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/mps"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// TestKeeper: what a record read at start says pods hold is pending
// (and is what is saved) until taken, then the pool is; its claims and
// MPS daemons are returned and kept; the MPS manager's entries are
// saved with the pool (its Journal); a save that fails wraps
// ErrNotRecorded.
func TestKeeper(t *testing.T) {
	path := fixture(t, "1-mps-daemons.json")
	f := Open(path)
	f.boot = fixtureBoot
	pool := policy.NewAllocations()
	k := NewKeeper(f, pool)
	if err := k.Lock(nil, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Unlock)
	want := formats()["1-mps-daemons.json"]
	got, aside, err := k.Load()
	if err != nil || aside != "" || k.Lost() {
		t.Fatalf("Load: %v, set aside %q, lost %v", err, aside, k.Lost())
	}
	if diff := cmp.Diff(want, got, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("loaded (-want +got):\n%s", diff)
	}
	if !slices.Equal(k.Entries(), want.Daemons) {
		t.Errorf("the MPS manager's entries %+v, want the record's", k.Entries())
	}
	if !k.Restoring() || len(k.Content().Pods) != len(want.Pods) {
		t.Errorf("restoring %v, pods kept %d; want the record's pending", k.Restoring(), len(k.Content().Pods))
	}
	if pods := k.TakeRestored(); len(pods) != len(want.Pods) || k.Restoring() {
		t.Errorf("taken %d pods, restoring %v; want the record's, then none pending", len(pods), k.Restoring())
	}
	// Now the pool is what is kept.
	if _, err := pool.Commit(policy.New(config.Policy{Namespaces: []string{"*"}, Devices: []string{"*/*"}}), mustPlan(t, pool)); err != nil {
		t.Fatal(err)
	}
	if pods := k.TakeRestored(); len(pods) != 1 || pods[0].Pod.Name != "z" {
		t.Errorf("taken again: %+v, want the pool's pod z", pods)
	}
	entry := mps.Entry{Device: "nvidia.com/gpu=9", Dir: "/d", GPU: "GPU-9", State: mps.Starting}
	if err := k.Keep([]mps.Entry{entry}); err != nil {
		t.Fatal(err)
	}
	again := Open(path)
	again.boot = fixtureBoot
	read, err := again.Load()
	if err != nil || len(read.Pods) != 1 || !slices.Equal(read.Daemons, []mps.Entry{entry}) {
		t.Errorf("saved %+v, %v; want pod z and the entry kept", read, err)
	}

	// A record that cannot be written: not recorded.
	if err := os.Chmod(filepath.Dir(path), 0o500); err != nil {
		t.Fatal(err)
	}
	defer os.Chmod(filepath.Dir(path), 0o700)
	if os.Geteuid() == 0 {
		f.path = filepath.Join(path, "not-a-dir", "x") // root writes read-only directories
	}
	if err := k.Keep(nil); !errors.Is(err, ErrNotRecorded) {
		t.Errorf("a save that fails: %v, want ErrNotRecorded", err)
	}
}

// mustPlan plans a grant of GPU 0 by name for pod ns/z.
func mustPlan(t *testing.T, pool *policy.Allocations) policy.Plan {
	t.Helper()
	pl, err := pool.Plan(policy.New(config.Policy{Namespaces: []string{"*"}, Devices: []string{"*/*"}}),
		policy.Want{Pod: pod("z"), Named: []policy.Asked{{Device: specs.Device{Name: "nvidia.com/gpu=0", Nodes: []string{"c 195:0"}}}}})
	if err != nil {
		t.Fatal(err)
	}
	return pl
}

// TestKeeperLost: a record that cannot be read back is set aside (one
// only read is not) and counts as lost, its claims still returned; a
// keeper of no file keeps and writes nothing; a take-over waits for the
// holder to let go.
func TestKeeperLost(t *testing.T) {
	for _, readOnly := range []bool{false, true} {
		path := filepath.Join(t.TempDir(), "allocations.json")
		if err := os.WriteFile(path, []byte("{not json"), 0o600); err != nil {
			t.Fatal(err)
		}
		f := Open(path)
		if readOnly {
			f = OpenReadOnly(path)
		}
		k := NewKeeper(f, policy.NewAllocations())
		_, aside, err := k.Load()
		if err == nil || !k.Lost() {
			t.Errorf("read only %v: %v, lost %v; want an error and lost", readOnly, err, k.Lost())
		}
		if readOnly != (aside == "") || (!readOnly && !strings.Contains(aside, ".damaged-")) {
			t.Errorf("read only %v: set aside as %q", readOnly, aside)
		}
		if _, err := os.Stat(path); readOnly != (err == nil) {
			t.Errorf("read only %v: the file is there: %v", readOnly, err == nil)
		}
	}

	none := NewKeeper(nil, policy.NewAllocations())
	if err := none.Lock(context.Background(), nil); err != nil {
		t.Error(err)
	}
	if c, aside, err := none.Load(); err != nil || aside != "" || len(c.Pods)+len(c.Claims) > 0 {
		t.Errorf("no file: %+v, %q, %v", c, aside, err)
	}
	if err := none.Save(); err != nil || none.File() != nil {
		t.Errorf("no file: saved %v", err)
	}
	none.Unlock()

	defer func(wait time.Duration) { lockWait = wait }(lockWait)
	lockWait = 100 * time.Millisecond
	path := filepath.Join(t.TempDir(), "state", "allocations.json")
	first := NewKeeper(Open(path), policy.NewAllocations())
	if err := first.Lock(nil, nil); err != nil {
		t.Fatal(err)
	}
	waiting, taken := make(chan string, 1), make(chan error, 1)
	go func() {
		taken <- NewKeeper(Open(path), policy.NewAllocations()).Lock(context.Background(), func(pid string) { waiting <- pid })
	}()
	select {
	case err := <-taken:
		t.Fatalf("took over while the first holds it: %v", err)
	case pid := <-waiting:
		if pid != strconv.Itoa(os.Getpid()) {
			t.Errorf("told of holder %s, want this process", pid)
		}
	}
	first.Unlock()
	if err := <-taken; err != nil {
		t.Errorf("taken over: %v", err)
	}
	if err := NewKeeper(OpenReadOnly(path), policy.NewAllocations()).Lock(nil, nil); err != nil {
		t.Errorf("a record only read is not locked: %v", err)
	}
}
