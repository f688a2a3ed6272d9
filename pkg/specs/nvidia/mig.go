package nvidia

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// migMinorsPath lists, per GPU instance and compute instance, the minor
// of its capability node in /dev/nvidia-caps.
const migMinorsPath = "/proc/driver/nvidia-caps/mig-minors"

// readMIGMinors reads the mig-minors file under the driver root: lines
// such as "gpu0/gi1/access 12" and "gpu0/gi1/ci0/access 13". A missing
// file (no MIG support) gives an empty map.
func readMIGMinors(r root) (map[string]int, error) {
	f, err := os.Open(r.host(migMinorsPath))
	if errors.Is(err, os.ErrNotExist) {
		return map[string]int{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading MIG capability minors: %w", err)
	}
	defer f.Close()
	minors := map[string]int{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) != 2 {
			continue
		}
		n, err := strconv.Atoi(fields[1])
		if err != nil {
			return nil, fmt.Errorf("%s: line %q: %w", r.host(migMinorsPath), sc.Text(), err)
		}
		minors[fields[0]] = n
	}
	return minors, sc.Err()
}

// capsMajor reads the dynamic major of nvidia-caps from /proc/devices
// under the driver root; 0 when it is not there.
func capsMajor(r root) int64 {
	data, err := os.ReadFile(r.host("/proc/devices"))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 2 && fields[1] == "nvidia-caps" {
			if n, err := strconv.ParseInt(fields[0], 10, 64); err == nil {
				return n
			}
		}
	}
	return 0
}

// migDevices returns a MIG device's devices, one per name strategy, each
// with its parent GPU's node and the capability nodes of its GPU and
// compute instance.
func migDevices(r root, g GPU, m MIG, minors map[string]int, strategies []string) ([]cdispec.Device, error) {
	gpuPath := fmt.Sprintf("/dev/nvidia%d", g.Minor)
	nodes := []*cdispec.DeviceNode{{Path: gpuPath, HostPath: r.host(gpuPath), Type: "c", Major: nvidiaMajor, Minor: int64(g.Minor)}}
	major := capsMajor(r)
	for _, key := range []string{
		fmt.Sprintf("gpu%d/gi%d/access", g.Minor, m.GI),
		fmt.Sprintf("gpu%d/gi%d/ci%d/access", g.Minor, m.GI, m.CI),
	} {
		minor, ok := minors[key]
		if !ok {
			return nil, fmt.Errorf("MIG device %d:%d (%s): no capability minor for %q in %s",
				g.Index, m.Index, m.UUID, key, r.host(migMinorsPath))
		}
		path := fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", minor)
		node := &cdispec.DeviceNode{Path: path, HostPath: r.host(path)}
		if major != 0 {
			node.Type, node.Major, node.Minor = "c", major, int64(minor)
		}
		nodes = append(nodes, node)
	}
	var devs []cdispec.Device
	for _, s := range strategies {
		name := fmt.Sprintf("%d:%d", g.Index, m.Index)
		if s == NameUUID {
			name = m.UUID
		}
		devs = append(devs, cdispec.Device{Name: name, ContainerEdits: cdispec.ContainerEdits{DeviceNodes: nodes}})
	}
	return devs, nil
}
