package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	"github.com/sirupsen/logrus"
	"google.golang.org/protobuf/proto"

	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/plugin"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
	"github.com/nri-gpu/nri-gpu/test/harness"
)

const samples = 2000

func quiet() *logrus.Logger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}

// newPlugin loads n bench spec files into a temp dir and returns nri-gpu
// serving them.
func newPlugin(n int) (*plugin.Plugin, func()) {
	dir, err := os.MkdirTemp("", "nri-gpu-bench-")
	must(err)
	must(harness.WriteBenchSpecs(dir, n))
	p, err := plugin.New(config.Default(), quiet(), plugin.WithSpecDirs([]string{dir}))
	must(err)
	_, err = p.Synchronize(context.Background(), nil, nil)
	must(err)
	return p, func() { p.Close(); _ = os.RemoveAll(dir) }
}

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func request(n int) (*api.PodSandbox, *api.Container) {
	return &api.PodSandbox{Id: "p", Name: "p", Namespace: "ns", Annotations: map[string]string{"gpus.nri-gpu.io": harness.BenchRequest(n)}},
		&api.Container{Id: "c", PodSandboxId: "p", Name: "c", Linux: &api.LinuxContainer{}}
}

// requestPath times CreateContainer in process, without NRI.
func (r *report) requestPath(goBench string) {
	r.printf("## Request path\n\nnri-gpu's `CreateContainer` in process (annotation, policy, resolution in the spec snapshot, adjustment, the decision's log line), %d requests per cell after %d of warm-up, at Go's default garbage collector target.\n\n", samples, samples)
	r.printf("| spec files | devices | p50 | p99 |\n|---|---|---|---|\n")
	var worst time.Duration
	for _, specs := range []int{10, 100, 1000} {
		p, done := newPlugin(specs)
		for _, n := range []int{1, 8, 64} {
			ds := timeRequests(p, n)
			r.printf("| %d | %d | %s | %s |\n", specs, n, us(percentile(ds, 50)), us(percentile(ds, 99)))
			if specs == 1000 && n == 64 {
				worst = percentile(ds, 99)
			}
		}
		done()
	}
	r.results = append(r.results, target{"request path p99, 64 devices, 1000 specs", "< 1 ms", us(worst), worst < time.Millisecond,
		"the garbage collector and the machine's scheduling"})
	if goBench != "" {
		r.printf("\nGo benchmarks (`go test -bench . -benchmem`), mean per request and allocations:\n\n```\n%s```\n\n", grepBench(goBench, "BenchmarkCreateContainer"))
	}
}

// timeRequests times samples requests for n devices after as many of
// warm-up.
func timeRequests(p *plugin.Plugin, n int) []time.Duration {
	pod, ctr := request(n)
	runtime.GC()
	ds := make([]time.Duration, 0, samples)
	for i := 0; i < 2*samples; i++ {
		start := time.Now()
		_, _, err := p.CreateContainer(context.Background(), pod, ctr)
		d := time.Since(start)
		must(err)
		if i >= samples {
			ds = append(ds, d)
		}
	}
	return ds
}

func grepBench(file, prefix string) string {
	data, err := os.ReadFile(file)
	if err != nil {
		return err.Error() + "\n"
	}
	var b strings.Builder
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, prefix) {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

type noop struct{}

func (noop) CreateContainer(context.Context, *api.PodSandbox, *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	return nil, nil, nil
}

// runtimeWith starts NRI's runtime side, as the given containerd version,
// on a socket and connects a plugin to it with connect; it returns the
// runtime and a stop function.
func runtimeWith(version string, connect func(ctx context.Context, opts ...stub.Option)) (*adaptation.Adaptation, func()) {
	dir, err := os.MkdirTemp("/tmp", "nri-gpu-bench-rt-")
	must(err)
	sock := filepath.Join(dir, "nri.sock")
	sync := func(ctx context.Context, cb adaptation.SyncCB) error { _, err := cb(ctx, nil, nil); return err }
	upd := func(context.Context, []*adaptation.ContainerUpdate) ([]*adaptation.ContainerUpdate, error) {
		return nil, nil
	}
	rt, err := adaptation.New("containerd", version, sync, upd, adaptation.WithSocketPath(sock),
		adaptation.WithPluginPath(filepath.Join(dir, "p")), adaptation.WithPluginConfigPath(filepath.Join(dir, "c")))
	must(err)
	must(rt.Start())
	ctx, cancel := context.WithCancel(context.Background())
	go connect(ctx, stub.WithSocketPath(sock), stub.WithPluginName("bench"), stub.WithPluginIdx("10"))
	// Wait until the plugin is there: a request comes back adjusted or not.
	time.Sleep(500 * time.Millisecond)
	return rt, func() { cancel(); rt.Stop(); _ = os.RemoveAll(dir) }
}

// protocol times CreateContainer round trips through NRI's runtime side
// over a socket: a no-op plugin against nri-gpu as on containerd 1.7 (one
// round trip) and as on containerd 2.2 and later (and its validation, a
// second round trip), interleaved in blocks.
func (r *report) protocol() {
	noopRT, stopNoop := runtimeWith("v1.7.35", func(ctx context.Context, opts ...stub.Option) {
		s, err := stub.New(noop{}, opts...)
		must(err)
		_ = s.Run(ctx)
	})
	defer stopNoop()
	rts := []*adaptation.Adaptation{noopRT} // the floor first, then nri-gpu on each runtime
	for _, version := range []string{"v1.7.35", "v2.3.7"} {
		p, done := newPlugin(100)
		defer done()
		rt, stop := runtimeWith(version, func(ctx context.Context, opts ...stub.Option) { _ = p.Serve(ctx, opts...) })
		defer stop()
		rts = append(rts, rt)
	}
	pod, ctr := request(1)
	ds := make([][]time.Duration, len(rts))
	for block := 0; block < samples/100+2; block++ {
		for k, rt := range rts {
			for i := 0; i < 100; i++ {
				// A new request each time: the runtime side applies the
				// plugins' adjustments to the container it is given.
				req := &adaptation.CreateContainerRequest{Pod: pod, Container: proto.Clone(ctr).(*api.Container)}
				start := time.Now()
				rpl, err := rt.CreateContainer(context.Background(), req)
				d := time.Since(start)
				must(err)
				if k > 0 && len(rpl.GetAdjust().GetLinux().GetDevices()) != 1 {
					must(fmt.Errorf("nri-gpu did not answer through NRI"))
				}
				if block >= 2 { // else warm-up
					ds[k] = append(ds[k], d)
				}
			}
		}
	}
	r.printf("## NRI protocol round trip\n\n`CreateContainer` through NRI's real runtime side (`pkg/adaptation`) over a unix socket, %d requests each, interleaved in blocks of 100; nri-gpu with 100 spec files, one device asked for. On a runtime whose NRI asks validators (containerd 2.2 and later) nri-gpu also validates the adjustment (another plugin must not inject its devices again): a second round trip.\n\n", len(ds[0]))
	r.printf("| plugin | p50 | p99 |\n|---|---|---|\n")
	for k, name := range []string{"no-op (the floor)", "nri-gpu (containerd 1.7)", "nri-gpu and its validation (containerd 2.2 on)"} {
		r.printf("| %s | %s | %s |\n", name, us(percentile(ds[k], 50)), us(percentile(ds[k], 99)))
	}
	r.printf("\n")
	for k, name := range []string{"protocol p99 / no-op p99", "protocol p99 with validation / no-op p99"} {
		ratio := float64(percentile(ds[k+1], 99)) / float64(percentile(ds[0], 99))
		r.results = append(r.results, target{name, "≤ 1.5", fmt.Sprintf("%.2f", ratio), ratio <= 1.5,
			"nri-gpu's own work per request (the request path above, and the adjustment's protobuf on the wire) against a bare ttrpc round trip with an empty reply, a few tens of microseconds"})
	}
}

// specs reports full loads from the Go benchmark and times the pick-up of
// a change with 1000 spec files.
func (r *report) specs(goBench string) {
	r.printf("## Spec load and refresh\n\n")
	if goBench != "" {
		r.printf("A full load of the spec dirs (what every refresh does: every file opened, checked and parsed with CDI, then footprints and host nodes):\n\n```\n%s```\n\n", grepBench(goBench, "BenchmarkLoad"))
	}
	dir, err := os.MkdirTemp("", "nri-gpu-bench-specs-")
	must(err)
	defer os.RemoveAll(dir)
	must(harness.WriteBenchSpecs(dir, 1000))
	reg, err := specs.Open([]string{dir})
	must(err)
	defer reg.Close()
	var ds []time.Duration
	for i := 0; i < 10; i++ {
		name := fmt.Sprintf("example.com/new%d=0", i)
		spec := fmt.Sprintf("cdiVersion: \"0.6.0\"\nkind: example.com/new%d\ndevices: [{name: \"0\", containerEdits: {env: [A=1]}}]\n", i)
		start := time.Now()
		must(os.WriteFile(filepath.Join(dir, fmt.Sprintf("new%d.yaml", i)), []byte(spec), 0o644))
		for {
			if _, err := reg.Snapshot().Resolve([]string{name}); err == nil {
				break
			}
			time.Sleep(time.Millisecond)
		}
		ds = append(ds, time.Since(start))
	}
	med := percentile(ds, 50)
	r.printf("A spec added beside 1000 others is injectable after (median of 10): **%s** (of which 50 ms is the wait for a burst of changes to settle).\n\n", ms(med))
	refresh := med - 50*time.Millisecond
	r.results = append(r.results, target{"refresh of 1000 specs", "< 200 ms", ms(refresh) + " (pick-up less the 50 ms settle)", refresh < 200*time.Millisecond,
		"reading, checking and parsing 1000 spec files with CDI"})
}

// memory runs the nri-gpu binary with 1000 specs loaded and reads its
// RSS, with DRA off (nri-gpu alone) and on (nri-gpu and the DRA driver it
// starts, nri-gpu-dra, whose kubeconfig names a loopback port where no API
// server listens: the floor of what DRA costs, before any claim or pod
// is known).
func (r *report) memory() {
	bin := filepath.Join(os.Getenv(harness.ToolsEnv), "nri-gpu")
	dir, err := os.MkdirTemp("/tmp", "nri-gpu-bench-rss-") // short: it holds unix sockets
	must(err)
	defer os.RemoveAll(dir)
	must(os.Mkdir(filepath.Join(dir, "specs"), 0o755))
	must(harness.WriteBenchSpecs(filepath.Join(dir, "specs"), 1000))
	kubeconfig := filepath.Join(dir, "kubeconfig")
	must(os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: none, cluster: {server: "https://127.0.0.1:1"}}]
contexts: [{name: none, context: {cluster: none, user: none}}]
users: [{name: none, user: {token: none}}]
current-context: none
`), 0o600))
	draConfig := filepath.Join(dir, "dra.yaml")
	must(os.WriteFile(draConfig, fmt.Appendf(nil, "version: v1\nstart:\n  dra: {enabled: true, nodeName: bench, kubeconfig: %s, pluginDir: %s, registryDir: %s}\n",
		kubeconfig, filepath.Join(dir, "plugins"), filepath.Join(dir, "registry")), 0o644))
	must(os.MkdirAll(filepath.Join(dir, "plugins", config.DefaultDRADriverName), 0o755))
	must(os.MkdirAll(filepath.Join(dir, "registry"), 0o755))
	r.printf("## Memory\n\nThe nri-gpu binary with 1000 spec files loaded, RSS after 3 s. With DRA on, nri-gpu starts its DRA driver, `nri-gpu-dra`, a process of its own (Kubernetes' client initialises its API schemes in every process that links it, so nri-gpu does not); here its kubeconfig names a loopback port where no API server listens: the floor of what DRA costs.\n\n")
	r.printf("| DRA | nri-gpu | nri-gpu-dra | together |\n|---|---|---|---|\n")
	var off int
	for _, on := range []bool{false, true} {
		args := []string{"--cdi-spec-dirs", filepath.Join(dir, "specs"), "--socket-path", filepath.Join(dir, "none.sock"), "--state-file", filepath.Join(dir, "state.json"), "--access-dir", filepath.Join(dir, "access")}
		if on {
			args = append(args, "--config", draConfig)
		}
		cmd := exec.Command(bin, args...)
		if err := cmd.Start(); err != nil {
			r.printf("not measured: %v\n\n", err)
			return
		}
		time.Sleep(3 * time.Second)
		rss := status(cmd.Process.Pid, "VmRSS")
		var driver int
		for _, child := range children(cmd.Process.Pid) {
			driver += status(child, "VmRSS")
		}
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		if !on {
			off = rss
			r.printf("| off | %d MiB | (not started) | %d MiB |\n", rss/1024, rss/1024)
			continue
		}
		r.printf("| on | %d MiB | %d MiB | %d MiB |\n", rss/1024, driver/1024, (rss+driver)/1024)
	}
	r.printf("\n")
	r.results = append(r.results, target{"RSS with 1000 specs, DRA off", "< 32 MiB", fmt.Sprintf("%d MiB", off/1024), off < 32*1024,
		"the CDI cache keeps every parsed spec, and the snapshot an entry per device"})
}

// children returns the pids of a process's children.
func children(pid int) []int {
	var out []int
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			var child int
			if _, err := fmt.Sscan(f, &child); err == nil {
				out = append(out, child)
			}
		}
	}
	return out
}

// status reads a kB field of /proc/PID/status.
func status(pid int, field string) int {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && k == field {
			var kb int
			fmt.Sscan(v, &kb)
			return kb
		}
	}
	return 0
}
