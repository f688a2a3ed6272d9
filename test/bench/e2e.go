package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nri-gpu/nri-gpu/test/harness"
)

func containerdVersion() string {
	tools, err := harness.FindTools("")
	if err != nil {
		return "not found"
	}
	return tools.ContainerdVersion
}

// setup is one containerd of the end-to-end comparison.
type setup struct {
	name string
	ctd  *harness.Containerd
	pod  harness.Pod
	id   string
	ann  map[string]string // container annotations
	ds   []time.Duration
}

// endToEnd times crictl create on three containerd 1.7 setups, interleaved
// so that machine noise hits all three: no plugin, containerd's own CDI,
// and nri-gpu.
func (r *report) endToEnd(runs int) {
	r.printf("## End to end: `crictl create` on containerd %s\n\n", containerdVersion())
	setups, cleanup, err := startSetups()
	defer cleanup()
	if err != nil {
		r.printf("not measured: %v\n\n", err)
		return
	}
	for i := 0; i < runs+3; i++ {
		for _, s := range setups {
			start := time.Now()
			id, err := s.ctd.CreateContainer(s.id, s.pod, harness.Container{Name: fmt.Sprintf("c%d", i), Annotations: s.ann})
			d := time.Since(start)
			must(err)
			if i >= 3 {
				s.ds = append(s.ds, d)
			}
			_, _ = s.ctd.Crictl("rm", id)
		}
	}
	r.printf("%d runs each, interleaved; one device (a fake GPU) for the CDI and nri-gpu setups. The time includes starting crictl.\n\n", runs)
	r.printf("| setup | median | p90 |\n|---|---|---|\n")
	for _, s := range setups {
		r.printf("| %s | %s | %s |\n", s.name, ms(percentile(s.ds, 50)), ms(percentile(s.ds, 90)))
	}
	r.printf("\n")
	ratio := float64(percentile(setups[2].ds, 50)) / float64(percentile(setups[0].ds, 50))
	r.results = append(r.results, target{"end-to-end median / no plugin", "≤ 1.05", fmt.Sprintf("%.3f", ratio), ratio <= 1.05,
		"the NRI round trip and the device nodes, mounts and hook the container gets, which the plain container does not (containerd's own CDI pays the same)"})
}

func startSetups() ([]*setup, func(), error) {
	var setups []*setup
	cleanup := func() {
		for _, s := range setups {
			_ = s.ctd.Stop()
		}
	}
	b, err := newBenchHost("e2e")
	if b.dir != "" {
		prev := cleanup
		cleanup = func() { prev(); _ = os.RemoveAll(b.dir) }
	}
	if err != nil {
		return nil, cleanup, err
	}
	tools, dir, image, host := b.tools, b.dir, b.image, b.host
	for _, s := range []struct {
		name   string
		opts   harness.Options
		podAnn map[string]string
		ctrAnn map[string]string
		plugin bool
	}{
		{name: "no plugin", opts: harness.Options{}},
		{name: "containerd's own CDI (enable_cdi)", opts: harness.Options{EnableCDI: true, CDISpecDirs: []string{host.SpecDir}},
			ctrAnn: map[string]string{"cdi.k8s.io/bench": "nvidia.com/gpu=0"}},
		{name: "nri-gpu", podAnn: map[string]string{"gpus.nri-gpu.io": "0"}, plugin: true},
	} {
		s.opts.Image = image
		ctd, err := harness.StartContainerd(filepath.Join(dir, strings.ReplaceAll(s.name, " ", "-")), tools, s.opts)
		if err != nil {
			return nil, cleanup, err
		}
		st := &setup{name: s.name, ctd: ctd, ann: s.ctrAnn, pod: harness.Pod{Name: "bench", Namespace: "bench", Annotations: s.podAnn}}
		setups = append(setups, st)
		if s.plugin {
			cfg := filepath.Join(dir, "nri-gpu.yaml")
			if err := os.WriteFile(cfg, []byte(host.PluginConfig(nil)), 0o644); err != nil {
				return nil, cleanup, err
			}
			if _, err := ctd.StartPlugin("--config", cfg); err != nil {
				return nil, cleanup, err
			}
		}
		if st.id, err = ctd.RunPod(st.pod); err != nil {
			return nil, cleanup, err
		}
	}
	return setups, cleanup, nil
}

// targets lists each goal against what was measured.
func (r *report) targets() {
	r.printf("## Targets\n\nMeasured in the run above.\n\n| target | goal | measured | met |\n|---|---|---|---|\n")
	for _, t := range r.results {
		met := "yes"
		if !t.met {
			met = "no"
		}
		r.printf("| %s | %s | %s | %s |\n", t.name, t.goal, t.measured, met)
	}
	var missed []target
	for _, t := range r.results {
		if !t.met {
			missed = append(missed, t)
		}
	}
	if len(missed) > 0 {
		r.printf("\nWhat bounds the targets missed in this run:\n\n")
		for _, t := range missed {
			r.printf("- %s: %s.\n", t.name, t.bound)
		}
	}
}

// benchHost is what a benchmark's containerds share: the tools, a
// directory of their own, a local image and a fake GPU.
type benchHost struct {
	tools harness.Tools
	dir   string // removed by the caller, once set
	image string
	host  *harness.GPUHost
}

func newBenchHost(name string) (benchHost, error) {
	var b benchHost
	if os.Geteuid() != 0 {
		return b, fmt.Errorf("needs root")
	}
	tools, err := harness.FindTools("")
	if err != nil {
		return b, err
	}
	b.tools = tools
	if b.dir, err = os.MkdirTemp("/tmp", "nri-gpu-bench-"+name+"-"); err != nil { // short: it holds unix sockets
		return b, err
	}
	b.image = filepath.Join(b.dir, "busybox.tar")
	if err := harness.BuildImage(tools.Busybox, b.image); err != nil {
		return b, err
	}
	b.host, err = harness.NewGPUHost(b.dir, 1)
	return b, err
}
