// Package testutil holds the checks nri-gpu's tests share.
package testutil

import (
	"strings"
	"testing"
	"time"
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
