// Command ctr is containerd v1.7's client, built from its Go module for the
// end-to-end tests.
package main

import (
	"fmt"
	"os"

	"github.com/containerd/containerd/cmd/ctr/app"
)

func main() {
	if err := app.New().Run(os.Args); err != nil {
		fmt.Fprintf(os.Stderr, "ctr: %s\n", err)
		os.Exit(1)
	}
}
