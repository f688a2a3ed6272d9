package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRunRejectsBadInput(t *testing.T) {
	dir := t.TempDir()
	badConfig := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(badConfig, []byte("policy:\n  alowAll: true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		want []string
	}{
		{name: "unknown flag", args: []string{"--gpus", "1"}, want: []string{"flag provided but not defined: -gpus"}},
		{name: "unknown command", args: []string{"serve"}, want: []string{`unknown command "serve"`}},
		{name: "bad log level", args: []string{"--log-level", "loud"}, want: []string{"--log-level", "loud"}},
		{name: "config key misspelt", args: []string{"--config", badConfig}, want: []string{badConfig, "line 2", "alowAll"}},
		{name: "config file missing", args: []string{"--config", filepath.Join(dir, "none.yaml")}, want: []string{"none.yaml", "no such file"}},
		{name: "relative spec dir", args: []string{"--cdi-spec-dirs", "cdi"}, want: []string{`"cdi" is not an absolute path`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			// Never the host's NRI socket, should a case get that far.
			args := append([]string{"--socket-path", filepath.Join(dir, "nri.sock")}, tc.args...)
			if code := run(args, &stderr); code != exitUsage {
				t.Errorf("exit code %d, want %d; stderr:\n%s", code, exitUsage, stderr.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("stderr does not say %q:\n%s", w, stderr.String())
				}
			}
		})
	}
}
