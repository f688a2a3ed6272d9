package adjust

import (
	"fmt"
	"strings"

	"github.com/containerd/nri/pkg/api"
	nrisemver "github.com/containerd/nri/pkg/version"
)

// Runtime is what the connected runtime's NRI applies of an adjustment
// beyond the device nodes, mounts, env and hooks that every NRI-enabled
// runtime applies. The plugin decides it once per connection, from the
// NRI version the runtime runs.
type Runtime struct {
	// Name and Version identify the runtime, for messages; NRI is the NRI
	// version it runs.
	Name, Version, NRI string
	// CgroupRules: the device cgroup rules of an adjustment are applied,
	// after the "rw" rule NRI derives from each device it adds.
	CgroupRules bool
	// NetDevices: net devices are moved into the container.
	NetDevices bool
	// RDT: the RDT adjustments (CLOS, schemata, monitoring) are applied.
	RDT bool
}

// The NRI releases whose adjustment generator, which every NRI runtime
// applies adjustments with (containerd's CRI, CRI-O), first applies a
// capability: an adjustment's device cgroup rules from v0.10.0
// (pkg/runtime-tools/generate's AdjustResources: v0.9.x leaves them
// out), net devices and RDT from v0.11.0.
const (
	NRICgroupRules = "v0.10.0"
	NRIAll         = "v0.11.0"
)

// RuntimeOf returns what a runtime applies, by the NRI version it runs
// (nriVersion: as the runtime reports it, or as InferNRI infers it from
// the runtime's name and release): cgroup rules from NRICgroupRules
// (containerd 2.2, CRI-O 1.35), net devices and RDT from NRIAll;
// containerd 1.7, 2.0 and 2.1 (NRI v0.8 and older), CRI-O up to 1.34, and
// an NRI version not known apply none of them.
func RuntimeOf(name, version, nriVersion string) Runtime {
	rt := Runtime{Name: name, Version: version, NRI: nriVersion}
	switch nrisemver.FindClosestMatch(nriVersion, []string{NRICgroupRules, NRIAll}) {
	case NRIAll:
		rt.CgroupRules, rt.NetDevices, rt.RDT = true, true, true
	case NRICgroupRules:
		rt.CgroupRules = true
	}
	return rt
}

// measuredNRI are the NRI versions of runtime releases whose own
// go.mod says otherwise than NRI's map of releases (NRI v0.12.5's
// api.InferVersionFromRuntime), by runtime and release line: CRI-O
// v1.34.0's go.mod requires github.com/containerd/nri
// v0.9.1-0.20250219030224-e597e7849f24, which applies no cgroup rule of
// a plugin (the end-to-end corpus on CRI-O 1.34.0 saw none applied), where
// the map says v0.10.0 for every 1.34 release. The later 1.34 releases
// could not be read here and are taken as 1.34.0: refusing a device that
// needs a cgroup rule is safe, assuming a rule is applied is not (a
// narrower access would be widened to NRI's "rw").
var measuredNRI = map[string]map[string]string{
	"cri-o": {"v1.34": "v0.9.1-0.20250219030224-e597e7849f24"},
}

// InferNRI infers the NRI version a runtime's release runs, where the
// runtime does not report it: as measuredNRI says for its release line,
// else as NRI's own map of containerd's and CRI-O's releases says.
func InferNRI(name, version string) (string, error) {
	version = "v" + strings.TrimPrefix(version, "v")
	if parts := strings.SplitN(version, ".", 3); len(parts) == 3 {
		if v, ok := measuredNRI[name][parts[0]+"."+parts[1]]; ok {
			return v, nil
		}
	}
	return api.InferVersionFromRuntime(name, version)
}

// named is the runtime's name and version, for messages.
func (rt Runtime) named() string {
	if s := strings.TrimSpace(rt.Name + " " + rt.Version); s != "" {
		return s
	}
	return "this runtime"
}

// String names the runtime and what it applies, for the log.
func (rt Runtime) String() string {
	var can, cannot []string
	for _, c := range []struct {
		name string
		ok   bool
	}{{"cgroup rules", rt.CgroupRules}, {"net devices", rt.NetDevices}, {"RDT", rt.RDT}} {
		if c.ok {
			can = append(can, c.name)
		} else {
			cannot = append(cannot, c.name)
		}
	}
	s := strings.TrimSpace(rt.Name + " " + rt.Version)
	if s == "" {
		s = "an unknown runtime"
	}
	if rt.NRI != "" {
		s += " (NRI " + rt.NRI + ")"
	}
	if len(can) > 0 {
		s += fmt.Sprintf(" applies %s", strings.Join(can, ", "))
		if len(cannot) > 0 {
			s += ";"
		}
	}
	if len(cannot) > 0 {
		s += fmt.Sprintf(" does not apply %s", strings.Join(cannot, ", "))
	}
	return s
}
