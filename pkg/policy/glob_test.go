package policy

import (
	"path"
	"testing"
)

// TestGlobMatchesLikePathMatch checks the compiled globs, fast path or
// not, against path.Match, which policy.devices and policy.namespaces are
// documented to follow.
func TestGlobMatchesLikePathMatch(t *testing.T) {
	patterns := []string{
		"nvidia.com/gpu=*", "nvidia.com/*", "*", "*/*", "nvidia.com/gpu=0", "nvidia.com/gpu=?",
		"nvidia.com/gpu=[0-3]", `nvidia.com/gpu=\*`, "tenant-*", "a*b*", "", "nvidia.com/gpu=*=x*",
	}
	names := []string{
		"nvidia.com/gpu=0", "nvidia.com/gpu=12", "nvidia.com/gpu=", "nvidia.com/gpu=a/b", "nvidia.com/gpux=0",
		"nvidia.com/gpu=*", "example.com/gpu=0", "tenant-a", "tenant-", "tenant-a/b", "default", "", "ab", "axxbyy",
		"nvidia.com/gpu=1=x", "nvidia.com/gpu=all",
	}
	for _, p := range patterns {
		g := compile([]string{p})[0]
		for _, n := range names {
			want, err := path.Match(p, n)
			if err != nil {
				t.Fatalf("bad test pattern %q: %v", p, err)
			}
			if got := g.match(n); got != want {
				t.Errorf("glob %q (fast path %v) on %q = %v, path.Match says %v", p, g.star, n, got, want)
			}
		}
	}
}
