// Package testutil holds the checks nri-gpu's tests share.
package testutil

import (
	"strings"
	"testing"
	"time"

	oci "github.com/opencontainers/runtime-spec/specs-go"
)

// ErrorSays fails the test at once when err is nil, and otherwise reports
// each wanted string its message lacks.
func ErrorSays(t testing.TB, err error, want ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want one saying %q", want)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not say %q", err, w)
		}
	}
}

// Within fails the test unless cond becomes true within d, polling.
func Within(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// DeviceAccess evaluates a container spec's device cgroup rules for one of
// its devices, as the kernel does (later rules win, letter by letter), and
// returns the access it has, such as "rw".
func DeviceAccess(s *oci.Spec, d oci.LinuxDevice) string {
	allowed := map[rune]bool{}
	for _, r := range s.Linux.Resources.Devices {
		if (r.Type != "" && r.Type != "a" && r.Type != d.Type) ||
			(r.Major != nil && *r.Major != d.Major) || (r.Minor != nil && *r.Minor != d.Minor) {
			continue
		}
		for _, c := range r.Access {
			allowed[c] = r.Allow
		}
	}
	var out string
	for _, c := range "rwm" {
		if allowed[c] {
			out += string(c)
		}
	}
	return out
}
