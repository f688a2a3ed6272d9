// Package mpsstandin is a stand-in for NVIDIA's nvidia-cuda-mps-control,
// for tests on machines without a GPU. As the real one, "-d" starts a
// control daemon in the background that listens on the "control" socket
// of its pipe directory and writes its pid beside it, and the program run
// without arguments sends the daemon the commands it reads (one with no
// daemon answering fails with the real one's message). It records how it
// was run (arguments, CUDA_VISIBLE_DEVICES, each command the daemon
// took) in its log directory, where a test reads it back.
package mpsstandin

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// controlSocket is the daemon's socket in its pipe directory: pkg/mps's
// ControlSocket (its test says so). The stand-in imports nothing of
// nri-gpu's, so that it builds static (CGO_ENABLED=0: it runs in nri-gpu's
// image on the cluster), which pkg/mps, over NVML, does not.
const controlSocket = "control"

// Files the stand-in keeps.
const (
	// PidFile, in the pipe directory, holds its daemon's pid (the real
	// daemon's name for it).
	PidFile = "nvidia-cuda-mps-control.pid"
	// Defaults, in the pipe directory, are the defaults set on it.
	Defaults = "standin.defaults"
	// Log, in the log directory, records each run and command.
	Log = "standin.log"
	// Started, in its /dev/shm (or $STANDIN_SHM), is written when its
	// daemon starts.
	Started = "standin.started"
)

const serve = "--standin-serve"

// Main runs the stand-in as nvidia-cuda-mps-control with args ("-d"
// starts the daemon; none sends it the commands read from stdin).
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	pipe, logDir := os.Getenv("CUDA_MPS_PIPE_DIRECTORY"), os.Getenv("CUDA_MPS_LOG_DIRECTORY")
	if pipe == "" {
		pipe = "/tmp/nvidia-mps"
	}
	s := standin{pipe: pipe, logDir: logDir}
	fail := func(err error) int {
		fmt.Fprintln(stderr, err)
		return 1
	}
	switch {
	case len(args) > 0 && args[0] == serve:
		if err := s.serve(); err != nil {
			return fail(err)
		}
		return 0
	case len(args) > 0 && args[0] == "-d":
		s.record(fmt.Sprintf("run args=%q CUDA_VISIBLE_DEVICES=%q", args, os.Getenv("CUDA_VISIBLE_DEVICES")))
		if err := s.start(); err != nil {
			return fail(err)
		}
		return 0
	}
	sc := bufio.NewScanner(stdin)
	for sc.Scan() {
		cmd := strings.TrimSpace(sc.Text())
		if cmd == "" {
			continue
		}
		conn, err := net.Dial("unix", filepath.Join(pipe, controlSocket))
		if err != nil {
			fmt.Fprintln(stdout, "Cannot find MPS control daemon process")
			return 1
		}
		fmt.Fprintln(conn, cmd)
		answer, _ := io.ReadAll(conn)
		conn.Close()
		out, failed := strings.CutPrefix(string(answer), "ERROR ")
		fmt.Fprint(stdout, out)
		if failed {
			return 1
		}
	}
	return 0
}

type standin struct{ pipe, logDir string }

func (s standin) record(line string) {
	if s.logDir == "" {
		return
	}
	f, err := os.OpenFile(filepath.Join(s.logDir, Log), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err == nil {
		fmt.Fprintln(f, line)
		f.Close()
	}
}

// start runs the daemon in the background, in a session of its own, and
// returns once it listens.
func (s standin) start() error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	shm := os.Getenv("STANDIN_SHM")
	if shm == "" {
		shm = "/dev/shm"
	}
	if err := os.WriteFile(filepath.Join(shm, Started), []byte(s.pipe), 0o644); err != nil {
		return err
	}
	cmd := exec.Command(self, serve)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if conn, err := net.Dial("unix", filepath.Join(s.pipe, controlSocket)); err == nil {
			conn.Close()
			return cmd.Process.Release()
		}
	}
	_ = cmd.Process.Kill()
	return errors.New("the stand-in daemon did not listen")
}

// serve is the daemon: it answers each connection's command until quit.
func (s standin) serve() error {
	sock := filepath.Join(s.pipe, controlSocket)
	_ = os.Remove(sock)
	l, err := net.Listen("unix", sock)
	if err != nil {
		return err
	}
	defer l.Close()
	if err := os.WriteFile(filepath.Join(s.pipe, PidFile), []byte(fmt.Sprint(os.Getpid())), 0o644); err != nil {
		return err
	}
	for {
		conn, err := l.Accept()
		if err != nil {
			return err
		}
		line, _ := bufio.NewReader(conn).ReadString('\n')
		cmd := strings.TrimSpace(line)
		s.record("command " + cmd)
		answer, quit := s.answer(cmd)
		fmt.Fprint(conn, answer)
		conn.Close()
		if quit {
			_ = os.Remove(filepath.Join(s.pipe, PidFile))
			return nil
		}
	}
}

// answer is the daemon's answer to a command, "ERROR ..." for one it does
// not know, and whether it quits.
func (s standin) answer(cmd string) (string, bool) {
	f := strings.Fields(cmd)
	switch {
	case len(f) == 0:
		return "ERROR empty command\n", false
	case f[0] == "get_default_active_thread_percentage":
		return defaultOf(s.pipe, "set_default_active_thread_percentage", "100.0") + "\n", false
	case f[0] == "set_default_active_thread_percentage" || f[0] == "set_default_device_pinned_mem_limit":
		file, err := os.OpenFile(filepath.Join(s.pipe, Defaults), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			return "ERROR " + err.Error() + "\n", false
		}
		fmt.Fprintln(file, cmd)
		file.Close()
		return "", false
	case f[0] == "quit":
		return "", true
	}
	return fmt.Sprintf("ERROR Invalid command %q\n", cmd), false
}

// defaultOf returns the value last set by command, or def.
func defaultOf(pipe, command, def string) string {
	data, _ := os.ReadFile(filepath.Join(pipe, Defaults))
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, command+" "); ok {
			def = v
		}
	}
	return def
}

// Kill kills the daemon of pipe directory pipe, as a crash would: its
// socket is left behind, and no longer answers.
func Kill(pipe string) error {
	pid, err := Pid(pipe)
	if err != nil {
		return err
	}
	// Only a stand-in daemon: a pid file left by a killed one may name
	// another process by now.
	if cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err != nil || !strings.Contains(string(cmdline), serve) {
		return fmt.Errorf("pid %d is no stand-in daemon", pid)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return err
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if syscall.Kill(pid, 0) != nil || Zombie(pid) {
			return nil
		}
	}
	return fmt.Errorf("pid %d did not die", pid)
}

// Zombie reports whether process pid has quit and waits for its parent
// to reap it.
func Zombie(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(data), ')')
	return i >= 0 && strings.HasPrefix(string(data[i+1:]), " Z")
}

// Pid returns the pid its daemon wrote in pipe directory pipe.
func Pid(pipe string) (int, error) {
	data, err := os.ReadFile(filepath.Join(pipe, PidFile))
	if err != nil {
		return 0, err
	}
	var pid int
	_, err = fmt.Sscan(string(data), &pid)
	return pid, err
}

// Build builds the stand-in (test/tools/mps-control) into dir as
// nvidia-cuda-mps-control and returns its path, for tests.
func Build(dir string) (string, error) {
	path := filepath.Join(dir, "nvidia-cuda-mps-control")
	out, err := exec.Command("go", "build", "-o", path, "github.com/nri-gpu/nri-gpu/test/tools/mps-control").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("building the MPS control stand-in: %w: %s", err, out)
	}
	return path, nil
}
