package lasting_test

import (
	"slices"
	"testing"

	"github.com/nri-gpu/nri-gpu/internal/lasting"
)

// TestUpdate: a problem is told once when it appears, again when its
// message changes, and once when it is gone; each list sorted.
func TestUpdate(t *testing.T) {
	var l lasting.Problems
	for _, step := range []struct {
		name           string
		current        map[string]string
		appeared, gone []string
	}{
		{name: "two appear", current: map[string]string{"b": "1", "a": "1"}, appeared: []string{"a", "b"}},
		{name: "the same again", current: map[string]string{"a": "1", "b": "1"}},
		{name: "one changes its message", current: map[string]string{"a": "2", "b": "1"}, appeared: []string{"a"}},
		{name: "both gone, one new", current: map[string]string{"c": "1"}, appeared: []string{"c"}, gone: []string{"a", "b"}},
		{name: "none", current: nil, gone: []string{"c"}},
	} {
		appeared, gone := l.Update(step.current)
		if !slices.Equal(appeared, step.appeared) || !slices.Equal(gone, step.gone) {
			t.Errorf("%s: appeared %v, gone %v; want %v, %v", step.name, appeared, gone, step.appeared, step.gone)
		}
	}
}
