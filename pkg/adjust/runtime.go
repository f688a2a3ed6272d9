package adjust

import (
	"fmt"
	"strconv"
	"strings"
)

// Runtime is what the connected runtime's NRI applies of an adjustment
// beyond the device nodes, mounts, env and hooks that every NRI-enabled
// containerd applies. The plugin decides it once per connection, from
// the name and version NRI's Configure reports.
type Runtime struct {
	// Name and Version identify the runtime, for messages.
	Name, Version string
	// CgroupRules: the device cgroup rules of an adjustment are applied,
	// after the "rw" rule NRI derives from each device it adds.
	CgroupRules bool
	// NetDevices: net devices are moved into the container.
	NetDevices bool
	// RDT: the RDT adjustments (CLOS, schemata, monitoring) are applied.
	RDT bool
}

// RuntimeOf returns what a runtime applies, by the name and version NRI
// reports: containerd 2.x (NRI v0.9 and later) applies cgroup rules, net
// devices and RDT; containerd 1.x (NRI up to v0.8) and runtimes nri-gpu
// does not know apply none of them.
func RuntimeOf(name, version string) Runtime {
	rt := Runtime{Name: name, Version: version}
	major, _, _ := strings.Cut(strings.TrimPrefix(version, "v"), ".")
	if n, err := strconv.Atoi(major); err == nil && name == "containerd" && n >= 2 {
		rt.CgroupRules, rt.NetDevices, rt.RDT = true, true, true
	}
	return rt
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
