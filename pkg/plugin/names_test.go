package plugin

import (
	"slices"
	"testing"
)

func TestReadNames(t *testing.T) {
	tests := []struct {
		name  string
		value string
		want  []string
	}{
		{name: "empty", value: "", want: nil},
		{name: "one", value: "nvidia.com/gpu=0", want: []string{"nvidia.com/gpu=0"}},
		{
			name:  "qualified names, as nri-gpu writes them",
			value: "nvidia.com/gpu=0,nvidia.com/gpu=1,example.com/nic=a",
			want:  []string{"nvidia.com/gpu=0", "nvidia.com/gpu=1", "example.com/nic=a"},
		},
		{
			name:  "a kind once for a run of names, as earlier releases wrote them",
			value: "nvidia.com/gpu=0,1,GPU-a,example.com/nic=a,b,nvidia.com/gpu=1:0",
			want:  []string{"nvidia.com/gpu=0", "nvidia.com/gpu=1", "nvidia.com/gpu=GPU-a", "example.com/nic=a", "example.com/nic=b", "nvidia.com/gpu=1:0"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got, err := readNames(tc.value); err != nil || !slices.Equal(got, tc.want) {
				t.Errorf("readNames(%q) = %q, want %q", tc.value, got, tc.want)
			}
		})
	}
}
