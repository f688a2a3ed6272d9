// Command bench measures what nri-gpu adds to container creation and
// writes BENCHMARKS.md: the request path, the NRI protocol round trip
// against a no-op plugin, crictl create end to end on containerd 1.7 with
// no plugin, with containerd's own CDI and with nri-gpu (interleaved), spec
// load and refresh times, the plugin's memory, and pod start on a real
// cluster with nri-gpu and with containerd's own CDI injecting. `make bench` runs it.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"time"
)

func main() {
	var (
		goBench = flag.String("go-bench", "", "output of go test -bench for the request path and spec loads")
		out     = flag.String("out", "BENCHMARKS.md", "file to write")
		e2eRuns = flag.Int("e2e-runs", 40, "crictl create runs per setup")
		rounds  = flag.Int("cluster-rounds", 20, "batches of pods of each kind on the cluster")
		only    = flag.String("only", "", "run only this section (request, protocol, specs, memory, metrics, bounds, e2e, away, cluster) and print it; for profiling")
	)
	flag.Parse()
	r := &report{}
	sections := []struct {
		name string
		run  func()
	}{
		{"request", func() { r.requestPath(*goBench) }},
		{"protocol", r.protocol},
		{"specs", func() { r.specs(*goBench) }},
		{"memory", r.memory},
		{"metrics", r.metricsCost},
		{"bounds", r.memoryBounds},
		{"e2e", func() { r.endToEnd(*e2eRuns) }},
		{"away", func() { r.away(10) }},
		{"cluster", func() { r.cluster(*rounds) }},
	}
	if *only != "" {
		for _, s := range sections {
			if s.name == *only {
				s.run()
				fmt.Print(r.buf.String())
				return
			}
		}
		fmt.Fprintf(os.Stderr, "bench: -only %q: no such section\n", *only)
		os.Exit(2)
	}
	r.header()
	for _, s := range sections {
		s.run()
	}
	r.targets()
	r.history(*out)
	if err := os.WriteFile(*out, r.buf.Bytes(), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Print(r.buf.String())
}

// report collects the sections and the numbers the targets need.
type report struct {
	buf     bytes.Buffer
	results []target
}

// target is a goal and what was measured against it.
type target struct {
	name, goal, measured string
	met                  bool
	bound                string // what bounds it, when missed
}

func (r *report) printf(format string, args ...any) { fmt.Fprintf(&r.buf, format, args...) }

func (r *report) header() {
	r.printf("# Benchmarks\n\nWritten by `make bench` on %s. Reproduce with `make bench` (root; it builds what it needs).\n\n",
		time.Now().UTC().Format("2006-01-02 15:04 MST"))
	r.printf("| | |\n|---|---|\n")
	r.printf("| machine | %s, %d cores, %s memory |\n", cpuModel(), runtime.NumCPU(), memTotal())
	r.printf("| kernel | %s |\n", strings.TrimSpace(run("uname", "-r")))
	r.printf("| Go | %s |\n", runtime.Version())
	r.printf("| containerd | %s (NRI %s) |\n", containerdVersion(), "v0.8.0")
	r.printf("| nri-gpu's NRI library | %s |\n\n", "v0.12.5")
}

// percentile returns the p-th percentile (0-100) of ds.
func percentile(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s)-1) * p / 100)
	return s[i]
}

func us(d time.Duration) string { return fmt.Sprintf("%.1f µs", float64(d)/float64(time.Microsecond)) }

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }

func run(name string, args ...string) string {
	out, _ := exec.Command(name, args...).Output()
	return string(out)
}

func cpuModel() string {
	data, _ := os.ReadFile("/proc/cpuinfo")
	for _, line := range strings.Split(string(data), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}

func memTotal() string {
	data, _ := os.ReadFile("/proc/meminfo")
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "MemTotal:") {
			var kb int
			fmt.Sscan(strings.TrimPrefix(line, "MemTotal:"), &kb)
			return fmt.Sprintf("%.0f GiB", float64(kb)/1024/1024)
		}
	}
	return "?"
}

// historyHeading starts the part of BENCHMARKS.md that people write: what
// changes did to the numbers. A run keeps it as it is.
const historyHeading = "\n## History\n"

// history copies the history of the file the report replaces.
func (r *report) history(file string) {
	old, err := os.ReadFile(file)
	if err != nil {
		return
	}
	if i := bytes.Index(old, []byte(historyHeading)); i >= 0 {
		r.buf.Write(old[i:])
	}
}
