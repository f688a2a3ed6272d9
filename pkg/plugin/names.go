package plugin

import (
	"fmt"
	"strings"

	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// readNames reads a DevicesAnnotation or CountedAnnotation: qualified CDI
// names separated by commas. Earlier releases wrote a kind once for a run
// of names of that kind ("nvidia.com/gpu=0,1"): an item without a kind
// takes the kind of the item before it. A list of more than maxRecorded
// names is an error: no container holds that many devices.
func readNames(s string) ([]string, error) {
	if s == "" {
		return nil, nil
	}
	if n := strings.Count(s, ",") + 1; n > maxRecorded {
		return nil, fmt.Errorf("%d names, more than %d", n, maxRecorded)
	}
	var (
		out  []string
		kind string
	)
	for _, item := range strings.Split(s, ",") {
		if k, _, ok := strings.Cut(item, "="); ok || kind == "" {
			out = append(out, item)
			kind = ""
			if ok {
				kind = k
			}
			continue
		}
		out = append(out, kind+"="+item)
	}
	return out, nil
}

// maxRecorded bounds the names read from one annotation.
const maxRecorded = 1024

// names returns the names of devices.
func names(devices []specs.Device) []string {
	out := make([]string, len(devices))
	for i, d := range devices {
		out[i] = d.Name
	}
	return out
}
