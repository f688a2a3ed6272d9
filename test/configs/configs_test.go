// Package configs checks the deployment files under config/: each parses,
// plugin configurations pass nri-gpu's own validation, containerd's turn
// NRI on, and the DaemonSet mounts what nri-gpu needs, no more.
package configs

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"text/template"

	"github.com/BurntSushi/toml"
	"sigs.k8s.io/yaml"

	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/record"
)

const dir = "../../config"

func read(t *testing.T, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// containerdConfig is the part of a containerd configuration these
// tests read.
type containerdConfig struct {
	Version int `toml:"version"`
	Plugins map[string]struct {
		Disable    *bool  `toml:"disable"`
		SocketPath string `toml:"socket_path"`
	} `toml:"plugins"`
}

// decode parses a containerd configuration, strictly: a table given twice
// is an error, as it is to containerd.
func decode(t *testing.T, data string) containerdConfig {
	t.Helper()
	var cfg containerdConfig
	if _, err := toml.Decode(data, &cfg); err != nil {
		t.Fatalf("not TOML: %v\n%s", err, data)
	}
	return cfg
}

func TestContainerdConfigsEnableNRI(t *testing.T) {
	for _, tc := range []struct{ name string }{{"containerd-1.7.toml"}, {"containerd-2.x.toml"}} {
		t.Run(tc.name, func(t *testing.T) {
			nriOn(t, decode(t, string(read(t, tc.name))))
		})
	}
}

func nriOn(t *testing.T, cfg containerdConfig) {
	t.Helper()
	nri, ok := cfg.Plugins["io.containerd.nri.v1.nri"]
	if !ok || nri.Disable == nil || *nri.Disable || nri.SocketPath != "/var/run/nri/nri.sock" {
		t.Errorf("NRI section %+v: want disable = false and the default socket", nri)
	}
}

// k3sBase stands in for the base templates k3s defines
// (pkg/agent/templates: ContainerdConfigTemplate, version 2, and
// ContainerdConfigTemplateV3, version 3), with what matters here: the
// version header, the CRI plugin's tables, and, in version 3, the NRI
// table k3s writes itself, with disable = true, only when it runs
// rootless (IsRunningInUserNS).
var k3sBase = map[int]string{
	2: `version = 2
[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
`,
	3: `version = 3
[plugins.'io.containerd.cri.v1.runtime']
  enable_selinux = false
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.'runc']
  runtime_type = "io.containerd.runc.v2"
{{ if .IsRunningInUserNS }}
[plugins.'io.containerd.nri.v1.nri']
  disable = true
{{ end }}
`,
}

// TestK3sTemplates renders each k3s template as k3s does (text/template,
// its base defined as "base", k3s's data), rootful and rootless, and
// checks the result: the version k3s reads that file for, NRI on with
// nri-gpu's socket where containerd can have it, and no table twice.
func TestK3sTemplates(t *testing.T) {
	for _, tc := range []struct {
		file     string
		version  int
		rootless bool
	}{
		{"k3s/config-v3.toml.tmpl", 3, false},
		{"k3s/config-v3.toml.tmpl", 3, true},
		{"k3s/config.toml.tmpl", 2, false},
	} {
		t.Run(fmt.Sprintf("%s rootless=%v", tc.file, tc.rootless), func(t *testing.T) {
			tmpl := template.Must(template.New(tc.file).Parse(string(read(t, tc.file))))
			template.Must(tmpl.New("base").Parse(k3sBase[tc.version]))
			var out strings.Builder
			if err := tmpl.Execute(&out, struct{ IsRunningInUserNS bool }{tc.rootless}); err != nil {
				t.Fatal(err)
			}
			cfg := decode(t, out.String())
			if cfg.Version != tc.version {
				t.Errorf("version %d, want %d", cfg.Version, tc.version)
			}
			if tc.rootless {
				if nri := cfg.Plugins["io.containerd.nri.v1.nri"]; nri.Disable == nil || !*nri.Disable {
					t.Errorf("rootless: NRI %+v, want k3s's own disable = true left alone", nri)
				}
				return
			}
			nriOn(t, cfg)
		})
	}
}

func TestPluginConfigsValidate(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join(dir, "nri-gpu*.yaml"))
	files = append(files, filepath.Join(dir, "preregistered", "10-nri-gpu.conf"))
	for _, f := range files {
		data := mustRead(t, f)
		if problems := config.Problems(data); len(problems) > 0 {
			t.Errorf("%s: %v", f, problems)
		}
		// Each is written in the current layout, not the one before
		// versions that Parse still converts.
		var head struct {
			Version string `json:"version"`
		}
		if err := yaml.Unmarshal(data, &head); err != nil || head.Version != config.Version {
			t.Errorf("%s: version %q (%v), want %q", f, head.Version, err, config.Version)
		}
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestSystemdUnit(t *testing.T) {
	unit := string(read(t, "systemd/nri-gpu.service"))
	for _, want := range []string{"After=containerd.service", "Restart=always", "ExecStart=/usr/local/bin/nri-gpu --config /etc/nri-gpu/config.yaml", "WantedBy=multi-user.target",
		// The state dir, /run/nri-gpu, writable and kept across restarts.
		"RuntimeDirectory=" + filepath.Base(filepath.Dir(record.DefaultPath)), "RuntimeDirectoryPreserve=yes"} {
		if !strings.Contains(unit, want+"\n") {
			t.Errorf("unit lacks %q", want)
		}
	}
}

// daemonSet is the part of a DaemonSet this test reads.
type daemonSet struct {
	Kind string
	Spec struct {
		UpdateStrategy struct {
			RollingUpdate struct {
				MaxSurge any `json:"maxSurge"`
			} `json:"rollingUpdate"`
		} `json:"updateStrategy"`
		Template struct {
			Spec struct {
				PriorityClassName string `json:"priorityClassName"`
				Containers        []struct {
					Args            []string `json:"args"`
					SecurityContext struct {
						Privileged *bool `json:"privileged"`
					} `json:"securityContext"`
					VolumeMounts []struct {
						Name, MountPath string
						ReadOnly        bool `json:"readOnly"`
					} `json:"volumeMounts"`
				}
				Volumes []struct {
					Name     string
					HostPath *struct{ Path string } `json:"hostPath"`
				}
			}
		}
	}
}

func TestDaemonSet(t *testing.T) {
	var ds daemonSet
	var configMap struct {
		Kind string
		Data map[string]string
	}
	for _, doc := range strings.Split(string(read(t, "kubernetes/daemonset.yaml")), "\n---\n") {
		var kind struct{ Kind string }
		if err := yaml.Unmarshal([]byte(doc), &kind); err != nil {
			t.Fatalf("not YAML: %v", err)
		}
		switch kind.Kind {
		case "DaemonSet":
			if err := yaml.Unmarshal([]byte(doc), &ds); err != nil {
				t.Fatal(err)
			}
		case "ConfigMap":
			if err := yaml.Unmarshal([]byte(doc), &configMap); err != nil {
				t.Fatal(err)
			}
		}
	}
	if problems := config.Problems([]byte(configMap.Data["config.yaml"])); len(problems) > 0 {
		t.Errorf("the ConfigMap's config.yaml: %v", problems)
	}
	pod := ds.Spec.Template.Spec
	// A surge of one, each new nri-gpu taking over from the one it
	// replaces (--take-over below).
	if pod.PriorityClassName != "system-node-critical" || ds.Spec.UpdateStrategy.RollingUpdate.MaxSurge != float64(1) {
		t.Errorf("priority %q, maxSurge %v: want system-node-critical and 1", pod.PriorityClassName, ds.Spec.UpdateStrategy.RollingUpdate.MaxSurge)
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers", len(pod.Containers))
	}
	if args := pod.Containers[0].Args; !slices.Contains(args, "--take-over") {
		t.Errorf("nri-gpu's args %v: want --take-over, for the surge", args)
	}
	c := pod.Containers[0]
	if p := c.SecurityContext.Privileged; p == nil || *p {
		t.Error("the container must say privileged: false")
	}
	hostPaths := map[string]string{}
	for _, v := range pod.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath.Path
		}
	}
	// path -> read-only; the state dir, where the plugin looks for it.
	want := map[string]bool{"/var/run/nri": false, "/etc/cdi": true, "/var/run/cdi": true, "/dev": true, filepath.Dir(record.DefaultPath): false, "/sys/fs/cgroup": false}
	var got []string
	for _, m := range c.VolumeMounts {
		path, ok := hostPaths[m.Name]
		if !ok {
			continue
		}
		got = append(got, path)
		if path == filepath.Dir(record.DefaultPath) && m.MountPath != path {
			t.Errorf("the state dir is mounted at %s, not where nri-gpu keeps its state (%s)", m.MountPath, path)
		}
		if ro, known := want[path]; !known {
			t.Errorf("mounts host path %s, which nri-gpu does not need", path)
		} else if ro != m.ReadOnly {
			t.Errorf("host path %s mounted readOnly=%v, want %v", path, m.ReadOnly, ro)
		}
	}
	for path := range want {
		if !slices.Contains(got, path) {
			t.Errorf("does not mount host path %s", path)
		}
	}
}

// TestNVIDIAKeysOnlyWhereMeant: one example turns NVIDIA's annotation key
// on, and no other file under config/ names it outside comments.
func TestNVIDIAKeysOnlyWhereMeant(t *testing.T) {
	var naming []string
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, line := range strings.Split(string(data), "\n") {
			if code, _, _ := strings.Cut(line, "#"); strings.Contains(code, config.KeyNVIDIA) {
				naming = append(naming, filepath.Base(path))
				break
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(naming, []string{"nri-gpu-nvidia-annotations.yaml"}) {
		t.Errorf("files naming %s outside comments: %v, want only nri-gpu-nvidia-annotations.yaml", config.KeyNVIDIA, naming)
	}
	cfg, err := config.Parse(read(t, "nri-gpu-nvidia-annotations.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(cfg.AnnotationKeys, config.KeyNVIDIA) || !slices.Contains(cfg.AnnotationKeys, config.KeyNRIGPU) {
		t.Errorf("annotationKeys %v: want both", cfg.AnnotationKeys)
	}
}
