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

// podUIDEnv is the pod's UID, which the chart sets (the downward API's
// metadata.uid): the DRA driver then registers for kubelet's rolling
// update, under a socket of its pod's own, and is started before nri-gpu
// takes over from the one it replaces.
const podUIDEnv = "POD_UID"

// driverProgram is the DRA driver's program: beside nri-gpu's own, or
// else on the PATH.
const driverProgram = "nri-gpu-dra"

// driverRestart is how long nri-gpu waits to start a driver that quit
// again.
const driverRestart = 5 * time.Second

// draDriver returns nri-gpu's DRA driver, a process of its own
// (Kubernetes' client is paid for only there) served the plugin's specs
// and pool over the link once pool is set (the plugin's DRAView), for the
// claims its containers use; and run, which runs the driver until ctx is
// done. It
// returns an error for a configuration that cannot work (no node name, no
// driver program); a driver that quits is started again, but one whose
// own configuration cannot work (no credentials for the API server) stops
// nri-gpu, through fail.
func draDriver(opts link.Options, stderr io.Writer, log logrus.FieldLogger, fail context.CancelCauseFunc) (plugin.DRADriver, *link.Later, func(context.Context), error) {
	opts.Node = nodeName(opts.DRA.NodeName)
	if opts.Node == "" {
		return nil, nil, nil, fmt.Errorf("dra: no node name: set dra.nodeName or the %s environment variable", nodeNameEnv)
	}
	path, err := driverPath()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("dra: %w", err)
	}
	// The pool the driver is served is the plugin's, once it is built
	// (pool.Set): a driver started before (a rolling update) waits for it.
	pool := link.NewLater()
	proc := link.NewProcess(path, opts.Args(), stderr, pool)
	run := func(ctx context.Context) {
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
	}
	return proc, pool, run, nil
}

// nodeName is the node's name: configured (dra.nodeName), or else the
// NODE_NAME environment variable.
func nodeName(configured string) string {
	if configured != "" {
		return configured
	}
	return os.Getenv(nodeNameEnv)
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
