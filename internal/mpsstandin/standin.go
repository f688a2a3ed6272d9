// Package mpsstandin is a stand-in for NVIDIA's nvidia-cuda-mps-control,
// for tests on machines without a GPU: it keeps its "daemon" as a file in
// its pipe directory, answers the commands nri-gpu sends as the real one
// does (a command with no daemon running fails with the real one's
// message), and records how it was run (arguments, CUDA_VISIBLE_DEVICES,
// each command) in its log directory, where a test reads it back.
package mpsstandin

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Files the stand-in keeps.
const (
	// Running, in the pipe directory, is its daemon.
	Running = "standin.running"
	// Defaults, in the pipe directory, are the defaults set on it.
	Defaults = "standin.defaults"
	// Log, in the log directory, records each run and command.
	Log = "standin.log"
	// Started, in its /dev/shm (or $STANDIN_SHM), is written when its
	// daemon starts.
	Started = "standin.started"
)

// Main runs the stand-in as nvidia-cuda-mps-control with args ("-d"
// starts the daemon; none reads commands from stdin).
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	pipe, logDir := os.Getenv("CUDA_MPS_PIPE_DIRECTORY"), os.Getenv("CUDA_MPS_LOG_DIRECTORY")
	if pipe == "" {
		pipe = "/tmp/nvidia-mps"
	}
	record := func(line string) {
		if logDir == "" {
			return
		}
		f, err := os.OpenFile(filepath.Join(logDir, Log), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err == nil {
			fmt.Fprintln(f, line)
			f.Close()
		}
	}
	record(fmt.Sprintf("run args=%q CUDA_VISIBLE_DEVICES=%q", args, os.Getenv("CUDA_VISIBLE_DEVICES")))
	running := filepath.Join(pipe, Running)
	if len(args) > 0 && args[0] == "-d" {
		shm := os.Getenv("STANDIN_SHM")
		if shm == "" {
			shm = "/dev/shm"
		}
		if err := os.WriteFile(running, []byte(fmt.Sprint(os.Getpid())), 0o644); err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		if err := os.WriteFile(filepath.Join(shm, Started), []byte(pipe), 0o644); err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		return 0
	}
	if _, err := os.Stat(running); err != nil {
		fmt.Fprintln(stdout, "Cannot find MPS control daemon process")
		return 1
	}
	sc := bufio.NewScanner(stdin)
	for sc.Scan() {
		cmd := strings.TrimSpace(sc.Text())
		if cmd == "" {
			continue
		}
		record("command " + cmd)
		switch f := strings.Fields(cmd); f[0] {
		case "get_default_active_thread_percentage":
			fmt.Fprintln(stdout, defaultOf(pipe, "set_default_active_thread_percentage", "100.0"))
		case "set_default_active_thread_percentage", "set_default_device_pinned_mem_limit":
			f, err := os.OpenFile(filepath.Join(pipe, Defaults), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
			if err != nil {
				fmt.Fprintln(stderr, err)
				return 1
			}
			fmt.Fprintln(f, cmd)
			f.Close()
		case "quit":
			if err := os.Remove(running); err != nil {
				fmt.Fprintln(stderr, err)
				return 1
			}
		default:
			fmt.Fprintf(stdout, "Invalid command %q\n", cmd)
			return 1
		}
	}
	return 0
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
