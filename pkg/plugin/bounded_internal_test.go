package plugin

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// TestBounded: an error for the runtime is kept whole up to 4096 bytes;
// a longer one is cut to that, saying how many bytes the log has beyond,
// and still wraps its cause.
func TestBounded(t *testing.T) {
	cause := errors.New("cause")
	whole := fmt.Errorf("%s: %w", strings.Repeat("x", maxErrorLen-len(": cause")), cause)
	if got := bounded(whole); got.Error() != whole.Error() {
		t.Errorf("a %d-byte error was cut to %d bytes", len(whole.Error()), len(got.Error()))
	}
	long := fmt.Errorf("%s: %w", strings.Repeat("y", 5000), cause)
	got := bounded(long)
	want := strings.Repeat("y", maxErrorLen-64) + fmt.Sprintf(" ... (%d more bytes; the plugin's log has all of it)", len(long.Error())-(maxErrorLen-64))
	if got.Error() != want {
		t.Errorf("cut to %q...%q, want %q", got.Error()[:16], got.Error()[len(got.Error())-64:], want[len(want)-64:])
	}
	if !errors.Is(got, cause) {
		t.Error("the cut error does not wrap its cause")
	}
}
