package doctor_test

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
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
	dir := testutil.ShortDir(t)
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
	// An absent dir first: the dirs after it are checked too. A file is
	// no spec dir: it fails (nri-gpu does not start), it is not "absent".
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg.CDISpecDirs = []string{filepath.Join(dir, "absent"), specDir, file}

	fs := doctor.Run(doctor.Input{SocketPath: sock, ContainerdConfig: ctdConfig, Config: cfg})
	want := map[string]doctor.Status{"NRI socket": doctor.OK, "containerd NRI": doctor.Fail, "devices": doctor.Warn, "nri-gpu config": doctor.OK}
	for check, status := range want {
		got := find(fs, check)
		if len(got) != 1 || got[0].Status != status {
			t.Errorf("%s: %+v, want one %s", check, got, status)
		}
	}
	dirs := find(fs, "spec dir")
	if len(dirs) != 3 || dirs[1].Status != doctor.Fail || !strings.Contains(dirs[1].Detail, "writable by group or others") || dirs[0].Status != doctor.Warn ||
		dirs[2].Status != doctor.Fail || dirs[2].Detail != file+" is not a directory" {
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

// TestContainerdConfig reads containerd configurations of both versions
// (1.x: version 2, 2.x: version 3) with NRI and enable_cdi on, off and
// left to the default, and NRI's socket the one nri-gpu uses or another.
func TestContainerdConfig(t *testing.T) {
	sock := filepath.Join(testutil.ShortDir(t), "nri.sock") // answers, so only the config can fail
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	// What containerd does with each setting, by config version.
	nriOn := map[string]map[string]bool{
		"2": {"on": true, "off": false, "default": false}, // 1.7: off unless disable = false
		"3": {"on": true, "off": false, "default": true},  // 2.x: on unless disable = true
	}
	cdiOn := map[string]map[string]bool{
		"2": {"on": true, "off": false, "default": false},
		"3": {"on": true, "off": false, "default": true},
	}
	criPlugin := map[string]string{"2": "io.containerd.grpc.v1.cri", "3": "io.containerd.cri.v1.runtime"}
	setting := map[string]string{"on": "false", "off": "true"} // NRI's key is disable
	cdiSetting := map[string]string{"on": "true", "off": "false"}

	for _, version := range []string{"2", "3"} {
		for _, nri := range []string{"on", "off", "default"} {
			for _, cdi := range []string{"on", "off", "default"} {
				for _, socket := range []string{sock, "/run/other/nri.sock"} {
					name := fmt.Sprintf("version %s, NRI %s, enable_cdi %s, same socket %v", version, nri, cdi, socket == sock)
					t.Run(name, func(t *testing.T) {
						toml := fmt.Sprintf("version = %s\n[plugins.\"io.containerd.nri.v1.nri\"]\n  socket_path = %q\n", version, socket)
						if v, ok := setting[nri]; ok {
							toml += "  disable = " + v + "\n"
						}
						if v, ok := cdiSetting[cdi]; ok {
							toml += fmt.Sprintf("[plugins.%q]\n  enable_cdi = %s\n", criPlugin[version], v)
						}
						file := filepath.Join(testutil.ShortDir(t), "config.toml")
						if err := os.WriteFile(file, []byte(toml), 0o644); err != nil {
							t.Fatal(err)
						}
						cfg := config.Default()
						cfg.CDISpecDirs = []string{testutil.ShortDir(t)}
						fs := doctor.Run(doctor.Input{SocketPath: sock, ContainerdConfig: file, Config: cfg})

						wantNRI := doctor.Fail
						if nriOn[version][nri] {
							wantNRI = doctor.OK
						}
						if got := find(fs, "containerd NRI"); len(got) != 1 || got[0].Status != wantNRI {
							t.Errorf("containerd NRI: %+v, want one %s", got, wantNRI)
						}
						if got := find(fs, "containerd NRI socket"); (socket == sock) != (len(got) == 0) {
							t.Errorf("containerd NRI socket: %+v with containerd on %s and nri-gpu on %s", got, socket, sock)
						} else if len(got) == 1 && (got[0].Status != doctor.Warn || !strings.Contains(got[0].Fix, "--socket-path "+socket)) {
							t.Errorf("containerd NRI socket: %+v, want a WARN whose fix names %s", got[0], socket)
						}
						wantCDI := "enable_cdi is off"
						if cdiOn[version][cdi] {
							wantCDI = "enable_cdi is on"
						}
						if got := find(fs, "containerd CDI"); len(got) != 1 || !strings.HasPrefix(got[0].Detail, wantCDI) {
							t.Errorf("containerd CDI: %+v, want %q", got, wantCDI)
						}
						if doctor.Failed(fs) != !nriOn[version][nri] {
							t.Errorf("Failed() = %v with NRI %s on version %s", doctor.Failed(fs), nri, version)
						}
					})
				}
			}
		}
	}
}

// TestCRIOConfig reads CRI-O's configuration as CRI-O does, crio.conf
// then its crio.conf.d's drop-ins in lexical order (a later key wins):
// NRI on by default and off only where the last word says so, its socket
// CRI-O's default or the one set, and CRI-O's own CDI (it has no
// enable_cdi) with its spec directories. A containerd configuration that
// is not there is not a finding when CRI-O's is.
func TestCRIOConfig(t *testing.T) {
	sock := filepath.Join(testutil.ShortDir(t), "nri.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, tc := range []struct {
		name    string
		conf    string            // crio.conf ("" for none)
		dropIns map[string]string // crio.conf.d's files
		nri     doctor.Status
		socket  string // the socket CRI-O listens on, "" for nri-gpu's
		cdi     string // the CDI finding's start
	}{
		{name: "defaults", conf: "[crio]\n", nri: doctor.OK, socket: "/var/run/nri/nri.sock", cdi: "CRI-O injects cdi.k8s.io and CRI CDI devices itself, from /etc/cdi, /var/run/cdi"},
		{name: "NRI off", conf: "[crio.nri]\nenable_nri = false\nnri_listen = \"SOCK\"\n", nri: doctor.Fail, cdi: "CRI-O injects"},
		{name: "NRI off, turned on by a drop-in", conf: "[crio.nri]\nenable_nri = false\nnri_listen = \"SOCK\"\n",
			dropIns: map[string]string{"10-nri.conf": "[crio.nri]\nenable_nri = true\n"}, nri: doctor.OK, cdi: "CRI-O injects"},
		{name: "the later drop-in wins", dropIns: map[string]string{
			"20-off.conf": "[crio.nri]\nenable_nri = false\n", "10-on.conf": "[crio.nri]\nenable_nri = true\nnri_listen = \"/run/other.sock\"\n"},
			nri: doctor.Fail, socket: "/run/other.sock", cdi: "CRI-O injects"},
		{name: "no CDI spec directory", conf: "[crio.nri]\nnri_listen = \"SOCK\"\n[crio.runtime]\ncdi_spec_dirs = []\n", nri: doctor.OK,
			cdi: "cdi_spec_dirs is empty: CRI-O's own CDI resolves no device"},
		{name: "CDI spec directories of its own", dropIns: map[string]string{"99-cdi.conf": "[crio.nri]\nnri_listen = \"SOCK\"\n[crio.runtime]\ncdi_spec_dirs = [\"/opt/cdi\"]\n"},
			nri: doctor.OK, cdi: "CRI-O injects cdi.k8s.io and CRI CDI devices itself, from /opt/cdi ("},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			write := func(name, content string) {
				t.Helper()
				if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(name, []byte(strings.ReplaceAll(content, "SOCK", sock)), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if tc.conf != "" {
				write(filepath.Join(dir, "crio.conf"), tc.conf)
			}
			for name, content := range tc.dropIns {
				write(filepath.Join(dir, "crio.conf.d", name), content)
			}
			cfg := config.Default()
			cfg.CDISpecDirs = []string{testutil.ShortDir(t)}
			fs := doctor.Run(doctor.Input{SocketPath: sock, ContainerdConfig: filepath.Join(dir, "absent.toml"), CRIOConfig: filepath.Join(dir, "crio.conf"), Config: cfg})
			if got := find(fs, "CRI-O NRI"); len(got) != 1 || got[0].Status != tc.nri {
				t.Errorf("CRI-O NRI: %+v, want one %s", got, tc.nri)
			}
			got := find(fs, "CRI-O NRI socket")
			if tc.socket == "" && len(got) != 0 {
				t.Errorf("CRI-O NRI socket: %+v, want none (CRI-O listens where nri-gpu connects)", got)
			} else if tc.socket != "" && (len(got) != 1 || got[0].Status != doctor.Warn || !strings.HasSuffix(got[0].Fix, "--socket-path "+tc.socket)) {
				t.Errorf("CRI-O NRI socket: %+v, want a WARN whose fix names %s", got, tc.socket)
			}
			if got := find(fs, "CRI-O CDI"); len(got) != 1 || !strings.HasPrefix(got[0].Detail, tc.cdi) {
				t.Errorf("CRI-O CDI: %+v, want %q", got, tc.cdi)
			}
			if got := append(find(fs, "runtime config"), find(fs, "containerd config")...); len(got) != 0 {
				t.Errorf("containerd's configuration absent beside CRI-O's: %+v, want no finding", got)
			}
		})
	}
}
