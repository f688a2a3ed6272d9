// Command nri-gpu is a containerd NRI plugin that injects CDI devices
// (GPUs and others) into containers, without relying on the runtime's own
// CDI support: the devices a pod asks for through its annotations,
// kubelet's device-plugin allocation (nri-gpu's own device plugin) or its
// DRA claims (nri-gpu's own DRA driver), judged by one policy over one
// pool of holdings.
//
// With no subcommand it runs the plugin: this is how containerd starts a
// pre-registered plugin from its plugin_path. Subcommands:
//
//	nri-gpu generate   write the CDI spec of this node's NVIDIA GPUs (NVML)
//	nri-gpu devices    list the devices nri-gpu can inject, and the GPUs
//	nri-gpu explain    show what nri-gpu would do for a pod, or why it refuses
//	nri-gpu access     what a pod's containers were given, or devices would give (a CDI spec)
//	nri-gpu check      check a node: NRI, containerd config, specs, hooks, DRA driver
//	nri-gpu validate   check configuration files
//	nri-gpu hook       the CDI hooks of the specs nri-gpu generates (nvidia-cdi-hook's)
//	nri-gpu install    copy nri-gpu into a host directory, for those hooks
//	nri-gpu version    nri-gpu's version, commit, Go, NRI and CDI library versions
//
// Every flag can also be set from the environment: --state-file from
// NRI_GPU_STATE_FILE. A flag on the command line beats its variable, which
// beats the configuration file.
package main

import (
	"fmt"
	"io"
	"os"
	"syscall"

	"github.com/nri-gpu/nri-gpu/pkg/plugin"
	"github.com/nri-gpu/nri-gpu/pkg/specs/nvidia"
)

// Exit codes.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
	// exitRestart is runPlugin's, for nri-gpu to be started again in
	// place: main executes it anew, as the same process.
	exitRestart = -1
)

func main() {
	code := run(os.Args[1:], os.Stdout, os.Stderr)
	if code == exitRestart {
		code = restart(os.Stderr)
	}
	os.Exit(code)
}

// restart executes nri-gpu anew, with the same arguments and
// environment, in place of this process (its pid, its container): a
// process that loaded a driver's NVML cannot load another (the NVIDIA
// driver was upgraded under it). Its record, NRI connection and DRA
// driver were let go before. It returns only on failure.
func restart(stderr io.Writer) int {
	self, err := os.Executable()
	if err == nil {
		err = syscall.Exec(self, os.Args, os.Environ())
	}
	fmt.Fprintf(stderr, "nri-gpu: starting again: %v\n", err)
	return exitError
}

// run runs a subcommand, or the plugin when there is none.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "generate":
			return runGenerate(args[1:], stdout, stderr, nvidia.Library)
		case "devices":
			return runDevices(args[1:], stdout, stderr)
		case "validate":
			return runValidate(args[1:], stdout, stderr)
		case "explain":
			return runExplain(args[1:], stdout, stderr)
		case "access":
			return runAccess(args[1:], stdout, stderr)
		case "check":
			return runCheck(args[1:], stdout, stderr)
		case "hook":
			return runHook(args[1:], stdout, stderr)
		case "install":
			return runInstall(args[1:], stdout, stderr)
		case "relay":
			return runRelay(args[1:], stderr)
		case plugin.MPSShmCommand:
			return runMPSShm(args[1:], stderr)
		case "version", "--version", "-version":
			return runVersion(stdout)
		}
		// The hooks of the specs nri-gpu generates run it as
		// nvidia-cdi-hook is run: "nri-gpu create-symlinks ...".
		if isHook(args[0]) {
			return runHook(args, stdout, stderr)
		}
	}
	return runPlugin(args, stderr)
}
