package plugin_test

import (
	"context"
	"errors"
	"testing"

	"github.com/containerd/nri/pkg/api"
	"github.com/sirupsen/logrus"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/plugin"
)

func gpuNode(i int32) *api.LinuxDevice {
	return &api.LinuxDevice{Path: "/dev/nvidia" + string(rune('0'+i)), Type: "c", Major: 195, Minor: int64(i)}
}

// TestUnservedStopped: nri-gpu comes back (Synchronize) to running
// containers the runtime created while it was away. Each that asks for
// devices it lacks, asks in a way nri-gpu refuses, or that the policy
// refuses, is stopped with the reason logged, so that kubelet creates it
// again through nri-gpu; one that has all it asks for (the runtime's own
// CDI injected it) runs on and holds its device; one that asks for
// nothing, one nri-gpu created and one already stopped are left alone.
func TestUnservedStopped(t *testing.T) {
	const cfg = "policy: {namespaces: [tenant], maxDevicesPerPod: 1}"
	for _, tc := range []struct {
		name      string
		namespace string
		pod, ctr  map[string]string
		devices   []*api.LinuxDevice
		state     api.ContainerState
		stopped   string // the reason logged, "" when left alone
		holds     string // a GPU then held: another pod is refused it
	}{
		{name: "named and lacking it", pod: map[string]string{"gpus.nri-gpu.io": "0"},
			stopped: "created while nri-gpu was not serving, without nvidia.com/gpu=0"},
		{name: "counted and lacking it", pod: map[string]string{"gpu-count.nri-gpu.io": "1"},
			stopped: "without 1 of the 1 devices it counts"},
		{name: "counted and one of two", pod: map[string]string{"gpu-count.nri-gpu.io": "2"}, devices: []*api.LinuxDevice{gpuNode(1)},
			stopped: "without 1 of the 2 devices it counts"},
		{name: "device plugin's and lacking it", ctr: map[string]string{"cdi.k8s.io/nri-gpu_nvidia.com-gpu": "nvidia.com/gpu=1"},
			stopped: "without nvidia.com/gpu=1"},
		{name: "refused namespace", namespace: "other", pod: map[string]string{"gpus.nri-gpu.io": "0"},
			stopped: "the policy refuses what it asks for"},
		{name: "unreadable ask", pod: map[string]string{"gpus.nri-gpu.io": "0,,../x"},
			stopped: "what it asks for is refused"},
		{name: "named and injected by the runtime", pod: map[string]string{"gpus.nri-gpu.io": "1"}, devices: []*api.LinuxDevice{gpuNode(1)},
			holds: "1"},
		{name: "counted and injected by the runtime", pod: map[string]string{"gpu-count.nri-gpu.io": "1"}, devices: []*api.LinuxDevice{gpuNode(0)},
			holds: "0"},
		{name: "asks nothing"},
		{name: "nri-gpu's own", pod: map[string]string{"gpus.nri-gpu.io": "0"}, ctr: map[string]string{plugin.DevicesAnnotation: "nvidia.com/gpu=0"},
			devices: []*api.LinuxDevice{gpuNode(0)}, holds: "0"},
		{name: "already stopped", pod: map[string]string{"gpus.nri-gpu.io": "0"}, state: api.ContainerState_CONTAINER_STOPPED},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, hook := logged(t, cfg, plugin.WithSpecDirs([]string{gpuSpecDir(t, 2)}))
			var stopped []string
			p.StopWith(func(c *api.Container) error { stopped = append(stopped, c.GetId()); return nil })
			pod := gpuPod("a", tc.pod)
			if tc.namespace != "" {
				pod.Namespace = tc.namespace
			}
			ctr := ctrOf(pod, tc.ctr)
			ctr.Linux.Devices = tc.devices
			if tc.state != 0 {
				ctr.State = tc.state
			}
			if _, err := p.Synchronize(context.Background(), []*api.PodSandbox{pod}, []*api.Container{ctr}); err != nil {
				t.Fatal(err)
			}
			logs := entries(hook, logrus.WarnLevel, "stopped the container, to be created again through nri-gpu")
			switch {
			case tc.stopped == "" && (len(stopped) > 0 || len(logs) > 0):
				t.Errorf("stopped %v, logged %d; want it left running", stopped, len(logs))
			case tc.stopped != "" && (len(stopped) != 1 || stopped[0] != ctr.GetId() || len(logs) != 1):
				t.Errorf("stopped %v, logged %d; want container %s stopped once, and said", stopped, len(logs), ctr.GetId())
			case tc.stopped != "":
				testutil.ErrorSays(t, errors.New(logs[0].Message), tc.stopped)
				if logs[0].Data["pod"] != "a" || logs[0].Data["container"] != "c" {
					t.Errorf("logged for %v", logs[0].Data)
				}
			}
			if tc.holds != "" {
				other := gpuPod("b", map[string]string{"gpus.nri-gpu.io": tc.holds})
				_, _, err := p.CreateContainer(context.Background(), other, ctrOf(other, nil))
				testutil.ErrorSays(t, err, "held by pod tenant/a")
			}
		})
	}
}

// TestUnservedNotStopped: a container that cannot be stopped is said to
// run on, with the reason it should not and the error.
func TestUnservedNotStopped(t *testing.T) {
	p, hook := logged(t, "", plugin.WithSpecDirs([]string{gpuSpecDir(t, 1)}))
	p.StopWith(func(*api.Container) error { return errors.New("operation not permitted") })
	pod := gpuPod("a", map[string]string{"gpus.nri-gpu.io": "0"})
	if _, err := p.Synchronize(context.Background(), []*api.PodSandbox{pod}, []*api.Container{ctrOf(pod, nil)}); err != nil {
		t.Fatal(err)
	}
	got := entries(hook, logrus.ErrorLevel, "still runs")
	if len(got) != 1 {
		t.Fatalf("logged %d errors saying it still runs", len(got))
	}
	testutil.ErrorSays(t, errors.New(got[0].Message), "without nvidia.com/gpu=0", "operation not permitted")
}
