package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os/signal"
	"sync"
	"syscall"

	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/pkg/deviceplugin"
)

// runRelay serves kubelet each resource of start.devicePlugin for the
// nri-gpu that serves it at start.devicePlugin.relay, until SIGTERM: a
// process of its own, so that kubelet's endpoint stays while nri-gpu is
// away (docs/operations.md).
func runRelay(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("nri-gpu relay", flag.ContinueOnError)
	fs.SetOutput(stderr)
	flags := addConfigFlags(fs)
	logs := addLogFlags(fs)
	if code, done := parseFlags(fs, args); done {
		return code
	}
	log := logrus.New()
	log.SetOutput(stderr)
	if err := logs.apply(log); err != nil {
		fmt.Fprintf(stderr, "nri-gpu relay: %v\n", err)
		return exitUsage
	}
	cfg, err := flags.load()
	if err != nil {
		fmt.Fprintf(stderr, "nri-gpu relay: %v\n", err)
		return exitUsage
	}
	dp := cfg.Start.DevicePlugin
	if dp.Relay == "" || len(dp.Resources) == 0 {
		fmt.Fprintln(stderr, "nri-gpu relay: the configuration sets no start.devicePlugin.relay, or no resources")
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	var wg sync.WaitGroup
	for _, r := range dp.Resources {
		rlog := log.WithField("resource", r.Name)
		up := deviceplugin.NewUpstream(deviceplugin.RelaySocket(dp.Relay, r.Name), rlog)
		d := deviceplugin.New(r, dp.KubeletDir, dp.CDIDevices, up, log)
		wg.Add(2)
		go func() { defer wg.Done(); up.Run(ctx, d.Notify) }()
		go func() {
			defer wg.Done()
			select {
			case <-up.Answered():
				_ = d.Run(ctx)
			case <-ctx.Done():
			}
		}()
	}
	wg.Wait()
	return exitOK
}
