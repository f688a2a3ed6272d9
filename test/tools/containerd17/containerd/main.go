// Command containerd is containerd v1.7's daemon, built from its Go module
// for the end-to-end tests.
package main

import (
	"fmt"
	"os"

	"github.com/containerd/containerd/cmd/containerd/command"

	_ "github.com/containerd/containerd/cmd/containerd/builtins"
)

func main() {
	app := command.App()
	if err := app.Run(os.Args); err != nil {
		fmt.Fprintf(os.Stderr, "containerd: %s\n", err)
		os.Exit(1)
	}
}
