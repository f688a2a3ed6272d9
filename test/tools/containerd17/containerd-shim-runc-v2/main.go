// Command containerd-shim-runc-v2 is containerd v1.7's runc shim, built from
// its Go module for the end-to-end tests.
package main

import (
	"context"

	"github.com/containerd/containerd/runtime/v2/runc/manager"
	"github.com/containerd/containerd/runtime/v2/shim"

	_ "github.com/containerd/containerd/runtime/v2/runc/pause"
	_ "github.com/containerd/containerd/runtime/v2/runc/task/plugin"
)

func main() {
	shim.RunManager(context.Background(), manager.NewShimManager("io.containerd.runc.v2"))
}
