package nvidia

import (
	"testing"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
)

// TestBusID: a PCI address as NVML writes it (upper-case hex, then NULs),
// lower-cased and cut at the first NUL.
func TestBusID(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"00000000:1A:00.0", "00000000:1a:00.0"},
		{"0000:AZ:@[.0", "0000:az:@[.0"},
		{"0000:1B:00.0\x00zz", "0000:1b:00.0"},
		{"", ""},
	} {
		if got := busID(testutil.PCI(tc.in)); got != tc.want {
			t.Errorf("busID(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
