package recovery_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/memlimit"
	"github.com/nri-gpu/nri-gpu/pkg/recovery"
)

// TestKiller: a container's process is killed only when its cgroup
// names the container; a process elsewhere (another container's, or one
// that took a dead container's pid), and a container without a process,
// are not signalled, and the error says why.
func TestKiller(t *testing.T) {
	const id = "0123456789abcdef"
	for _, tc := range []struct {
		name, cgroup string
		pid          func(real int) uint32
		killed       bool
		err          string
	}{
		{name: "the container's", cgroup: "0::/kubepods/besteffort/pod-uid/" + id + "\n", killed: true},
		{name: "a systemd scope", cgroup: "1:name=systemd:/kubepods.slice/cri-containerd-" + id + ".scope\n", killed: true},
		{name: "another cgroup", cgroup: "0::/user.slice/session-1.scope\n", err: "not in the container's cgroup"},
		{name: "no process", cgroup: "0::/" + id + "\n", pid: func(int) uint32 { return 0 }, err: "the runtime reports no process"},
		{name: "no such process", cgroup: "0::/" + id + "\n", pid: func(int) uint32 { return 1 << 30 }, err: "no such process"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd, exited := sleeping(t)
			pid := uint32(cmd.Process.Pid)
			if tc.pid != nil {
				pid = tc.pid(cmd.Process.Pid)
			}
			proc := t.TempDir()
			dir := filepath.Join(proc, strconv.Itoa(int(pid)))
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(tc.cgroup), 0o644); err != nil {
				t.Fatal(err)
			}
			err := recovery.Killer{Proc: proc}.Stop(&api.Container{Id: id, Pid: pid})
			if tc.err != "" && (!errors.Is(err, recovery.ErrNotStopped) || !strings.Contains(err.Error(), tc.err)) {
				t.Errorf("Stop: %v, want it not stopped because %s", err, tc.err)
			}
			if tc.killed && err != nil {
				t.Fatal(err)
			}
			if !tc.killed {
				// Had Stop signalled it, SIGKILL came first and wins.
				_ = cmd.Process.Signal(syscall.SIGTERM)
			}
			err = <-exited
			want := map[bool]syscall.Signal{true: syscall.SIGKILL, false: syscall.SIGTERM}[tc.killed]
			if st, _ := cmd.ProcessState.Sys().(syscall.WaitStatus); st.Signal() != want {
				t.Errorf("the process ended (%v) by %v; want %v (killed by Stop: %v)", err, st.Signal(), want, tc.killed)
			}
		})
	}
}

// TestKillerByCgroup: a container the runtime reports no process of
// (CRI-O tells NRI no pid) is killed by its cgroup, the one its
// cgroupsPath names (cgroup v2's cgroup.kill): every process in it dies;
// one whose cgroupsPath does not name it is not, saying why.
func TestKillerByCgroup(t *testing.T) {
	const id = "0123456789abcdef"
	root := testutil.Cgroup2(t)
	dir := filepath.Join(root, "nrigputest-"+id)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(dir) }) // after the process is gone
	cmd, exited := sleeping(t)
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
		t.Fatal(err)
	}
	// A container whose pid the runtime tells is killed by its process,
	// as without Cgroups: its cgroupsPath (none here) is not needed.
	told, toldExited := sleeping(t)
	proc := t.TempDir()
	if err := os.MkdirAll(filepath.Join(proc, strconv.Itoa(told.Process.Pid)), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(proc, strconv.Itoa(told.Process.Pid), "cgroup"), []byte("0::/kubepods/"+id+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	k := recovery.Killer{Proc: proc, Cgroups: memlimit.Cgroups{Proc: proc, Root: root}}
	if err := k.Stop(&api.Container{Id: id, Pid: uint32(told.Process.Pid)}); err != nil {
		t.Fatalf("a container whose pid is told: %v", err)
	}
	<-toldExited
	other := &api.Container{Id: "fedcba9876543210", Linux: &api.LinuxContainer{CgroupsPath: "/nrigputest-" + id}}
	if err := k.Stop(other); !errors.Is(err, recovery.ErrNotStopped) || !strings.Contains(err.Error(), "does not name it") {
		t.Errorf("another container's cgroup: %v, want it not stopped", err)
	}
	if err := k.Stop(&api.Container{Id: id, Linux: &api.LinuxContainer{CgroupsPath: "/nrigputest-" + id}}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
		if st, _ := cmd.ProcessState.Sys().(syscall.WaitStatus); st.Signal() != syscall.SIGKILL {
			t.Errorf("the process ended by %v, want SIGKILL", st.Signal())
		}
	case <-time.After(10 * time.Second):
		t.Error("the container's process still runs 10 s after its cgroup was killed")
	}
}

// sleeping starts a process that sleeps a minute, killed and waited for
// when the test ends; exited says how it ended.
func sleeping(t *testing.T) (*exec.Cmd, <-chan error) {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited, done := make(chan error, 1), make(chan struct{})
	go func() { exited <- cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	return cmd, exited
}
