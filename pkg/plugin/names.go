package plugin

import (
	"strings"

	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// compactNames writes device names comma-separated, a kind once for a run
// of names of that kind: "nvidia.com/gpu=0,1,example.com/nic=a". No part
// of a device name can be taken for a kind: names have no "=" or "/".
func compactNames[T any](items []T, name func(T) string) string {
	var buf [512]byte // most lists fit: the string is the one allocation
	out, kind := buf[:0], ""
	for i, it := range items {
		n := name(it)
		if i > 0 {
			out = append(out, ',')
		}
		k, dev, ok := strings.Cut(n, "=")
		if ok && k == kind {
			out = append(out, dev...)
			continue
		}
		out = append(out, n...)
		kind = ""
		if ok {
			kind = k
		}
	}
	return string(out)
}

// expandNames reads what compactNames wrote, or a plain comma-separated
// list of qualified names.
func expandNames(s string) []string {
	if s == "" {
		return nil
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
	return out
}

func identity(s string) string { return s }

func deviceName(d specs.Device) string { return d.Name }
