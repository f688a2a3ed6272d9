package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
	"github.com/nri-gpu/nri-gpu/pkg/plugin"
)

// nodeNameEnv names the node when dra.nodeName does not (the chart sets
// it from the pod's spec.nodeName).
const nodeNameEnv = "NODE_NAME"

// driverProgram is the DRA driver's program: beside nri-gpu's own, or
// else on the PATH.
const driverProgram = "nri-gpu-dra"

// driverRestart is how long nri-gpu waits to start a driver that quit
// again.
const driverRestart = 5 * time.Second

// startDRA starts nri-gpu's DRA driver, a process of its own (Kubernetes'
// client is paid for only here), served p's specs and pool over the link,
// and has p inject the claims its containers use. It returns an error for
// a configuration that cannot work (no node name, no driver program);
// a driver that quits is started again, but one whose own configuration
// cannot work (no credentials for the API server) stops nri-gpu, through
// fail.
func startDRA(ctx context.Context, opts link.Options, p *plugin.Plugin, stderr io.Writer, log logrus.FieldLogger, fail context.CancelCauseFunc) error {
	opts.Node = opts.DRA.NodeName
	if opts.Node == "" {
		opts.Node = os.Getenv(nodeNameEnv)
	}
	if opts.Node == "" {
		return fmt.Errorf("dra: no node name: set dra.nodeName or the %s environment variable", nodeNameEnv)
	}
	path, err := driverPath()
	if err != nil {
		return fmt.Errorf("dra: %w", err)
	}
	proc := link.NewProcess(path, opts.Args(), stderr, p.DRAView(opts.DRA))
	p.UseClaims(proc)
	p.OnHeldChange(proc.Notify)
	go func() {
		for {
			err := proc.Run(ctx)
			if ctx.Err() != nil {
				return
			}
			if errors.Is(err, link.ErrDriverConfig) {
				fail(err)
				return
			}
			log.Warnf("%v; starting it again in %s", err, driverRestart)
			select {
			case <-ctx.Done():
				return
			case <-time.After(driverRestart):
			}
		}
	}()
	return nil
}

// driverPath finds the DRA driver's program.
func driverPath() (string, error) {
	if self, err := os.Executable(); err == nil {
		path := filepath.Join(filepath.Dir(self), driverProgram)
		if _, err := os.Stat(path); err == nil {
			return path, nil
		}
	}
	path, err := exec.LookPath(driverProgram)
	if err != nil {
		return "", fmt.Errorf("%s is neither beside nri-gpu nor on the PATH: %w", driverProgram, err)
	}
	return path, nil
}
