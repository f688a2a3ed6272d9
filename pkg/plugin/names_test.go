package plugin

import "testing"

func TestLogNames(t *testing.T) {
	tests := []struct {
		names []string
		want  string
	}{
		{nil, ""},
		{[]string{"nvidia.com/gpu=0"}, "nvidia.com/gpu=0"},
		{[]string{"nvidia.com/gpu=0", "nvidia.com/gpu=1", "nvidia.com/gpu=GPU-a"}, "nvidia.com/gpu=0,1,GPU-a"},
		{[]string{"nvidia.com/gpu=0", "example.com/nic=a", "example.com/nic=b", "nvidia.com/gpu=1"},
			"nvidia.com/gpu=0;example.com/nic=a,b;nvidia.com/gpu=1"},
		{[]string{"odd", "odd", "nvidia.com/gpu=0"}, "odd;odd;nvidia.com/gpu=0"},
	}
	for _, tt := range tests {
		if got := logNames(tt.names, identity); got != tt.want {
			t.Errorf("logNames(%q) = %q, want %q", tt.names, got, tt.want)
		}
	}
}
