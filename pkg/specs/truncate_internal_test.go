package specs

import (
	"strings"
	"testing"
)

// TestTruncate: a spec problem is quoted whole up to 256 bytes, and cut
// after that.
func TestTruncate(t *testing.T) {
	for _, tc := range []struct {
		in, want string
	}{
		{strings.Repeat("x", 256), strings.Repeat("x", 256)},
		{strings.Repeat("x", 257), strings.Repeat("x", 256) + "..."},
	} {
		if got := truncate(tc.in); got != tc.want {
			t.Errorf("truncate(%d bytes) = %d bytes", len(tc.in), len(got))
		}
	}
}

// TestNaturalCompare: names order by their embedded numbers' values, and
// otherwise by their bytes, a name before the longer names it starts.
func TestNaturalCompare(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"gpu=2", "gpu=10", -1},
		{"gpu=10", "gpu=2", 1},
		{"gpu=1", "gpu=01", 0},
		{"gpu=1a", "gpu=1b", -1},
		{"gpu=1b", "gpu=01a", 1},
		{"gpu=-", "gpu=1", -1},
		{"gpu=1", "gpu=-", 1},
		{"gpu=a", "gpu=ab", -1},
		{"gpu=ab", "gpu=a", 1},
		{"", "a", -1},
		{"a", "", 1},
		{"", "", 0},
	} {
		got := naturalCompare(tc.a, tc.b)
		if (got < 0) != (tc.want < 0) || (got > 0) != (tc.want > 0) {
			t.Errorf("naturalCompare(%q, %q) = %d, want the sign of %d", tc.a, tc.b, got, tc.want)
		}
	}
}
