package main

import (
	"context"
	"io"
	"os"

	"github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook/commands"
	"github.com/sirupsen/logrus"
	"github.com/urfave/cli/v3"
)

// hookCommand returns NVIDIA's CDI hook commands (create-symlinks,
// update-ldcache, enable-cuda-compat, disable-device-node-modification,
// ...; chmod replaced by one that stays in the container's root), as
// nvidia-cdi-hook runs them: the specs nri-gpu generates name
// nri-gpu itself as their hook, so that a node needs no NVIDIA Container
// Toolkit for the driver's libraries to load in a container.
func hookCommand(stdout, stderr io.Writer) *cli.Command {
	log := logrus.New()
	log.SetOutput(stderr)
	cmd := commands.ConfigureCDIHookCommand(log, &cli.Command{
		Name:      "nri-gpu hook",
		Usage:     "CDI hooks for NVIDIA devices (nvidia-cdi-hook's), run by the runtime for the specs nri-gpu generates",
		Writer:    stdout,
		ErrWriter: stderr,
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "debug", Sources: cli.EnvVars("NVIDIA_CTK_DEBUG")},
			&cli.BoolFlag{Name: "quiet", Sources: cli.EnvVars("NVIDIA_CTK_QUIET")},
		},
	})
	// NVIDIA's chmod follows the image's symlinks out of the container.
	for i, c := range cmd.Commands {
		if c.Name == "chmod" {
			cmd.Commands[i] = chmodCommand(os.Stdin)
		}
	}
	return cmd
}

// isHook reports whether name is one of the hook commands.
func isHook(name string) bool {
	return name != "" && hookCommand(io.Discard, io.Discard).Command(name) != nil
}

// runHook runs a hook command with its arguments.
func runHook(args []string, stdout, stderr io.Writer) int {
	if err := hookCommand(stdout, stderr).Run(context.Background(), append([]string{"nri-gpu"}, args...)); err != nil {
		logrus.New().WithField("hook", args).Error(err)
		return exitError
	}
	return exitOK
}
