package plugin

import (
	"slices"
	"testing"
)

func TestCompactNames(t *testing.T) {
	tests := []struct {
		names []string
		want  string
	}{
		{nil, ""},
		{[]string{"nvidia.com/gpu=0"}, "nvidia.com/gpu=0"},
		{[]string{"nvidia.com/gpu=0", "nvidia.com/gpu=1", "nvidia.com/gpu=GPU-a"}, "nvidia.com/gpu=0,1,GPU-a"},
		{[]string{"nvidia.com/gpu=0", "example.com/nic=a", "example.com/nic=b", "nvidia.com/gpu=1:0"},
			"nvidia.com/gpu=0,example.com/nic=a,b,nvidia.com/gpu=1:0"},
	}
	for _, tt := range tests {
		got := compactNames(tt.names, identity)
		if got != tt.want {
			t.Errorf("compactNames(%q) = %q, want %q", tt.names, got, tt.want)
		}
		if back := expandNames(got); !slices.Equal(back, tt.names) {
			t.Errorf("expandNames(%q) = %q, want %q back", got, back, tt.names)
		}
	}
}

// TestExpandNamesReadsFullNames reads annotations written with every name
// in full, as nri-gpu wrote them before it wrote a kind once.
func TestExpandNamesReadsFullNames(t *testing.T) {
	want := []string{"nvidia.com/gpu=0", "nvidia.com/gpu=1", "example.com/nic=a"}
	if got := expandNames("nvidia.com/gpu=0,nvidia.com/gpu=1,example.com/nic=a"); !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}
