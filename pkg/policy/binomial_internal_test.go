package policy

import "testing"

// TestBinomial: n choose k exactly up to maxSets, and maxSets+1 beyond,
// which decides between scoring every set and growing sets greedily.
func TestBinomial(t *testing.T) {
	for _, tc := range []struct{ n, k, want int }{
		{4, 0, 1},
		{4, 1, 4},
		{4, 2, 6},
		{8, 4, 70},
		{10, 3, 120},
		{20000, 1, 20000},
		{20001, 1, maxSets + 1},
		{32, 8, maxSets + 1},
	} {
		if got := binomial(tc.n, tc.k); got != tc.want {
			t.Errorf("binomial(%d, %d) = %d, want %d", tc.n, tc.k, got, tc.want)
		}
	}
}
