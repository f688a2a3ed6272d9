package harness

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// process is a long-running program of a test (a control-plane
// component, a node's kubelet) in a process group of its own, its output
// in a log file.
type process struct {
	name    string
	LogPath string
	cmd     *exec.Cmd
	done    chan error
}

// startProcess starts argv[0] with the rest as arguments, its output
// appended to logPath.
func startProcess(name, logPath string, argv ...string) (*process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	p := &process{name: name, LogPath: logPath, cmd: exec.Command(argv[0], argv[1:]...)}
	p.cmd.Stdout, p.cmd.Stderr = logFile, logFile
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p.done = make(chan error, 1)
	go func() { p.done <- p.cmd.Wait() }()
	return p, nil
}

// Running reports whether the process has not exited.
func (p *process) Running() bool {
	if p == nil {
		return false
	}
	select {
	case err := <-p.done:
		p.done <- err
		return false
	default:
		return true
	}
}

// Stop ends the process group (SIGTERM, then SIGKILL after timeout).
func (p *process) Stop(timeout time.Duration) {
	if !p.Running() {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case err := <-p.done:
		p.done <- err
	case <-time.After(timeout):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		p.done <- <-p.done
	}
}

// Pid is the process's id.
func (p *process) Pid() int { return p.cmd.Process.Pid }

// LogTail returns the last n lines of the process's log.
func (p *process) LogTail(n int) string { return tail(p.LogPath, n) }

// waitFor polls ok every 200 ms until it returns nil, the process exits,
// or timeout passes; the error then says why, with the log's end.
func (p *process) waitFor(what string, timeout time.Duration, ok func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := ok()
		if err == nil {
			return nil
		}
		if !p.Running() {
			return fmt.Errorf("%s exited before %s; its log ends:\n%s", p.name, what, p.LogTail(30))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: no %s after %s (%v); its log ends:\n%s", p.name, what, timeout, err, p.LogTail(30))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// freePort returns a TCP port of the loopback that nothing listens on.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
