package plugin

import "github.com/nri-gpu/nri-gpu/pkg/specs"

// names returns the names of devices.
func names(devices []specs.Device) []string {
	out := make([]string, len(devices))
	for i, d := range devices {
		out[i] = d.Name
	}
	return out
}
