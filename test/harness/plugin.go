package harness

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// Plugin is an nri-gpu process connected to a test containerd as an
// external plugin.
type Plugin struct {
	LogPath string
	cmd     *exec.Cmd
	done    chan error
}

// StateFile is where the nri-gpu of a name keeps its state under dir: a
// directory of its own, since nri-gpu locks its state file's directory
// (one nri-gpu per state directory).
func StateFile(dir, name string) string {
	return filepath.Join(dir, name+"-state", "allocations.json")
}

// AccessDir is where a plugin named name keeps the records of what
// containers were given (its --access-dir), in a containerd's dir.
func AccessDir(dir, name string) string {
	return filepath.Join(dir, name+"-access")
}

// StartPlugin starts nri-gpu against this containerd's NRI socket with the
// given extra arguments, and waits until it has registered.
func (c *Containerd) StartPlugin(args ...string) (*Plugin, error) {
	return c.startPlugin("Started plugin", args)
}

// StartStandby starts nri-gpu as StartPlugin does, with --take-over and
// the given extra arguments, and waits until it says it waits for the
// nri-gpu holding its state file to stop.
func (c *Containerd) StartStandby(args ...string) (*Plugin, error) {
	return c.startPlugin("waiting for it to stop, to take over", append([]string{"--take-over"}, args...))
}

// PluginLogTail returns the last n lines of the log of the nri-gpu last
// started on c ("" before any).
func (c *Containerd) PluginLogTail(n int) string {
	if len(c.plugins) == 0 {
		return ""
	}
	return tail(c.plugins[len(c.plugins)-1].LogPath, n)
}

// NRIFailures returns the last n lines of the runtime's log that say an
// NRI plugin failed or was closed (a request past the runtime's timeout
// closes the plugin, and the container is created without it).
func (c *Containerd) NRIFailures(n int) string {
	data, _ := os.ReadFile(c.LogPath)
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		if strings.Contains(line, "closing plugin") || strings.Contains(line, "plugin") && strings.Contains(line, "level=error") {
			out = append(out, line)
		}
	}
	return strings.Join(out[max(0, len(out)-n):], "\n")
}

func (c *Containerd) startPlugin(started string, args []string) (*Plugin, error) {
	p := &Plugin{LogPath: filepath.Join(c.Dir, fmt.Sprintf("nri-gpu-%d.log", len(c.plugins)))}
	logFile, err := os.Create(p.LogPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	// Each plugin name keeps its state in this containerd's dir; a plugin
	// started again under its name finds it there.
	name := "nri-gpu"
	if i := slices.Index(args, "--name"); i >= 0 && i+1 < len(args) {
		name = args[i+1]
	}
	state := StateFile(c.Dir, name)
	p.cmd = exec.Command(c.Tools.Path("nri-gpu"), append([]string{"--socket-path", c.NRISock, "--log-level", "debug", "--state-file", state, "--access-dir", AccessDir(c.Dir, name)}, args...)...)
	p.cmd.Stdout, p.cmd.Stderr = logFile, logFile
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting nri-gpu: %w", err)
	}
	p.done = make(chan error, 1)
	go func() { p.done <- p.cmd.Wait() }()
	c.plugins = append(c.plugins, p)

	deadline := time.Now().Add(15 * time.Second)
	for !strings.Contains(p.Log(), started) {
		select {
		case err := <-p.done:
			p.done <- err
			return nil, fmt.Errorf("nri-gpu exited: %v; log:\n%s", err, p.Log())
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("nri-gpu did not say %q; log:\n%s", started, p.Log())
		}
	}
	return p, nil
}

// Log returns the plugin's log so far.
func (p *Plugin) Log() string {
	data, _ := os.ReadFile(p.LogPath)
	return string(data)
}

// Terminate sends SIGTERM and returns the exit status, or an error if the
// plugin did not exit within timeout.
func (p *Plugin) Terminate(timeout time.Duration) (int, error) {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		p.done <- err
		return p.cmd.ProcessState.ExitCode(), nil
	case <-time.After(timeout):
		return -1, fmt.Errorf("nri-gpu did not exit within %s of SIGTERM", timeout)
	}
}

// Registrations counts how often the plugin registered with the runtime.
func (p *Plugin) Registrations() int { return strings.Count(p.Log(), "Started plugin") }

// Kill kills the plugin with SIGKILL, as a crash or an OOM kill would.
func (p *Plugin) Kill() {
	_ = p.cmd.Process.Kill()
	p.done <- <-p.done
}

// Stop stops the plugin with SIGTERM, then SIGKILL.
func (p *Plugin) Stop() {
	select {
	case err := <-p.done:
		p.done <- err
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		p.done <- err
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		p.done <- <-p.done
	}
}

// Pid returns the plugin's process ID.
func (p *Plugin) Pid() int { return p.cmd.Process.Pid }
