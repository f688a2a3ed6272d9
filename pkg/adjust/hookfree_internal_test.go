package adjust

import (
	"runtime"
	"slices"
	"testing"
)

// TestLoaderDirs: a folder of the machine's 64-bit libraries, in either
// family's layout, is completed by the other families' directories; any
// other folder by none.
func TestLoaderDirs(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("the table is x86_64's")
	}
	for _, tc := range []struct {
		dir  string
		want []string
	}{
		{"/usr/lib/x86_64-linux-gnu", []string{"/usr/lib64", "/usr/lib"}},
		{"/lib/x86_64-linux-gnu", []string{"/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib"}},
		{"/usr/lib64", []string{"/usr/lib/x86_64-linux-gnu", "/usr/lib"}},
		{"/lib64", []string{"/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib"}},
		{"/usr/lib/i386-linux-gnu", nil},
		{"/usr/lib/x86_64-linux-gnu/vdpau", nil},
		{"/usr/lib", nil},
		{"/opt/driver/lib", nil},
	} {
		if got := loaderDirs(tc.dir); !slices.Equal(got, tc.want) {
			t.Errorf("loaderDirs(%s) = %v, want %v", tc.dir, got, tc.want)
		}
	}
}
