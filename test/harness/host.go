package harness

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
)

// HostState is what a test's kubelets, containerds and CNI plugins could
// change on the machine if they were not contained: the sysctls they
// write, the paths a node has, this process's cgroups and the nodes'
// bridges. Two of them taken before and after a run must be equal.
type HostState map[string]string

// hostPaths are paths of a real node, which no test may make.
var hostPaths = []string{"/var/lib/kubelet", "/var/log/containers", "/var/log/pods", "/etc/cdi", "/var/run/cdi", "/run/nri", "/run/nri-gpu", NodeDevDir}

// Host reads the machine's HostState.
func Host() HostState {
	s := HostState{}
	for _, sc := range nodeSysctls {
		v, err := os.ReadFile(filepath.Join("/proc/sys", sc))
		s["sysctl "+sc] = strings.TrimSpace(string(v)) + errString(err)
	}
	for _, p := range hostPaths {
		_, err := os.Lstat(p)
		s["path "+p] = fmt.Sprint(err == nil)
	}
	cgroups, _ := filepath.Glob(fmt.Sprintf("/sys/fs/cgroup/*/nri-gpu-e2e-%d-*", os.Getpid()))
	v2, _ := filepath.Glob(fmt.Sprintf("/sys/fs/cgroup/nri-gpu-e2e-%d-*", os.Getpid()))
	s["cgroups"] = strings.Join(append(cgroups, v2...), " ")
	s["bridges"] = strings.Join(nodeBridges(), " ")
	return s
}

// bridgePrefix starts the name of each cluster node's pod bridge.
const bridgePrefix = "nrigpu"

// nodeBridges returns the names of the cluster nodes' bridges on the
// machine.
func nodeBridges() []string {
	var out []string
	ifaces, _ := net.Interfaces()
	for _, i := range ifaces {
		if strings.HasPrefix(i.Name, bridgePrefix) {
			out = append(out, i.Name)
		}
	}
	return out
}

func errString(err error) string {
	if err != nil {
		return " (" + err.Error() + ")"
	}
	return ""
}

// Changes says how s differs from before, one line per difference.
func (s HostState) Changes(before HostState) []string {
	var out []string
	for k, v := range s {
		if before[k] != v {
			out = append(out, fmt.Sprintf("%s: %q before, %q after", k, before[k], v))
		}
	}
	return out
}

// SweepKilledRun removes what a cluster run killed before its cleanup
// (SIGKILL, a machine that went away) leaves on the machine, so that the
// next run starts from it and its HostState compares with the machine's
// own: the nodes' bridges and an empty NodeDevDir. A NodeDevDir that is
// not an empty directory is left alone. It says what it removed.
func SweepKilledRun() []string {
	var removed []string
	for _, b := range nodeBridges() {
		if deleteBridge(b) == nil {
			removed = append(removed, "bridge "+b)
		}
	}
	if os.Remove(NodeDevDir) == nil {
		removed = append(removed, NodeDevDir)
	}
	return removed
}
