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

	"github.com/nri-gpu/nri-gpu/pkg/mps"
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

// command is one of nri-gpu's subcommands: its name, what it does in a
// line (nri-gpu help), and what runs it with its arguments.
type command struct {
	name, summary string
	run           func(args []string, stdout, stderr io.Writer) int
}

// subcommands returns nri-gpu's subcommands, in the order nri-gpu help
// lists them.
func subcommands() []command {
	return []command{
		{"generate", "write the CDI spec of this node's NVIDIA GPUs (NVML)", func(args []string, stdout, stderr io.Writer) int {
			return runGenerate(args, stdout, stderr, nvidia.Library)
		}},
		{"devices", "list the devices nri-gpu can inject, and the GPUs", runDevices},
		{"explain", "show what nri-gpu would do for a pod, or why it refuses", runExplain},
		{"access", "what a pod's containers were given, or devices would give (a CDI spec)", runAccess},
		{"check", "check a node: NRI, containerd config, specs, hooks, DRA driver", runCheck},
		{"validate", "check configuration files", runValidate},
		{"hook", "the CDI hooks of the specs nri-gpu generates (nvidia-cdi-hook's)", runHook},
		{"install", "copy nri-gpu into a host directory, for those hooks", runInstall},
		{"relay", "keep kubelet's device-plugin endpoint while nri-gpu is away (the chart's relay container)", func(args []string, _, stderr io.Writer) int {
			return runRelay(args, stderr)
		}},
		{"version", "nri-gpu's version, commit, Go, NRI and CDI library versions", runVersion},
		{"help", "this list; nri-gpu help COMMAND: that command's flags", runHelp},
		{mps.ShmCommand, "(nri-gpu's own) run an MPS control daemon with a /dev/shm its clients share", func(args []string, _, stderr io.Writer) int {
			return runMPSShm(args, stderr)
		}},
	}
}

// run runs a subcommand, or the plugin when there is none.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		for _, c := range subcommands() {
			if c.name == args[0] {
				return c.run(args[1:], stdout, stderr)
			}
		}
		switch args[0] {
		case "--version", "-version":
			return runVersion(nil, stdout, stderr)
		case "--help", "-help", "-h":
			usage(stdout)
			return exitOK
		}
		// The hooks of the specs nri-gpu generates run it as
		// nvidia-cdi-hook is run: "nri-gpu create-symlinks ...".
		if isHook(args[0]) {
			return runHook(args, stdout, stderr)
		}
	}
	return runPlugin(args, stderr)
}

// usage writes how nri-gpu is run: the plugin with its flags, and each
// subcommand with a line.
func usage(w io.Writer) {
	fmt.Fprintf(w, "Usage:\n  nri-gpu [FLAGS]             run the NRI plugin (how containerd starts a pre-registered one)\n  nri-gpu COMMAND [FLAGS]     run a command\n\nCommands:\n")
	for _, c := range subcommands() {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "\nEach command's flags: nri-gpu COMMAND --help. Every flag can also be set from the environment\n(--state-file from NRI_GPU_STATE_FILE).\n\nThe plugin's flags:\n")
	pluginFlags(w).fs.PrintDefaults()
}

// runHelp lists the commands, or, given one, has it say its flags.
func runHelp(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stdout)
		return exitOK
	}
	for _, c := range subcommands() {
		if c.name == args[0] && c.name != "help" {
			return c.run([]string{"--help"}, stdout, stderr)
		}
	}
	fmt.Fprintf(stderr, "nri-gpu help: unknown command %q; nri-gpu help lists them\n", args[0])
	return exitUsage
}
