package specs_test

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/specs"
)

// helperEnv, when set, makes TestOwnedByPluginUser the helper it starts:
// it loads the spec dir named and says whether the GPU resolves.
const helperEnv = "NRI_GPU_SPECS_HELPER_DIR"

// TestOwnedByPluginUser: a plugin running as a user other than root
// trusts specs that user owns (and root's), not another user's. The test
// runs itself again as uid 4242 (root is needed to do so).
func TestOwnedByPluginUser(t *testing.T) {
	if dir := os.Getenv(helperEnv); dir != "" {
		snap, err := specs.Load([]string{dir})
		if err == nil {
			_, err = snap.Lookup("nvidia.com/gpu=0")
		}
		if err != nil {
			os.Stdout.WriteString("HELPER: " + err.Error() + "\n")
			return
		}
		os.Stdout.WriteString("HELPER: trusted\n")
		return
	}
	if os.Geteuid() != 0 {
		t.Skip("running as another user needs root")
	}
	base := testutil.ShortDir(t)
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	helper := filepath.Join(base, "specs.test")
	copyExecutable(t, os.Args[0], helper)
	for _, tc := range []struct {
		owner int
		want  string
	}{
		{4242, "HELPER: trusted"},
		{0, "HELPER: trusted"},
		{4243, "is owned by uid 4243, neither root nor this plugin's user"},
	} {
		dir := filepath.Join(base, fmt.Sprint("cdi-", tc.owner))
		write(t, dir, "gpu.yaml", gpuSpec("A=1"))
		for _, p := range []string{dir, filepath.Join(dir, "gpu.yaml")} {
			if err := os.Chown(p, tc.owner, tc.owner); err != nil {
				t.Fatal(err)
			}
		}
		cmd := exec.Command(helper, "-test.run=^TestOwnedByPluginUser$")
		cmd.Env = append(os.Environ(), helperEnv+"="+dir)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 4242, Gid: 4242}}
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), tc.want) {
			t.Errorf("specs owned by uid %d, read as uid 4242: %v\n%s", tc.owner, err, out)
		}
	}
}

func copyExecutable(t *testing.T, src, dst string) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
