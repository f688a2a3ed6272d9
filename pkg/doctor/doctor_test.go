package doctor_test

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/doctor"
)

// find returns the findings of a check.
func find(fs []doctor.Finding, check string) []doctor.Finding {
	var out []doctor.Finding
	for _, f := range fs {
		if f.Check == check {
			out = append(out, f)
		}
	}
	return out
}

func TestRun(t *testing.T) {
	dir := t.TempDir()
	specDir := filepath.Join(dir, "cdi")
	if err := os.Mkdir(specDir, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(specDir, 0o777); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "nri.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctdConfig := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(ctdConfig, []byte("version = 2\n[plugins.\"io.containerd.nri.v1.nri\"]\n  disable = true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.CDISpecDirs = []string{specDir, filepath.Join(dir, "absent")}

	fs := doctor.Run(doctor.Input{SocketPath: sock, ContainerdConfig: ctdConfig, Config: cfg})
	want := map[string]doctor.Status{"NRI socket": doctor.OK, "containerd NRI": doctor.Fail, "devices": doctor.Warn, "nri-gpu config": doctor.OK}
	for check, status := range want {
		got := find(fs, check)
		if len(got) != 1 || got[0].Status != status {
			t.Errorf("%s: %+v, want one %s", check, got, status)
		}
	}
	dirs := find(fs, "spec dir")
	if len(dirs) != 2 || dirs[0].Status != doctor.Fail || !strings.Contains(dirs[0].Detail, "writable by group or others") || dirs[1].Status != doctor.Warn {
		t.Errorf("spec dirs: %+v", dirs)
	}
	if !doctor.Failed(fs) {
		t.Error("Failed() is false with FAIL findings")
	}
	for _, f := range fs {
		if f.Status != doctor.OK && f.Fix == "" {
			t.Errorf("%s %s has no fix", f.Status, f.Check)
		}
	}
}
