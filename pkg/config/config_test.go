package config_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/config"
)

func TestParse(t *testing.T) {
	honor := true
	noHonor := false
	defaults := &config.Config{
		CDISpecDirs:         []string{"/etc/cdi", "/var/run/cdi"},
		DefaultKind:         "nvidia.com/gpu",
		AnnotationKeys:      []string{"gpus.nri-gpu.io"},
		HonorCDIAnnotations: &honor,
		UnsupportedEdits:    config.UnsupportedError,
		Version:             "v1",
		Generate:            config.Generate{Interval: time.Minute},
		Policy: config.Policy{
			Namespaces: []string{"*"},
			Devices:    []string{"nvidia.com/gpu=*"},
			HookPaths:  []string{"/usr/bin/nvidia-cdi-hook", "/usr/bin/nvidia-ctk"},

			MemoryLimits: config.MemoryLimitsEnforced,
		},
		Start: config.Start{
			DriverRoot:   "/",
			Health:       config.Health{Interval: 10 * time.Second},
			DevicePlugin: config.DevicePlugin{KubeletDir: "/var/lib/kubelet/device-plugins", PodResources: "/var/lib/kubelet/pod-resources/kubelet.sock", CDIDevices: config.CDIAnnotations},
			DRA: config.DRA{
				DriverName: "gpu.nri-gpu.io", Kinds: []string{"nvidia.com/gpu"}, Devices: []string{"*"},
				PluginDir: "/var/lib/kubelet/plugins", RegistryDir: "/var/lib/kubelet/plugins_registry", UnhealthyTaint: "NoSchedule", CDIDevices: config.CDICRI,
				SweepInterval: 10 * time.Minute,
			},
			MPS: config.MPS{Daemon: config.MPSExternal, ControlCommand: "/usr/bin/nvidia-cuda-mps-control", Root: "/run/nri-gpu/mps", CheckInterval: 10 * time.Second},
		},
	}
	// everyKey is what the two spellings of every key below give.
	everyKey := &config.Config{
		Version:             "v1",
		CDISpecDirs:         []string{"/etc/cdi"},
		DefaultKind:         "example.com/fpga",
		AnnotationKeys:      []string{"gpus.nri-gpu.io", "nvidia.cdi.k8s.io"},
		HonorCDIAnnotations: &noHonor,
		UnsupportedEdits:    config.UnsupportedWarn,
		Generate:            config.Generate{Enabled: true, Interval: 5 * time.Minute},
		Policy: config.Policy{
			Namespaces: []string{"agents-*"}, Devices: []string{"example.com/fpga=*"},
			AllowAll: true, MaxDevicesPerPod: 2, Exclusive: true, HookPaths: []string{"/usr/local/bin/hook"},
			ExemptCDIAnnotations: true, AllowUnhealthy: true, MemoryLimits: config.MemoryLimitsAgreement,
			Sharing: []config.Sharing{
				{Devices: []string{"example.com/fpga=0"}, Replicas: 4, Strategy: config.StrategyTimeSlicing, Memory: "80Gi",
					MemoryRequest: config.MemoryRequest{Default: "16Gi", Minimum: "2Gi", Maximum: "40Gi", Step: "2Gi"}, MemoryQuota: true},
				{Devices: []string{"example.com/fpga=1", "example.com/fpga=2"}, Replicas: 3, Strategy: config.StrategyMPS, ActiveThreadPercentage: 30, PinnedMemoryLimit: "10Gi"},
			},
		},
		Start: config.Start{
			DriverRoot: "/run/nvidia/driver",
			Health:     config.Health{Interval: 30 * time.Second, RecoverAfter: 10 * time.Minute},
			MPS:        config.MPS{Daemon: config.MPSManaged, ControlCommand: "/usr/bin/nvidia-cuda-mps-control", Root: "/run/mps", HostRoot: "/host", CheckInterval: 30 * time.Second},
			DevicePlugin: config.DevicePlugin{
				KubeletDir: "/var/lib/k3s/device-plugins", PodResources: "/var/lib/k3s/kubelet/pod-resources/kubelet.sock", CDIDevices: config.CDICRI,
				Resources: []config.Resource{
					{Name: "example.com/fpga", Kind: "example.com/fpga", Devices: []string{"*"}},
					{Name: "example.com/fpga-half", Kind: "example.com/fpga", Devices: []string{"*:*"}},
				},
			},
			DRA: config.DRA{
				Enabled: true, DriverName: "fpga.example.com", Kinds: []string{"example.com/fpga", "example.com/nic"},
				Devices: []string{"[0-9]*"}, NodeName: "node-1", Kubeconfig: "/etc/nri-gpu/kubeconfig",
				PluginDir: "/var/lib/k3s/plugins", RegistryDir: "/var/lib/k3s/plugins_registry", UnhealthyTaint: "NoExecute", CDIDevices: config.CDINRIGPU,
				SweepInterval: 30 * time.Second, MetricsAddress: "127.0.0.1:9465",
			},
			Events: config.Events{Enabled: true, Kubeconfig: "/etc/nri-gpu/events-kubeconfig"},
		},
	}
	tests := []struct {
		name    string
		yaml    string
		want    *config.Config
		wantErr []string
	}{
		{name: "empty gives the defaults", yaml: "", want: defaults},
		{name: "comments only give the defaults", yaml: "# nothing\n", want: defaults},
		{
			name: "every key",
			yaml: `
cdiSpecDirs: [/etc/cdi]
defaultKind: example.com/fpga
annotationKeys: [gpus.nri-gpu.io, nvidia.cdi.k8s.io]
honorCDIAnnotations: false
unsupportedEdits: warn
generateSpecs: true
generateInterval: 5m
driverRoot: /run/nvidia/driver
healthInterval: 30s
healthRecoverAfter: 10m
policy:
  namespaces: ["agents-*"]
  devices: ["example.com/fpga=*"]
  allowAll: true
  maxDevicesPerPod: 2
  exclusive: true
  hookPaths: [/usr/local/bin/hook]
  exemptCDIAnnotations: true
  allowUnhealthy: true
  memoryLimits: agreement
  sharing:
  - devices: ["example.com/fpga=0"]
    replicas: 4
    memory: 80Gi
    memoryRequest: {default: 16Gi, minimum: 2Gi, maximum: 40Gi, step: 2Gi}
    memoryQuota: true
  - devices: ["example.com/fpga=1", "example.com/fpga=2"]
    replicas: 3
    strategy: mps
    activeThreadPercentage: 30
    pinnedMemoryLimit: 10Gi
mps:
  daemon: managed
  controlCommand: /usr/bin/nvidia-cuda-mps-control
  root: /run/mps
  hostRoot: /host
devicePlugin:
  kubeletDir: /var/lib/k3s/device-plugins
  podResources: /var/lib/k3s/kubelet/pod-resources/kubelet.sock
  cdiDevices: cri
  resources:
  - name: example.com/fpga
  - name: example.com/fpga-half
    kind: example.com/fpga
    devices: ["*:*"]
dra:
  enabled: true
  driverName: fpga.example.com
  kinds: [example.com/fpga, example.com/nic]
  devices: ["[0-9]*"]
  nodeName: node-1
  kubeconfig: /etc/nri-gpu/kubeconfig
  pluginDir: /var/lib/k3s/plugins
  registryDir: /var/lib/k3s/plugins_registry
  unhealthyTaint: NoExecute
  sweepInterval: 30s
  metricsAddress: 127.0.0.1:9465
  cdiDevices: nri-gpu
events:
  enabled: true
  kubeconfig: /etc/nri-gpu/events-kubeconfig
`,
			want: everyKey,
		},
		{
			name: "every key, v1",
			yaml: `
version: v1
cdiSpecDirs: [/etc/cdi]
defaultKind: example.com/fpga
annotationKeys: [gpus.nri-gpu.io, nvidia.cdi.k8s.io]
honorCDIAnnotations: false
unsupportedEdits: warn
generate:
  enabled: true
  interval: 5m
policy:
  namespaces: ["agents-*"]
  devices: ["example.com/fpga=*"]
  allowAll: true
  maxDevicesPerPod: 2
  exclusive: true
  hookPaths: [/usr/local/bin/hook]
  exemptCDIAnnotations: true
  allowUnhealthy: true
  memoryLimits: agreement
  sharing:
  - devices: ["example.com/fpga=0"]
    replicas: 4
    memory: 80Gi
    memoryRequest: {default: 16Gi, minimum: 2Gi, maximum: 40Gi, step: 2Gi}
    memoryQuota: true
  - devices: ["example.com/fpga=1", "example.com/fpga=2"]
    replicas: 3
    strategy: mps
    activeThreadPercentage: 30
    pinnedMemoryLimit: 10Gi
start:
  driverRoot: /run/nvidia/driver
  health:
    interval: 30s
    recoverAfter: 10m
  mps:
    daemon: managed
    controlCommand: /usr/bin/nvidia-cuda-mps-control
    root: /run/mps
    hostRoot: /host
    checkInterval: 30s
  devicePlugin:
    kubeletDir: /var/lib/k3s/device-plugins
    podResources: /var/lib/k3s/kubelet/pod-resources/kubelet.sock
    cdiDevices: cri
    resources:
    - name: example.com/fpga
    - name: example.com/fpga-half
      kind: example.com/fpga
      devices: ["*:*"]
  dra:
    enabled: true
    driverName: fpga.example.com
    kinds: [example.com/fpga, example.com/nic]
    devices: ["[0-9]*"]
    nodeName: node-1
    kubeconfig: /etc/nri-gpu/kubeconfig
    pluginDir: /var/lib/k3s/plugins
    registryDir: /var/lib/k3s/plugins_registry
    unhealthyTaint: NoExecute
    sweepInterval: 30s
    metricsAddress: 127.0.0.1:9465
    cdiDevices: nri-gpu
  events:
    enabled: true
    kubeconfig: /etc/nri-gpu/events-kubeconfig
`,
			want: everyKey,
		},
		{name: "v1 refuses the keys before versions", yaml: "version: v1\ngenerateSpecs: true\ndra: {enabled: true}\n", wantErr: []string{"field generateSpecs not found", "field dra not found"}},
		{name: "hookFree with doors of the runtime's CDI", yaml: "version: v1\nhookFree: true\nstart:\n  devicePlugin: {cdiDevices: cri, resources: [{name: nvidia.com/gpu}]}\n  dra: {enabled: true, nodeName: n, cdiDevices: cri}\n",
			wantErr: []string{"start.devicePlugin.cdiDevices: hookFree: cri", "start.dra.cdiDevices: hookFree: cri", "runs their hooks"}},
		{name: "hookFree defaults the doors to nri-gpu", yaml: "version: v1\nhookFree: true\n", want: func() *config.Config {
			c := *defaults
			c.HookFree = true
			c.Start.DevicePlugin.CDIDevices, c.Start.DRA.CDIDevices = config.CDINRIGPU, config.CDINRIGPU
			return &c
		}()},
		{name: "unknown version", yaml: "version: v2\n", wantErr: []string{`version: "v2" is not one this nri-gpu reads (v1)`}},
		{name: "v1 errors name v1 keys", yaml: "version: v1\ngenerate: {interval: -1s}\nstart: {health: {interval: -1s}, dra: {pluginDir: plugins}, mps: {checkInterval: -1s}}\n",
			wantErr: []string{"generate.interval: -1s is not positive", "start.health.interval: -1s is not positive", `start.dra.pluginDir: "plugins" is not an absolute path`, "start.mps.checkInterval: -1s is not positive"}},
		{name: "unknown key", yaml: "cdiSpecDir: [/etc/cdi]\n", wantErr: []string{"line 1", `field cdiSpecDir not found`}},
		{name: "unknown policy key", yaml: "policy:\n  allow_all: true\n", wantErr: []string{"line 2", "allow_all"}},
		{name: "wrong type", yaml: "policy:\n  maxDevicesPerPod: many\n", wantErr: []string{"line 2", "many"}},
		{name: "bad unsupportedEdits", yaml: "unsupportedEdits: ignore\n", wantErr: []string{`unsupportedEdits: "ignore" is neither "error" nor "warn"`}},
		{name: "relative spec dir", yaml: "cdiSpecDirs: [cdi]\n", wantErr: []string{`cdiSpecDirs[0]: "cdi" is not an absolute path`}},
		{name: "empty spec dirs", yaml: "cdiSpecDirs: []\n", wantErr: []string{"cdiSpecDirs: at least one directory"}},
		{name: "bad kind", yaml: "defaultKind: gpu\n", wantErr: []string{`defaultKind: kind "gpu" is not of the form vendor/class`}},
		{name: "bad vendor", yaml: "defaultKind: -x/gpu\n", wantErr: []string{"defaultKind:", "invalid vendor"}},
		{name: "bad glob", yaml: "policy:\n  devices: ['nvidia.com/gpu=[']\n", wantErr: []string{`policy.devices[0]: glob "nvidia.com/gpu=["`}},
		{name: "negative max", yaml: "policy:\n  maxDevicesPerPod: -1\n", wantErr: []string{"policy.maxDevicesPerPod: -1 is negative"}},
		{name: "relative hook", yaml: "policy:\n  hookPaths: [nvidia-ctk]\n", wantErr: []string{`policy.hookPaths[0]: "nvidia-ctk" is not an absolute path`}},
		{name: "bad interval", yaml: "generateInterval: soon\n", wantErr: []string{"line 1", "soon"}},
		{name: "negative interval", yaml: "generateInterval: -1s\n", wantErr: []string{"generateInterval: -1s is not positive"}},
		{name: "relative driver root", yaml: "driverRoot: run/nvidia\n", wantErr: []string{`driverRoot: "run/nvidia" is not an absolute path`}},
		{name: "bad cdiDevices", yaml: "devicePlugin:\n  cdiDevices: env\n", wantErr: []string{`devicePlugin.cdiDevices: "env" is not one of "annotations", "cri", "nri-gpu"`}},
		{name: "relative kubelet dir", yaml: "devicePlugin:\n  kubeletDir: kubelet\n", wantErr: []string{`devicePlugin.kubeletDir: "kubelet" is not an absolute path`}},
		{name: "relative relay dir", yaml: "devicePlugin:\n  relay: relay\n", wantErr: []string{`devicePlugin.relay: "relay" is not an absolute path`}},
		{name: "bad resource name", yaml: "devicePlugin:\n  resources: [{name: gpu}]\n", wantErr: []string{`devicePlugin.resources[0].name: kind "gpu" is not of the form vendor/class`}},
		{name: "resource twice", yaml: "devicePlugin:\n  resources: [{name: a.com/b}, {name: a.com/b}]\n", wantErr: []string{`devicePlugin.resources[1].name: "a.com/b" is listed twice`}},
		{name: "bad resource glob", yaml: "devicePlugin:\n  resources: [{name: a.com/b, devices: ['[']}]\n", wantErr: []string{`devicePlugin.resources[0].devices[0]: glob "["`}},
		{name: "negative health interval", yaml: "healthInterval: -1s\n", wantErr: []string{"healthInterval: -1s is not positive"}},
		{name: "negative recovery", yaml: "healthRecoverAfter: -1m\n", wantErr: []string{"healthRecoverAfter: -1m0s is negative"}},
		{name: "unknown annotation key", yaml: "annotationKeys: [gpu.example.com]\n", wantErr: []string{`annotationKeys[0]: "gpu.example.com" is neither "gpus.nri-gpu.io" nor "nvidia.cdi.k8s.io"`}},
		{name: "bad driver name", yaml: "dra:\n  driverName: GPU_driver\n", wantErr: []string{`dra.driverName: "GPU_driver" is not a DNS subdomain`}},
		{name: "no DRA kinds", yaml: "dra:\n  kinds: []\n", wantErr: []string{"dra.kinds: at least one CDI kind"}},
		{name: "bad DRA kind", yaml: "dra:\n  kinds: [gpu]\n", wantErr: []string{`dra.kinds[0]: kind "gpu" is not of the form vendor/class`}},
		{name: "bad DRA glob", yaml: "dra:\n  devices: ['[']\n", wantErr: []string{`dra.devices[0]: glob "["`}},
		{name: "bad node name", yaml: "dra:\n  nodeName: Node_1\n", wantErr: []string{`dra.nodeName: "Node_1" is not a node name`}},
		{name: "relative kubeconfig", yaml: "dra:\n  kubeconfig: kubeconfig\n", wantErr: []string{`dra.kubeconfig: "kubeconfig" is not an absolute path`}},
		{name: "relative events kubeconfig", yaml: "events:\n  kubeconfig: kubeconfig\n", wantErr: []string{`events.kubeconfig: "kubeconfig" is not an absolute path`}},
		{name: "relative plugin dir", yaml: "dra:\n  pluginDir: plugins\n", wantErr: []string{`dra.pluginDir: "plugins" is not an absolute path`}},
		{name: "relative registry dir", yaml: "dra:\n  registryDir: reg\n", wantErr: []string{`dra.registryDir: "reg" is not an absolute path`}},
		{name: "sharing without devices", yaml: "policy:\n  sharing: [{replicas: 2}]\n", wantErr: []string{"policy.sharing[0].devices: at least one glob is needed"}},
		{name: "bad sharing glob", yaml: "policy:\n  sharing: [{devices: ['['], replicas: 2}]\n", wantErr: []string{`policy.sharing[0].devices[0]: glob "["`}},
		{name: "one replica", yaml: "policy:\n  sharing: [{devices: ['*'], replicas: 1}]\n", wantErr: []string{"policy.sharing[0].replicas: 1: a shared device needs 2 replicas or more"}},
		{name: "no replicas", yaml: "policy:\n  sharing: [{devices: ['*']}]\n", wantErr: []string{"policy.sharing[0].replicas: 0"}},
		{name: "bad memoryLimits", yaml: "policy:\n  memoryLimits: soft\n", wantErr: []string{`policy.memoryLimits: "soft" is neither "enforced" nor "agreement"`}},
		{name: "bad strategy", yaml: "policy:\n  sharing: [{devices: ['*'], replicas: 2, strategy: mig}]\n", wantErr: []string{`policy.sharing[0].strategy: "mig" is neither "timeSlicing" nor "mps"`}},
		{name: "limits on time-slicing", yaml: "policy:\n  sharing: [{devices: ['*'], replicas: 2, activeThreadPercentage: 50}]\n", wantErr: []string{"policy.sharing[0]: activeThreadPercentage and pinnedMemoryLimit bound MPS clients only"}},
		{name: "memory limit on time-slicing", yaml: "policy:\n  sharing: [{devices: ['*'], replicas: 2, pinnedMemoryLimit: 1Gi}]\n", wantErr: []string{"bound MPS clients only"}},
		{name: "thread percentage over 100", yaml: "policy:\n  sharing: [{devices: ['*'], replicas: 2, strategy: mps, activeThreadPercentage: 101}]\n", wantErr: []string{"policy.sharing[0].activeThreadPercentage: 101 is not between 1 and 100"}},
		{name: "negative thread percentage", yaml: "policy:\n  sharing: [{devices: ['*'], replicas: 2, strategy: mps, activeThreadPercentage: -1}]\n", wantErr: []string{"activeThreadPercentage: -1 is not between"}},
		{name: "bad memory limit", yaml: "policy:\n  sharing: [{devices: ['*'], replicas: 2, strategy: mps, pinnedMemoryLimit: lots}]\n", wantErr: []string{`policy.sharing[0].pinnedMemoryLimit: "lots" is not a quantity`}},
		{name: "memory limit under 1Mi", yaml: "policy:\n  sharing: [{devices: ['*'], replicas: 2, strategy: mps, pinnedMemoryLimit: 1023Ki}]\n", wantErr: []string{`"1023Ki" is less than 1Mi`}},
		{name: "bad shared memory", yaml: "policy:\n  sharing: [{devices: ['*'], replicas: 2, memory: lots}]\n", wantErr: []string{`policy.sharing[0].memory: "lots" is not a quantity such as 10Gi`}},
		{name: "memory step under 1Mi", yaml: "policy:\n  sharing: [{devices: ['*'], replicas: 2, memoryRequest: {step: 1Ki}}]\n", wantErr: []string{`policy.sharing[0].memoryRequest.step: "1Ki" is less than 1Mi`}},
		{name: "memory off the step", yaml: "policy:\n  sharing: [{devices: ['*'], replicas: 2, memory: 80Gi, memoryRequest: {default: 3Gi, step: 2Gi}}]\n", wantErr: []string{`policy.sharing[0].memoryRequest.default: "3Gi" is not a multiple of memoryRequest.step (2Gi)`}},
		{name: "memory request out of order", yaml: "policy:\n  sharing: [{devices: ['*'], replicas: 2, memory: 8Gi, memoryRequest: {minimum: 4Gi, default: 2Gi, maximum: 16Gi}}]\n", wantErr: []string{
			`policy.sharing[0].memoryRequest.default: "2Gi" is less than policy.sharing[0].memoryRequest.minimum (4Gi)`,
			`policy.sharing[0].memory: "8Gi" is less than policy.sharing[0].memoryRequest.maximum (16Gi)`}},
		{name: "default beside pinned memory", yaml: "policy:\n  sharing: [{devices: ['*'], replicas: 2, strategy: mps, pinnedMemoryLimit: 1Gi, memoryRequest: {default: 2Gi}}]\n", wantErr: []string{`policy.sharing[0].memoryRequest.default: pinnedMemoryLimit is what a user consumes by default`}},
		{name: "memory quota with MPS", yaml: "policy:\n  sharing: [{devices: ['*'], replicas: 2, strategy: mps, memoryQuota: true}]\n", wantErr: []string{`policy.sharing[0].memoryQuota: MPS bounds each client's memory`}},
		{name: "bad DRA cdiDevices", yaml: "dra:\n  cdiDevices: annotations\n", wantErr: []string{`dra.cdiDevices: "annotations" is neither "cri" nor "nri-gpu"`}},
		{name: "no DRA sweep", yaml: "dra:\n  sweepInterval: -1s\n", wantErr: []string{"dra.sweepInterval: -1s is not positive"}},
		{name: "DRA metrics address without a port", yaml: "dra:\n  metricsAddress: localhost\n", wantErr: []string{`dra.metricsAddress: "localhost" is not HOST:PORT`}},
		{name: "bad unhealthy taint", yaml: "dra:\n  unhealthyTaint: PreferNoSchedule\n", wantErr: []string{`dra.unhealthyTaint: "PreferNoSchedule" is neither "NoSchedule" nor "NoExecute"`}},
		{name: "bad MPS daemon", yaml: "mps:\n  daemon: systemd\n", wantErr: []string{`mps.daemon: "systemd" is neither "external" nor "managed"`}},
		{name: "relative MPS control", yaml: "mps:\n  controlCommand: nvidia-cuda-mps-control\n", wantErr: []string{`mps.controlCommand: "nvidia-cuda-mps-control" is not an absolute path`}},
		{name: "relative MPS root", yaml: "mps:\n  root: mps\n", wantErr: []string{`mps.root: "mps" is not an absolute path`}},
		{name: "relative host root", yaml: "mps:\n  hostRoot: host\n", wantErr: []string{`mps.hostRoot: "host" is not an absolute path`}},
		{name: "two documents", yaml: "defaultKind: a.com/b\n---\ndefaultKind: c.com/d\n", wantErr: []string{"more than one YAML document"}},
		{
			name:    "all problems at once",
			yaml:    "unsupportedEdits: skip\ncdiSpecDirs: [rel]\n",
			wantErr: []string{"unsupportedEdits", "cdiSpecDirs"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := config.Parse([]byte(tc.yaml))
			if len(tc.wantErr) > 0 {
				testutil.ErrorSays(t, err, tc.wantErr...)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("config (-want +got):\n%s", diff)
			}
		})
	}
}

func TestLoadNamesTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nri-gpu.yaml")
	if err := os.WriteFile(path, []byte("policy:\n  exclusiv: true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := config.Load(path)
	if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "exclusiv") {
		t.Errorf("error %v, want one naming the file and the key", err)
	}
	if _, err := config.Load(filepath.Join(t.TempDir(), "missing.yaml")); err == nil {
		t.Error("a missing file loaded")
	}
}

// TestExampleConfig keeps config/nri-gpu.yaml valid and equal to the
// defaults it documents.
func TestExampleConfig(t *testing.T) {
	got, err := config.Load(filepath.Join("..", "..", "config", "nri-gpu.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(config.Default(), got); diff != "" {
		t.Errorf("config/nri-gpu.yaml differs from the defaults (-defaults +file):\n%s", diff)
	}
}

// TestShippedConfigs keeps every configuration under config/ valid.
func TestShippedConfigs(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "..", "config", "nri-gpu*.yaml"))
	if err != nil || len(files) < 2 {
		t.Fatalf("found %v (%v), want the shipped configurations", files, err)
	}
	for _, f := range files {
		if _, err := config.Load(f); err != nil {
			t.Error(err)
		}
	}
}

func TestProblems(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want []string
	}{
		{name: "valid", yaml: "defaultKind: a.com/b\n"},
		{name: "unknown key", yaml: "defaultKind: a.com/b\npolicy:\n  alowAll: true\n", want: []string{"line 3: field alowAll not found"}},
		{
			name: "several semantic problems, each at its key's line",
			yaml: "cdiSpecDirs: [rel]\npolicy:\n  devices: ['[']\n  maxDevicesPerPod: -2\n",
			want: []string{`line 1: cdiSpecDirs[0]: "rel" is not an absolute path`, "line 3: policy.devices[0]: glob", "line 4: policy.maxDevicesPerPod: -2 is negative"},
		},
		{name: "wrong type", yaml: "\n\nhonorCDIAnnotations: maybe\n", want: []string{"line 3: cannot unmarshal !!str `maybe`"}},
		{
			name: "a list item in block style, at the item's line",
			yaml: "policy:\n  hookPaths:\n    - rel\n",
			want: []string{`line 3: policy.hookPaths[0]: "rel" is not an absolute path`},
		},
		{
			name: "v1: a start key at its line",
			yaml: "version: v1\nstart:\n  dra:\n    kinds: [gpu]\n",
			want: []string{`line 4: start.dra.kinds[0]: kind "gpu"`},
		},
		{
			name: "a list entry, at its line; a key it lacks, at none",
			yaml: "devicePlugin:\n  resources:\n  - name: nvidia.com/gpu\n    kind: nvidia.com/gpu\n    devices: ['[']\n  - {name: bad}\n",
			want: []string{`line 5: devicePlugin.resources[0].devices[0]: glob "["`, `line 6: devicePlugin.resources[1].name: kind "bad"`, `devicePlugin.resources[1].kind: kind "bad"`},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, p := range config.Problems([]byte(tc.yaml)) {
				got = append(got, p.String())
			}
			if len(got) != len(tc.want) {
				t.Fatalf("problems %q, want %d like %q", got, len(tc.want), tc.want)
			}
			for i, w := range tc.want {
				if !strings.HasPrefix(got[i], w) {
					t.Errorf("problem %q does not start %q", got[i], w)
				}
			}
			// The line is a field of its own (validate prints file:line:
			// message), not a prefix of the message.
			for _, p := range config.Problems([]byte(tc.yaml)) {
				if strings.HasPrefix(p.Message, "line ") || strings.HasPrefix(p.Message, "yaml: line ") {
					t.Errorf("problem at line %d has its line in the message: %q", p.Line, p.Message)
				}
			}
		})
	}
}

// TestValidateIntervals: Parse makes a zero interval the default, but a
// Config built otherwise with one would poll without pause: Validate
// refuses it.
func TestValidateIntervals(t *testing.T) {
	c, err := config.Parse([]byte("generateInterval: 0s\nhealthInterval: 0s\n"))
	if err != nil || c.Generate.Interval != config.DefaultGenerateInterval || c.Start.Health.Interval != config.DefaultHealthInterval || c.Start.MPS.CheckInterval != config.DefaultMPSCheckInterval {
		t.Fatalf("zero intervals: %v, %v, %v, %v; want the defaults", c.Generate.Interval, c.Start.Health.Interval, c.Start.MPS.CheckInterval, err)
	}
	c.Generate.Interval, c.Start.Health.Interval, c.Start.MPS.CheckInterval = 0, 0, 0
	testutil.ErrorSays(t, c.Validate(), "generate.interval: 0s is not positive", "start.health.interval: 0s is not positive", "start.mps.checkInterval: 0s is not positive")
	c.Generate.Interval, c.Start.Health.Interval, c.Start.MPS.CheckInterval = time.Nanosecond, time.Nanosecond, time.Nanosecond
	if err := c.Validate(); err != nil {
		t.Errorf("1ns intervals: %v", err)
	}
}

// TestSharingBounds: the edges of policy.sharing's values that are
// allowed: 2 replicas, 0 (100/replicas) and 100 per cent of threads, a
// memory limit of exactly 1Mi.
func TestSharingBounds(t *testing.T) {
	for _, entry := range []string{
		"{devices: ['*'], replicas: 2}",
		"{devices: ['*'], replicas: 2, strategy: mps, activeThreadPercentage: 0}",
		"{devices: ['*'], replicas: 2, strategy: mps, activeThreadPercentage: 100}",
		"{devices: ['*'], replicas: 2, strategy: mps, activeThreadPercentage: 1, pinnedMemoryLimit: 1Mi}",
	} {
		c, err := config.Parse([]byte("policy:\n  sharing: [" + entry + "]\n"))
		if err != nil {
			t.Errorf("%s: %v", entry, err)
			continue
		}
		if mem, err := c.Policy.Sharing[0].PinnedMemory(); err != nil || (strings.Contains(entry, "1Mi") && mem != 1<<20) {
			t.Errorf("%s: pinned memory %d, %v", entry, mem, err)
		}
	}
}

// TestStartChanged: what a reload would change that only a start reads
// is named by Start.Changed by its key (start.dra, whatever the file's
// layout); everything else reloads.
func TestStartChanged(t *testing.T) {
	parse := func(yaml string) *config.Config {
		t.Helper()
		c, err := config.Parse([]byte(yaml))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	inForce := parse("")
	for _, tc := range []struct {
		name, yaml string
		want       []string
	}{
		{"nothing", "version: v1\n", nil},
		{"what reloads", "version: v1\ncdiSpecDirs: [/cdi]\ngenerate: {enabled: true, interval: 1s}\npolicy: {exclusive: true}\n", nil},
		{"v1", "version: v1\nstart:\n  driverRoot: /run/nvidia/driver\n  dra: {enabled: true}\n  mps: {checkInterval: 1s}\n", []string{"start.driverRoot", "start.dra", "start.mps"}},
		{"health, v1", "version: v1\nstart: {health: {recoverAfter: 1m}}\n", []string{"start.health"}},
		{"without version", "devicePlugin: {kubeletDir: /k, resources: [{name: nvidia.com/gpu}]}\nhealthInterval: 1s\n", []string{"start.health", "start.devicePlugin", "start.mps"}},
		// A door off before and after reads nothing of its block, whose
		// defaults follow defaultKind.
		{"doors off", "version: v1\ndefaultKind: example.com/fpga\nstart: {devicePlugin: {kubeletDir: /k}, dra: {driverName: x.example.com}}\n", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := inForce.Start.Changed(parse(tc.yaml).Start); !slices.Equal(got, tc.want) {
				t.Errorf("start keys changed %v, want %v", got, tc.want)
			}
		})
	}
}

// TestReloadWithDoorsOn: hookFree and defaultKind reload, but with the
// device plugin or DRA on, the defaults of their start blocks follow
// them (the doors' cdiDevices, DRA's kinds): changing them then changes
// what only a start reads, and is refused naming it, unless those keys
// are set (docs/hook-free.md, the README's configuration).
func TestReloadWithDoorsOn(t *testing.T) {
	parse := func(yaml string) *config.Config {
		t.Helper()
		c, err := config.Parse([]byte("version: v1\n" + yaml))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	const (
		doors    = "start: {devicePlugin: {resources: [{name: nvidia.com/gpu}]}, dra: {enabled: true, nodeName: n}}\n"
		doorsSet = "start: {devicePlugin: {cdiDevices: nri-gpu, resources: [{name: nvidia.com/gpu}]}, dra: {enabled: true, nodeName: n, cdiDevices: nri-gpu, kinds: [nvidia.com/gpu]}}\n"
	)
	for _, tc := range []struct {
		name, inForce, next string
		want                []string
	}{
		{"hookFree, doors off", "", "hookFree: true\n", nil},
		{"hookFree, doors on", doors, "hookFree: true\n" + doors, []string{"start.devicePlugin", "start.dra"}},
		{"hookFree, doors' cdiDevices set", doorsSet, "hookFree: true\n" + doorsSet, nil},
		{"defaultKind, DRA on", doors, "defaultKind: example.com/gpu\n" + doors, []string{"start.dra"}},
		{"defaultKind, DRA's kinds set", doorsSet, "defaultKind: example.com/gpu\n" + doorsSet, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := parse(tc.inForce).Start.Changed(parse(tc.next).Start); !slices.Equal(got, tc.want) {
				t.Errorf("start keys changed %v, want %v", got, tc.want)
			}
		})
	}
}

// TestSharingAmounts: what a policy.sharing entry's memory keys come to
// in bytes, the amounts a shared GPU's capacity is counted in: the step
// 1Mi unless set; 1Mi itself, equal bounds and bounds with one between
// them unset are accepted; the order is checked between those set only.
func TestSharingAmounts(t *testing.T) {
	const mi, gi = int64(1 << 20), int64(1 << 30)
	for _, tc := range []struct {
		// entry is the entry's keys after its devices and replicas,
		// each after a comma.
		name, entry string
		want        config.Amounts
		wantErr     string
		// notSaid is what the refusal does not say.
		notSaid string
	}{
		{name: "nothing set", entry: "", want: config.Amounts{Step: mi}},
		{name: "the step 1Mi unless set", entry: ", memory: 3Mi, memoryRequest: {default: 1Mi}", want: config.Amounts{Memory: 3 * mi, Default: mi, Step: mi}},
		{name: "a step of its own", entry: ", memory: 80Gi, memoryRequest: {step: 2Gi, minimum: 2Gi, default: 16Gi, maximum: 40Gi}",
			want: config.Amounts{Memory: 80 * gi, Minimum: 2 * gi, Default: 16 * gi, Maximum: 40 * gi, Step: 2 * gi}},
		{name: "equal bounds", entry: ", memory: 4Gi, memoryRequest: {minimum: 4Gi, default: 4Gi, maximum: 4Gi}",
			want: config.Amounts{Memory: 4 * gi, Minimum: 4 * gi, Default: 4 * gi, Maximum: 4 * gi, Step: mi}},
		{name: "the default unset between two set", entry: ", memoryRequest: {minimum: 2Gi, maximum: 4Gi}", want: config.Amounts{Minimum: 2 * gi, Maximum: 4 * gi, Step: mi}},
		{name: "the maximum under the minimum, the default unset between them", entry: ", memoryRequest: {minimum: 4Gi, maximum: 2Gi}",
			wantErr: `policy.sharing[0].memoryRequest.maximum: "2Gi" is less than policy.sharing[0].memoryRequest.minimum (4Gi)`},
		{name: "one unparsable amount: named alone, the others checked once it parses", entry: ", memoryRequest: {minimum: lots, default: 2Gi, maximum: 1Gi}",
			wantErr: `policy.sharing[0].memoryRequest.minimum: "lots" is not a quantity`, notSaid: "is less than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			yaml := "policy:\n  sharing: [{devices: ['*'], replicas: 2" + tc.entry + "}]\n"
			c, err := config.Parse([]byte(yaml))
			if tc.wantErr != "" {
				testutil.ErrorSays(t, err, tc.wantErr)
				if tc.notSaid != "" && strings.Contains(err.Error(), tc.notSaid) {
					t.Errorf("error %q says %q", err, tc.notSaid)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := c.Policy.Sharing[0].Amounts(); got != tc.want {
				t.Errorf("amounts %+v, want %+v", got, tc.want)
			}
		})
	}
	// Validate (of a configuration built in Go, as plugin.New is given
	// one) refuses a single problem as Parse does.
	c := config.Default()
	c.Policy.Sharing = []config.Sharing{{Devices: []string{"*"}, Replicas: 2, Strategy: config.StrategyTimeSlicing, MemoryRequest: config.MemoryRequest{Minimum: "lots"}}}
	testutil.ErrorSays(t, c.Validate(), `invalid config: policy.sharing[0].memoryRequest.minimum: "lots" is not a quantity`)
}

// TestOverrides: the command line's flags replace the spec dirs and turn
// generation on over any configuration, validated again; with none set
// the configuration is used as it is.
func TestOverrides(t *testing.T) {
	base := config.Default()
	for _, tc := range []struct {
		name     string
		o        config.Overrides
		dirs     []string
		generate bool
		hooks    []string
		// same: nothing changes, and the configuration itself is
		// returned.
		same bool
		err  string
	}{
		{name: "none", dirs: base.CDISpecDirs, same: true},
		{name: "hook path", o: config.Overrides{HookPath: "/opt/nri-gpu"}, dirs: base.CDISpecDirs, hooks: append(slices.Clone(base.Policy.HookPaths), "/opt/nri-gpu")},
		{name: "hook path allowed already", o: config.Overrides{HookPath: base.Policy.HookPaths[0]}, dirs: base.CDISpecDirs, hooks: base.Policy.HookPaths, same: true},
		{name: "spec dirs", o: config.Overrides{SpecDirs: []string{"/opt/cdi"}}, dirs: []string{"/opt/cdi"}},
		{name: "generate", o: config.Overrides{Generate: true}, dirs: base.CDISpecDirs, generate: true},
		{name: "a relative spec dir", o: config.Overrides{SpecDirs: []string{"cdi"}}, err: "--cdi-spec-dirs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := config.Default()
			got, err := tc.o.Apply(c)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one naming %s", err, tc.err)
				}
				return
			}
			if err != nil || !slices.Equal(got.CDISpecDirs, tc.dirs) || got.Generate.Enabled != tc.generate {
				t.Fatalf("spec dirs %v, generate %t, %v; want %v, %t", got.CDISpecDirs, got.Generate.Enabled, err, tc.dirs, tc.generate)
			}
			if tc.hooks == nil {
				tc.hooks = base.Policy.HookPaths
			}
			if (got == c) != tc.same {
				t.Errorf("the configuration itself returned: %t, want %t", got == c, tc.same)
			}
			if !slices.Equal(got.Policy.HookPaths, tc.hooks) {
				t.Errorf("hook paths %v, want %v", got.Policy.HookPaths, tc.hooks)
			}
			if !slices.Equal(c.CDISpecDirs, base.CDISpecDirs) || c.Generate.Enabled || !slices.Equal(c.Policy.HookPaths, base.Policy.HookPaths) {
				t.Errorf("the configuration overridden changed: %v, %t, %v", c.CDISpecDirs, c.Generate.Enabled, c.Policy.HookPaths)
			}
		})
	}
}
