package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nri-gpu/nri-gpu/test/harness"
)

// away measures how long a node's containerd (1.7) is without nri-gpu:
// from the moment the serving nri-gpu is told to stop (an upgrade's
// SIGTERM, the new one waiting with --take-over) or dies (SIGKILL, a new
// one started at once, as a supervisor would) until the next one has
// registered and synchronized. Containers created in between are created
// without nri-gpu (and stopped when it is back).
func (r *report) away(runs int) {
	r.printf("## Without nri-gpu: upgrade and crash\n\n")
	takeOver, crash, err := measureAway(runs)
	if err != nil {
		r.printf("not measured: %v\n\n", err)
		return
	}
	r.printf("%d runs each on containerd %s: from SIGTERM to the serving nri-gpu (a new one waiting with `--take-over`, as the chart's surge starts it) or its SIGKILL (a new one started at once, as a supervisor restarts it; the supervisor's own delay comes on top) until the next nri-gpu has registered and synchronized (its log read every millisecond). An upper bound on the window in which containerd creates containers without nri-gpu.\n\n", runs, containerdVersion())
	r.printf("| event | median | max |\n|---|---|---|\n")
	r.printf("| upgrade (take-over) | %s | %s |\n", ms(percentile(takeOver, 50)), ms(slices.Max(takeOver)))
	r.printf("| crash, restarted at once | %s | %s |\n\n", ms(percentile(crash, 50)), ms(slices.Max(crash)))
	r.results = append(r.results, target{"upgrade: node without nri-gpu, max", "≤ 100 ms", ms(slices.Max(takeOver)), slices.Max(takeOver) <= 100*time.Millisecond,
		"the old nri-gpu's shutdown after its NRI connection closed (waiting for its doors) and the new one's registration and synchronization with containerd"})
}

func measureAway(runs int) (takeOver, crash []time.Duration, err error) {
	b, err := newBenchHost("away")
	if b.dir != "" {
		defer os.RemoveAll(b.dir)
	}
	if err != nil {
		return nil, nil, err
	}
	tools, dir, image, host := b.tools, b.dir, b.image, b.host
	ctd, err := harness.StartContainerd(filepath.Join(dir, "ctd"), tools, harness.Options{Image: image})
	if err != nil {
		return nil, nil, err
	}
	defer ctd.Stop()
	cfg := filepath.Join(dir, "nri-gpu.yaml")
	if err := os.WriteFile(cfg, []byte(host.PluginConfig(nil)), 0o644); err != nil {
		return nil, nil, err
	}
	serving, err := ctd.StartPlugin("--config", cfg)
	if err != nil {
		return nil, nil, err
	}
	defer func() { serving.Stop() }()
	for range runs {
		next, err := ctd.StartStandby("--config", cfg)
		if err != nil {
			return nil, nil, err
		}
		start := time.Now()
		go func(old *harness.Plugin) { _, _ = old.Terminate(10 * time.Second) }(serving)
		serving = next
		for !strings.Contains(next.Log(), "Started plugin") {
			if time.Since(start) > 10*time.Second {
				return nil, nil, fmt.Errorf("the nri-gpu taking over did not register:\n%s", next.Log())
			}
			time.Sleep(time.Millisecond)
		}
		takeOver = append(takeOver, time.Since(start))
	}
	for range runs {
		start := time.Now()
		serving.Kill()
		if serving, err = ctd.StartPlugin("--config", cfg); err != nil {
			return nil, nil, err
		}
		crash = append(crash, time.Since(start))
	}
	return takeOver, crash, nil
}
