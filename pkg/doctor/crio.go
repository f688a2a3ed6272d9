package doctor

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/BurntSushi/toml"
)

// CRI-O's defaults (CRI-O 1.30 and later), where its configuration says
// nothing: NRI on, listening at NRI's default socket; CDI specs read from
// CDI's default directories.
var (
	crioNRISocket   = "/var/run/nri/nri.sock"
	crioCDISpecDirs = []string{"/etc/cdi", "/var/run/cdi"}
)

// crioConf is what nri-gpu reads of CRI-O's configuration.
type crioConf struct {
	Crio struct {
		NRI struct {
			Enabled *bool   `toml:"enable_nri"`
			Listen  *string `toml:"nri_listen"`
		} `toml:"nri"`
		Runtime struct {
			CDISpecDirs *[]string `toml:"cdi_spec_dirs"`
		} `toml:"runtime"`
	} `toml:"crio"`
}

// crioFiles are the files of CRI-O's configuration, as CRI-O reads them:
// crio.conf, then each *.conf of the drop-in directory crio.conf.d beside
// it, in lexical order, a later file's keys overriding an earlier one's.
// Those that do not exist are left out.
func crioFiles(file string) []string {
	var out []string
	if _, err := os.Stat(file); err == nil {
		out = append(out, file)
	}
	dropIns, _ := filepath.Glob(filepath.Join(filepath.Dir(file), "crio.conf.d", "*.conf"))
	return append(out, dropIns...) // Glob sorts
}

// checkCRIO reads CRI-O's configuration: NRI must be on (CRI-O's default)
// and its socket the one nri-gpu uses; CRI-O's own CDI, which it cannot
// turn off, is reported with its spec directories.
func checkCRIO(files []string, socketPath string) []Finding {
	var conf crioConf
	for _, f := range files {
		if _, err := toml.DecodeFile(f, &conf); err != nil {
			return []Finding{{Fail, "CRI-O config", fmt.Sprintf("%s: %v", f, err), "mend the TOML of " + f}}
		}
	}
	read := strings.Join(files, ", ")
	var out []Finding
	if on := conf.Crio.NRI.Enabled; on != nil && !*on {
		out = append(out, Finding{Fail, "CRI-O NRI", "NRI is off in " + read,
			"set enable_nri = true under [crio.nri] (or remove enable_nri = false: CRI-O 1.30 and later turn NRI on by default) and restart CRI-O"})
	} else {
		out = append(out, Finding{OK, "CRI-O NRI", "NRI is on (" + read + ")", ""})
	}
	listen := crioNRISocket
	if conf.Crio.NRI.Listen != nil {
		listen = *conf.Crio.NRI.Listen
	}
	if listen != socketPath {
		out = append(out, Finding{Warn, "CRI-O NRI socket", fmt.Sprintf("CRI-O listens on %s, nri-gpu connects to %s", listen, socketPath),
			"run nri-gpu with --socket-path " + listen})
	}
	dirs := crioCDISpecDirs
	if conf.Crio.Runtime.CDISpecDirs != nil {
		dirs = *conf.Crio.Runtime.CDISpecDirs
	}
	if len(dirs) == 0 {
		out = append(out, Finding{OK, "CRI-O CDI", "cdi_spec_dirs is empty: CRI-O's own CDI resolves no device, and nri-gpu injects every device, from pod and cdi.k8s.io annotations", ""})
	} else {
		out = append(out, Finding{OK, "CRI-O CDI", fmt.Sprintf("CRI-O injects cdi.k8s.io and CRI CDI devices itself, from %s (it has no enable_cdi): nri-gpu does not inject those again; pod annotations are nri-gpu's",
			strings.Join(dirs, ", ")), ""})
	}
	return out
}

// checkRuntimes checks the configuration of each runtime that has one
// (containerd's, CRI-O's); where neither has, it warns naming both.
func checkRuntimes(in Input) []Finding {
	var crio []string
	if in.CRIOConfig != "" {
		crio = crioFiles(in.CRIOConfig)
	}
	_, ctdErr := os.Stat(in.ContainerdConfig)
	var out []Finding
	if in.ContainerdConfig != "" && ctdErr == nil {
		out = append(out, checkContainerd(in.ContainerdConfig, in.SocketPath)...)
	}
	if len(crio) > 0 {
		out = append(out, checkCRIO(crio, in.SocketPath)...)
	}
	if len(out) > 0 || (in.ContainerdConfig == "" && in.CRIOConfig == "") {
		return out
	}
	var looked []string
	for _, f := range []string{in.ContainerdConfig, in.CRIOConfig} {
		if f != "" {
			looked = append(looked, f)
		}
	}
	return []Finding{{Warn, "runtime config", "neither " + strings.Join(looked, " nor ") + " exists",
		"pass --containerd-config with containerd's config.toml (k3s: /var/lib/rancher/k3s/agent/etc/containerd/config.toml), or --crio-config with CRI-O's crio.conf (its crio.conf.d beside it is read too)"}}
}
