// Command nvidia-nri runs NVIDIA's own NRI plugin, the one in the NVIDIA
// Container Toolkit (v1.20.2, cmd/nvidia-ctk-installer/container/runtime/nri),
// against an NRI socket, for nri-gpu's tests of the two side by side. It
// serves until SIGTERM or SIGINT.
package main

import (
	"context"
	"flag"
	"os"
	"os/signal"
	"syscall"

	"github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-ctk-installer/container/runtime/nri"
	"github.com/sirupsen/logrus"
)

func main() {
	socket := flag.String("socket-path", "/var/run/nri/nri.sock", "NRI socket")
	idx := flag.String("idx", "20", "plugin index")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	log := logrus.New()
	log.SetOutput(os.Stderr)
	p := nri.NewPlugin(ctx, log, nil)
	if err := p.Start(ctx, *socket, *idx); err != nil {
		log.Fatal(err)
	}
	log.Info("NVIDIA's NRI plugin started")
	<-ctx.Done()
}
