package main

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/metrics"
	"github.com/nri-gpu/nri-gpu/pkg/plugin"
	"github.com/nri-gpu/nri-gpu/test/harness"
)

// scrapeEvery is how often the bench scrapes nri-gpu while it times the
// request path with metrics on: far more often than a Prometheus does
// (15 to 60 s).
const scrapeEvery = 100 * time.Millisecond

// metricsCost times the request path with metrics off and on, and a
// scrape, and reads the RSS of nri-gpu with metrics off and on: what the
// metrics cost a node, and that they cost one with metrics off nothing.
func (r *report) metricsCost() {
	dir, err := os.MkdirTemp("/tmp", "nri-gpu-bench-metrics-")
	must(err)
	defer os.RemoveAll(dir)
	host, err := harness.NewGPUHost(dir, 16)
	must(err)
	cfg, err := config.Parse([]byte(host.PluginConfig(nil)))
	must(err)
	build := func(opts ...plugin.Option) *plugin.Plugin {
		p, err := plugin.New(cfg, quiet(), opts...)
		must(err)
		_, err = p.Synchronize(context.Background(), nil, nil)
		must(err)
		return p
	}
	off := build()
	defer off.Close()
	m := metrics.New()
	on := build(plugin.WithMetrics(m))
	defer on.Close()
	// 15 pods hold a GPU each on both; the timed pod asks for GPU 15.
	for i := range 15 {
		pod := &api.PodSandbox{Id: fmt.Sprintf("held-%d", i), Name: fmt.Sprintf("held-%d", i), Namespace: "ns", Annotations: map[string]string{"gpus.nri-gpu.io": fmt.Sprint(i)}}
		ctr := &api.Container{Id: pod.Id, PodSandboxId: pod.Id, Name: "c", Linux: &api.LinuxContainer{}}
		for _, p := range []*plugin.Plugin{off, on} {
			_, _, err := p.CreateContainer(context.Background(), pod, ctr)
			must(err)
		}
	}
	scrape := func() time.Duration {
		start := time.Now()
		rec := httptest.NewRecorder()
		m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		return time.Since(start)
	}
	// The scraper scrapes while the "on, scraped" blocks run.
	var scraping atomic.Bool
	ctx, stop := context.WithCancel(context.Background())
	scraped := make(chan struct{})
	go func() {
		defer close(scraped)
		for tick := time.NewTicker(scrapeEvery); ; {
			select {
			case <-ctx.Done():
				tick.Stop()
				return
			case <-tick.C:
				if scraping.Load() {
					scrape()
				}
			}
		}
	}()
	pod := &api.PodSandbox{Id: "timed", Name: "timed", Namespace: "ns", Annotations: map[string]string{"gpus.nri-gpu.io": "15"}}
	ctr := &api.Container{Id: "timed", PodSandboxId: "timed", Name: "c", Linux: &api.LinuxContainer{}}
	variants := []struct {
		name    string
		p       *plugin.Plugin
		scraped bool
	}{{"off", off, false}, {"on", on, false}, {"on, scraped", on, true}}
	// Interleaved blocks, after a warm-up of each.
	const blocks = 20
	times := make([][]time.Duration, len(variants))
	for b := -1; b < blocks; b++ {
		for i, v := range variants {
			scraping.Store(v.scraped)
			runtime.GC()
			for range samples / blocks {
				start := time.Now()
				_, _, err := v.p.CreateContainer(context.Background(), pod, ctr)
				d := time.Since(start)
				must(err)
				if b >= 0 {
					times[i] = append(times[i], d)
				}
			}
		}
	}
	stop()
	<-scraped
	var scrapes []time.Duration
	for range 200 {
		scrapes = append(scrapes, scrape())
	}
	slices.Sort(scrapes)

	r.printf("## Metrics\n\nnri-gpu's `CreateContainer` in process on a host of 16 fake GPUs, 15 held by pods through annotations and the 16th asked for, %d requests each with metrics off, on, and on while `/metrics` is scraped every %s (a Prometheus scrapes every 15 to 60 s), interleaved in blocks of %d. With metrics on a request counts itself (its result, its duration); who holds which GPU is read from the pool at each scrape, none of it on the request path.\n\n", samples, scrapeEvery, samples/blocks)
	r.printf("| metrics | p50 | p99 |\n|---|---|---|\n")
	for i, v := range variants {
		r.printf("| %s | %s | %s |\n", v.name, us(percentile(times[i], 50)), us(percentile(times[i], 99)))
	}
	r.printf("\nA scrape of those 16 GPUs and their 16 holders: %s median, %s p99 (200 scrapes).\n\n", us(percentile(scrapes, 50)), us(percentile(scrapes, 99)))
	ratio := float64(percentile(times[2], 50)) / float64(percentile(times[1], 50))
	r.results = append(r.results, target{"request path p50, metrics scraped / not scraped", "≤ 1.05", fmt.Sprintf("%.3f", ratio), ratio <= 1.05,
		"the machine's scheduling: the scraper runs on the other core, and the request path does no work for a scrape"})
	r.metricsMemory(dir, host)
}

// metricsMemory reads the RSS of the nri-gpu binary, with metrics off
// (no --metrics-address) and on, serving a scrape.
func (r *report) metricsMemory(dir string, host *harness.GPUHost) {
	bin := filepath.Join(os.Getenv(harness.ToolsEnv), "nri-gpu")
	conf := filepath.Join(dir, "nri-gpu.yaml")
	must(os.WriteFile(conf, []byte(host.PluginConfig(nil)), 0o644))
	rss := map[bool]int{}
	for _, on := range []bool{false, true} {
		args := []string{"--config", conf, "--socket-path", filepath.Join(dir, "none.sock"), "--state-file", filepath.Join(dir, fmt.Sprintf("state-%v.json", on)), "--access-dir", filepath.Join(dir, "access")}
		if on {
			args = append(args, "--metrics-address", "127.0.0.1:0")
		}
		cmd := exec.Command(bin, args...)
		if err := cmd.Start(); err != nil {
			r.printf("RSS not measured: %v\n\n", err)
			return
		}
		time.Sleep(3 * time.Second)
		rss[on] = status(cmd.Process.Pid, "VmRSS")
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}
	r.printf("The nri-gpu binary on that host, RSS after 3 s: %d MiB with metrics off, %d MiB on (`--metrics-address`).\n\n", rss[false]/1024, rss[true]/1024)
}
