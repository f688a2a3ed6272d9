package harness

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"text/template"
	"time"

	oci "github.com/opencontainers/runtime-spec/specs-go"
)

// CRIOEnv names the directory holding crio and pinns, which `make
// e2e-tools` builds from CRI-O's module.
const CRIOEnv = "NRI_GPU_CRIO"

// CRIOTools are the binaries a CRI-O run needs beside the tools' runc:
// crio and pinns (built from CRI-O's module), conmon and skopeo
// (Debian's).
type CRIOTools struct {
	Crio, Pinns, Conmon, Skopeo string
	// Version is what crio --version says, e.g. "1.34.0".
	Version string
}

// FindCRIO finds CRI-O's binaries in dir (or $NRI_GPU_CRIO when empty)
// and on the host, and says which are missing.
func FindCRIO(dir string) (CRIOTools, error) {
	dir, err := dirOf(dir, CRIOEnv, "CRI-O", "make e2e-tools builds it")
	if err != nil {
		return CRIOTools{}, err
	}
	t := CRIOTools{Crio: filepath.Join(dir, "crio"), Pinns: filepath.Join(dir, "pinns")}
	errs := missing(t.Crio, t.Pinns)
	for name, p := range map[string]*string{"conmon": &t.Conmon, "skopeo": &t.Skopeo} {
		if *p, err = exec.LookPath(name); err != nil {
			errs = append(errs, fmt.Errorf("%s (Debian's package): %w", name, err))
		}
	}
	if out, err := exec.Command(t.Crio, "--version").Output(); err == nil {
		// "crio version 1.34.0" (older releases: "Version: 1.34.0").
		for _, line := range strings.Split(string(out), "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "Version:"); ok {
				t.Version = strings.TrimSpace(v)
			} else if v, ok := strings.CutPrefix(line, "crio version "); ok {
				t.Version = strings.TrimSpace(v)
			}
		}
	}
	return t, errors.Join(errs...)
}

// crioConfig is CRI-O's configuration of a run: every path below the
// run's directory, cgroupfs (systemd's cgroup manager on a node of
// systemd, Options.SystemdCgroup), no infra container where a pod shares no
// PID namespace (these machines refuse the infra container's
// oom_score_adj), the tools' runc, NRI on at a socket of the run's.
const crioConfig = `[crio]
root = "{{.Dir}}/root"
runroot = "{{.Dir}}/runroot"
storage_driver = "overlay"
log_dir = "{{.Dir}}/logs"
version_file = "{{.Dir}}/version"
version_file_persist = "{{.Dir}}/version-persist"
clean_shutdown_file = "{{.Dir}}/clean.shutdown"

[crio.api]
listen = "{{.Dir}}/crio.sock"
stream_address = "127.0.0.1"
stream_port = "0"

[crio.runtime]
default_runtime = "runc"
cgroup_manager = "{{.CgroupManager}}"
conmon_cgroup = "{{.ConmonCgroup}}"
drop_infra_ctr = true
pinns_path = "{{.Pinns}}"
namespaces_dir = "{{.Dir}}/ns"
container_exits_dir = "{{.Dir}}/exits"
container_attach_socket_dir = "{{.Dir}}/attach"
cdi_spec_dirs = [{{.CDIDirs}}]

[crio.runtime.runtimes.runc]
runtime_path = "{{.Runc}}"
runtime_type = "oci"
runtime_root = "{{.Dir}}/runc"
monitor_path = "{{.Conmon}}"

[crio.image]
signature_policy = "{{.Dir}}/policy.json"
pause_image = "{{.Image}}"

[crio.network]
network_dir = "{{.Dir}}/cni/conf"
plugin_dirs = ["{{.Dir}}/cni/bin"]

[crio.nri]
enable_nri = true
nri_listen = "{{.Dir}}/nri/nri.sock"
nri_plugin_dir = "{{.Dir}}/nri/plugins"
nri_plugin_config_dir = "{{.Dir}}/nri/conf.d"
nri_plugin_registration_timeout = "5s"
nri_plugin_request_timeout = "2s"
`

// StartCRIO writes CRI-O's configuration under dir, starts it, waits for
// CRI to answer and imports the image (skopeo, into its storage). On
// error it cleans up what it began. CRI-O's own CDI is always on (it
// has no enable_cdi): opts.CDISpecDirs are the directories it reads
// specs from, none when empty, so that it resolves no device (the
// closest to containerd's enable_cdi = false); opts.Image is the image
// tar.
func StartCRIO(dir string, tools Tools, crio CRIOTools, opts Options) (c *Containerd, err error) {
	c = &Containerd{
		Dir:     dir,
		Tools:   tools,
		Address: filepath.Join(dir, "crio.sock"),
		NRISock: filepath.Join(dir, "nri", "nri.sock"),
		LogPath: filepath.Join(dir, "crio.log"),
		crio:    &crio,
		crictl:  tools.Path("crictl"),
		prefix:  opts.Prefix,
		systemd: opts.SystemdCgroup || os.Getenv(SystemdCgroupEnv) == "1",
	}
	if err := makeDirs(dir, "root", "runroot", "logs", "ns", "exits", "attach", "runc", "nri/plugins", "nri/conf.d", "cni/bin", "cni/conf", "crio.conf.d"); err != nil {
		return nil, err
	}
	var cfg bytes.Buffer
	manager, conmon := "cgroupfs", "pod"
	if c.systemd {
		manager, conmon = "systemd", "system.slice"
	}
	if err := template.Must(template.New("crio").Parse(crioConfig)).Execute(&cfg, map[string]any{
		"Dir": dir, "Pinns": crio.Pinns, "Conmon": crio.Conmon, "Runc": tools.Runc, "Image": ImageRef,
		"CDIDirs": quotedList(opts.CDISpecDirs), "CgroupManager": manager, "ConmonCgroup": conmon,
	}); err != nil {
		return nil, err
	}
	c.cfgPath = filepath.Join(dir, "crio.conf")
	if err := os.WriteFile(c.cfgPath, cfg.Bytes(), 0o644); err != nil {
		return nil, err
	}
	// Images of any source are accepted: the run's only image is local.
	if err := os.WriteFile(filepath.Join(dir, "policy.json"), []byte(`{"default":[{"type":"insecureAcceptAnything"}]}`), 0o644); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = c.Stop()
		}
	}()
	if opts.Image != "" {
		if err := c.ImportImage(opts.Image); err != nil {
			return c, err
		}
	}
	return c, c.start()
}

// ImportImage imports an image tar (BuildImage's, BuildNamedImage's, the
// nri-gpu image's) into the runtime's store under the name it carries:
// with ctr into containerd's, with skopeo into CRI-O's.
func (c *Containerd) ImportImage(image string) error {
	if c.crio == nil {
		if out, err := c.Ctr("images", "import", "--snapshotter", "overlayfs", image); err != nil {
			return fmt.Errorf("importing %s: %w: %s", image, err, out)
		}
		return nil
	}
	source, name, err := imageSource(image)
	if err != nil {
		return err
	}
	dest := fmt.Sprintf("containers-storage:[overlay@%s+%s]%s", filepath.Join(c.Dir, "root"), filepath.Join(c.Dir, "runroot"), name)
	out, err := run(2*time.Minute, c.crio.Skopeo, "--insecure-policy", "copy", source, dest)
	if err != nil {
		return fmt.Errorf("skopeo copy %s: %w: %s", image, err, out)
	}
	return nil
}

// qualified is an image name with a registry: "localhost/" before one
// without, as containers' storage names a local image. (A pod asking a
// short name, the chart's nri-gpu:latest, is not resolved to it by CRI-O
// 1.34 without a registries.conf of the machine's naming localhost;
// CONTAINERS_REGISTRIES_CONF was not read by it.)
func qualified(name string) string {
	if first, _, ok := strings.Cut(name, "/"); ok && (strings.ContainsAny(first, ".:") || first == "localhost") {
		return name
	}
	return "localhost/" + name
}

// imageSource is skopeo's source of an image tar and the name it gives
// its image: an OCI archive's (BuildImage's) by containerd's
// io.containerd.image.name annotation of its index, else ImageRef; a
// Docker archive's (the nri-gpu image's) by its manifest's first tag.
func imageSource(image string) (source, name string, err error) {
	f, err := os.Open(image)
	if err != nil {
		return "", "", err
	}
	defer f.Close()
	r := tar.NewReader(f)
	for {
		h, err := r.Next()
		if err != nil {
			return "", "", fmt.Errorf("%s: neither index.json nor manifest.json: %w", image, err)
		}
		switch strings.TrimPrefix(h.Name, "./") {
		case "index.json":
			var index struct {
				Manifests []struct {
					Annotations map[string]string `json:"annotations"`
				} `json:"manifests"`
			}
			if err := json.NewDecoder(r).Decode(&index); err != nil {
				return "", "", fmt.Errorf("%s: index.json: %w", image, err)
			}
			for _, m := range index.Manifests {
				if name := m.Annotations["io.containerd.image.name"]; name != "" {
					return "oci-archive:" + image, qualified(name), nil
				}
			}
			return "oci-archive:" + image, ImageRef, nil
		case "manifest.json":
			var manifest []struct{ RepoTags []string }
			if err := json.NewDecoder(r).Decode(&manifest); err != nil || len(manifest) == 0 || len(manifest[0].RepoTags) == 0 {
				return "", "", fmt.Errorf("%s: manifest.json names no tag (%v)", image, err)
			}
			return "docker-archive:" + image, qualified(manifest[0].RepoTags[0]), nil
		}
	}
}

// inspectSpec returns a CRI-O container's final OCI spec, as crictl
// inspect prints it.
func (c *Containerd) inspectSpec(id string) (*oci.Spec, error) {
	out, err := c.Crictl("inspect", id)
	if err != nil {
		return nil, fmt.Errorf("crictl inspect: %w: %s", err, out)
	}
	var info struct {
		Info struct {
			RuntimeSpec *oci.Spec `json:"runtimeSpec"`
		} `json:"info"`
	}
	if err := json.Unmarshal([]byte(out), &info); err != nil {
		return nil, fmt.Errorf("parsing crictl inspect: %w", err)
	}
	if info.Info.RuntimeSpec == nil {
		return nil, errors.New("crictl inspect printed no runtime spec")
	}
	return info.Info.RuntimeSpec, nil
}

// CRIO reports whether the runtime is CRI-O.
func (c *Containerd) CRIO() bool { return c.crio != nil }

// killConmons kills the conmon processes of the CRI-O run in dir, which
// outlive it.
func killConmons(dir string) error {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return err
	}
	for _, e := range entries {
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(cmdline), "\x00")
		if filepath.Base(args[0]) == "conmon" && strings.Contains(string(cmdline), dir+"/") {
			var pid int
			fmt.Sscan(e.Name(), &pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	return nil
}
