// Package doctor checks a node for what nri-gpu needs: the NRI socket
// answering, NRI enabled in containerd's or CRI-O's configuration (and
// what their CDI implies), trusted and valid CDI specs, devices, hook executables
// present and allowed, a valid nri-gpu configuration, its state file, and
// with DRA on its DRA driver's program. Each finding is
// OK, WARN or FAIL, with a fix for the latter two.
package doctor

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/memlimit"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// Status is the outcome of one check.
type Status string

// Statuses, from good to bad.
const (
	OK   Status = "OK"
	Warn Status = "WARN"
	Fail Status = "FAIL"
)

// Finding is the result of one check.
type Finding struct {
	Status Status
	// Check names what was checked.
	Check string
	// Detail says what was found.
	Detail string
	// Fix says what to do, for WARN and FAIL.
	Fix string
}

// Input is what to check.
type Input struct {
	// SocketPath is the NRI socket.
	SocketPath string
	// ContainerdConfig is containerd's config.toml; "" skips it.
	ContainerdConfig string
	// CRIOConfig is CRI-O's crio.conf, read with the drop-ins of the
	// crio.conf.d beside it; "" skips it.
	CRIOConfig string
	// Config is nri-gpu's configuration, and ConfigFile where it came
	// from ("" for the defaults).
	Config     *config.Config
	ConfigFile string
	// Record is what nri-gpu's state file tells; nil skips it.
	Record *Record
	// DRADriver is the DRA driver's program as nri-gpu would find it;
	// nil skips it (DRA is off).
	DRADriver *Program
	// MemoryLimits is whether the driver can enforce GPU memory limits
	// per cgroup here (memlimit.Probe); nil where NVML cannot be opened,
	// NoNVML saying why.
	MemoryLimits *memlimit.Support
	NoNVML       error
}

// Program is a program nri-gpu starts, as the caller looked it up.
type Program struct {
	Path string
	// Err says why it was not found; nil when it was.
	Err error
}

// Record is what nri-gpu's state file tells, as the caller read it.
type Record struct {
	Path string
	// Err says why it cannot be read back; nil when it can or there is
	// none.
	Err error
	// Rebuilt are the pods ("namespace/name") that hold devices found
	// in their containers with no record of them.
	Rebuilt []string
	// Damaged are the unusable records set aside beside it.
	Damaged []string
}

// Run runs every check.
func Run(in Input) []Finding {
	var out []Finding
	out = append(out, checkConfigFile(in.ConfigFile))
	out = append(out, checkSocket(in.SocketPath))
	out = append(out, checkRuntimes(in)...)
	out = append(out, checkSpecs(in.Config)...)
	if in.Record != nil {
		out = append(out, checkRecord(*in.Record)...)
	}
	if in.DRADriver != nil {
		out = append(out, checkDRADriver(*in.DRADriver))
	}
	return append(out, checkMemoryLimits(in))
}

// checkMemoryLimits says whether the driver bounds each holder of a GPU
// to its memory (cgroup v2, a driver with per-cgroup limits, GPUs that
// have them), and why not.
func checkMemoryLimits(in Input) Finding {
	const check = "GPU memory limits"
	s := in.MemoryLimits
	if s == nil {
		return Finding{OK, check, fmt.Sprintf("no NVIDIA driver to ask (%v): nothing to limit", in.NoNVML), ""}
	}
	why := s.Why()
	switch {
	case len(why) == 0 && s.Dmem != nil:
		return Finding{Warn, check, fmt.Sprintf("the driver has per-cgroup limits on its %d GPUs, but %v", len(s.GPUs), s.Dmem),
			"enable dmem for the containers' cgroups (" + memlimit.DmemHint + "), or the driver refuses each container's limit and nri-gpu stops the container"}
	case len(why) == 0:
		return Finding{OK, check, fmt.Sprintf("the driver can bound each holder's memory on its %d GPUs (cgroup v2, NVML's per-cgroup limits)", len(s.GPUs)), ""}
	}
	then := "a GPU time-slicing shares with its memory counted is refused here (policy.memoryLimits: enforced)"
	if in.Config != nil && in.Config.Policy.MemoryLimits == config.MemoryLimitsAgreement {
		then = "the holders of a GPU time-slicing shares with its memory counted run bounded by agreement only (policy.memoryLimits: agreement)"
	}
	return Finding{Warn, check, "the driver cannot bound GPU memory per container here: " + strings.Join(why, "; "),
		"until then " + then + "; the driver enforces limits on cgroup v2 with a driver of CUDA 13.4 or later, on whole GPUs"}
}

// checkDRADriver says whether nri-gpu, with DRA on, finds the program of
// its DRA driver.
func checkDRADriver(p Program) Finding {
	if p.Err != nil {
		return Finding{Fail, "DRA driver", "start.dra.enabled, but " + p.Err.Error(),
			"install nri-gpu-dra beside nri-gpu, or on the PATH (make build writes both; the image has both)"}
	}
	return Finding{OK, "DRA driver", p.Path + ": nri-gpu starts it", ""}
}

// checkRecord says whether nri-gpu runs on a whole record of what pods
// hold, or on one rebuilt from the containers.
func checkRecord(r Record) []Finding {
	var out []Finding
	switch {
	case r.Err != nil:
		out = append(out, Finding{Fail, "state file", r.Err.Error(),
			"nri-gpu sets it aside at its next start and holds each device found in a running container for that pod alone; find what damaged it"})
	case len(r.Rebuilt) > 0:
		out = append(out, Finding{Warn, "state file", fmt.Sprintf("runs on a rebuilt record: %d pods hold devices found in their containers with no record of how they got them, each alone until removed: %s",
			len(r.Rebuilt), strings.Join(r.Rebuilt, ", ")), "nothing to do for the pods (their devices come free when they are removed); find what lost the record"})
	default:
		out = append(out, Finding{OK, "state file", r.Path + " is whole (or not written yet)", ""})
	}
	if len(r.Damaged) > 0 {
		out = append(out, Finding{Warn, "state file", "unusable records set aside: " + strings.Join(r.Damaged, ", "), "look at them, then remove them"})
	}
	return out
}

// Failed reports whether any finding failed.
func Failed(fs []Finding) bool {
	return slices.ContainsFunc(fs, func(f Finding) bool { return f.Status == Fail })
}

func checkConfigFile(file string) Finding {
	if file == "" {
		return Finding{OK, "nri-gpu config", "none given: the defaults apply", ""}
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return Finding{Fail, "nri-gpu config", err.Error(), "give --config a readable file"}
	}
	if problems := config.Problems(data); len(problems) > 0 {
		var msgs []string
		for _, p := range problems {
			msgs = append(msgs, p.String())
		}
		return Finding{Fail, "nri-gpu config", file + ": " + strings.Join(msgs, "; "), "run nri-gpu validate " + file + " and mend what it says"}
	}
	return Finding{OK, "nri-gpu config", file + " is valid", ""}
}

func checkSocket(path string) Finding {
	conn, err := net.DialTimeout("unix", path, 2*time.Second)
	if err != nil {
		return Finding{Fail, "NRI socket", fmt.Sprintf("%s does not answer: %v", path, err),
			"enable NRI in containerd (config/containerd-1.7.toml, on by default in 2.x), restart containerd, and point --socket-path at its socket_path"}
	}
	_ = conn.Close()
	return Finding{OK, "NRI socket", path + " answers", ""}
}

// checkContainerd reads containerd's config.toml: NRI must be on, and its
// socket the one nri-gpu uses; enable_cdi is reported with what it means.
func checkContainerd(file, socketPath string) []Finding {
	var raw map[string]any
	if _, err := toml.DecodeFile(file, &raw); err != nil {
		return []Finding{{Fail, "containerd config", fmt.Sprintf("%s: %v", file, err), "mend the TOML of " + file}}
	}
	version, _ := raw["version"].(int64)
	plugins, _ := raw["plugins"].(map[string]any)
	nri, _ := plugins["io.containerd.nri.v1.nri"].(map[string]any)
	var out []Finding
	disabled, set := nri["disable"].(bool)
	switch {
	case version >= 3 && !(set && disabled):
		out = append(out, Finding{OK, "containerd NRI", fmt.Sprintf("config version %d (containerd 2.x): NRI is on", version), ""})
	case version < 3 && set && !disabled:
		out = append(out, Finding{OK, "containerd NRI", fmt.Sprintf("config version %d (containerd 1.x): NRI is on", version), ""})
	default:
		out = append(out, Finding{Fail, "containerd NRI", fmt.Sprintf("NRI is off in %s", file),
			`set disable = false under [plugins."io.containerd.nri.v1.nri"] (config/containerd-1.7.toml) and restart containerd`})
	}
	if sp, ok := nri["socket_path"].(string); ok && sp != socketPath {
		out = append(out, Finding{Warn, "containerd NRI socket", fmt.Sprintf("containerd listens on %s, nri-gpu connects to %s", sp, socketPath),
			"run nri-gpu with --socket-path " + sp})
	}
	cri := "io.containerd.grpc.v1.cri"
	cdiDefault := false
	if version >= 3 {
		cri, cdiDefault = "io.containerd.cri.v1.runtime", true
	}
	criCfg, _ := plugins[cri].(map[string]any)
	enableCDI, ok := criCfg["enable_cdi"].(bool)
	if !ok {
		enableCDI = cdiDefault
	}
	if enableCDI {
		out = append(out, Finding{OK, "containerd CDI", "enable_cdi is on: containerd injects cdi.k8s.io devices itself, and nri-gpu does not inject those again; pod annotations are nri-gpu's", ""})
	} else {
		out = append(out, Finding{OK, "containerd CDI", "enable_cdi is off: nri-gpu injects every device, from pod and cdi.k8s.io annotations", ""})
	}
	return out
}

// maxListed bounds the files a finding names.
const maxListed = 5

// checkSpecs loads the spec dirs as the plugin does.
func checkSpecs(cfg *config.Config) []Finding {
	var out []Finding
	for _, dir := range cfg.CDISpecDirs {
		fi, err := os.Stat(dir)
		switch {
		case errors.Is(err, os.ErrNotExist):
			out = append(out, Finding{Warn, "spec dir", dir + " does not exist", "fine if no spec is to be there; nri-gpu picks it up once it is created"})
			continue
		case err == nil && !fi.IsDir():
			out = append(out, Finding{Fail, "spec dir", dir + " is not a directory", "remove it, or make it the directory of the specs: nri-gpu does not start with a spec dir that is something else"})
			continue
		}
		if err := specs.CheckDir(dir); err != nil {
			out = append(out, Finding{Fail, "spec dir", err.Error(), "make " + dir + " owned by root and writable by root only (chmod go-w)"})
		} else {
			out = append(out, Finding{OK, "spec dir", dir + " exists and is trusted", ""})
		}
	}
	snap, err := specs.Load(cfg.CDISpecDirs)
	if err != nil {
		return append(out, Finding{Fail, "specs", err.Error(), "check cdiSpecDirs"})
	}
	for _, path := range slices.Sorted(maps.Keys(snap.Problems)) {
		fix := "mend or remove the spec"
		if errors.Is(errors.Join(snap.Problems[path]...), specs.ErrUntrusted) {
			fix = "make the spec and its directory owned by root and writable by root only (chmod go-w)"
		}
		out = append(out, Finding{Fail, "spec", fmt.Sprintf("%s: %v", path, errors.Join(snap.Problems[path]...)), fix})
	}
	hooks := map[string][]string{}   // hook path -> devices
	missing := map[string][]string{} // spec file -> host files it mounts that are gone
	n := 0
	for _, e := range snap.Entries() {
		if e.Untrusted != nil {
			continue
		}
		n++
		for _, h := range e.Hooks {
			hooks[h] = append(hooks[h], e.Footprint.Name)
		}
		for _, m := range append(slices.Clone(e.Device.GetSpec().ContainerEdits.Mounts), e.Device.ContainerEdits.Mounts...) {
			if m == nil || slices.Contains(missing[e.Spec], m.HostPath) {
				continue
			}
			if _, err := os.Lstat(m.HostPath); errors.Is(err, os.ErrNotExist) {
				missing[e.Spec] = append(missing[e.Spec], m.HostPath)
			}
		}
	}
	for _, spec := range slices.Sorted(maps.Keys(missing)) {
		files := missing[spec]
		more := ""
		if len(files) > maxListed {
			files, more = files[:maxListed], fmt.Sprintf(" and %d more", len(files)-maxListed)
		}
		out = append(out, Finding{Warn, "spec files", fmt.Sprintf("%s mounts files that no longer exist (a driver upgraded or removed since the spec was written?): %s%s; containers given its devices fail to start", spec, strings.Join(files, ", "), more),
			"regenerate the spec for the driver installed (nvidia-ctk cdi generate, or nri-gpu generate)"})
	}
	if n == 0 {
		out = append(out, Finding{Warn, "devices", "no device in " + strings.Join(cfg.CDISpecDirs, ", "),
			"run nri-gpu generate (or --generate-specs), or install the NVIDIA Container Toolkit"})
	} else {
		out = append(out, Finding{OK, "devices", fmt.Sprintf("%d devices can be injected", n), ""})
	}
	for _, h := range slices.Sorted(maps.Keys(hooks)) {
		devs := strings.Join(hooks[h], ", ")
		switch fi, err := os.Stat(h); {
		case err != nil:
			out = append(out, Finding{Fail, "hook", fmt.Sprintf("%s (for %s) does not exist", h, devs), "install it, or regenerate the specs"})
		case fi.Mode()&0o111 == 0:
			out = append(out, Finding{Fail, "hook", fmt.Sprintf("%s (for %s) is not executable", h, devs), "chmod +x " + h})
		case !slices.Contains(cfg.Policy.HookPaths, h):
			out = append(out, Finding{Fail, "hook", fmt.Sprintf("%s (for %s) is not in policy.hookPaths: those devices are refused", h, devs), "add it to policy.hookPaths if it is trusted"})
		default:
			out = append(out, Finding{OK, "hook", h + " exists and is allowed", ""})
		}
	}
	return out
}
