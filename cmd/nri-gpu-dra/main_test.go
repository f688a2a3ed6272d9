package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
)

// TestRun: the driver refuses to start, as one whose configuration
// cannot work (nri-gpu then stops rather than start it again), on flags
// it does not know, and without its link to nri-gpu.
func TestRun(t *testing.T) {
	args := link.Options{DRA: config.Default().Start.DRA, Node: "node-1", LogLevel: "info", LogFormat: "text"}
	args.DRA.PluginDir, args.DRA.RegistryDir = t.TempDir(), t.TempDir()
	loud := args
	loud.LogLevel = "loud"
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"an unknown flag", []string{"--no-such-flag"}, "flag provided but not defined"},
		{"no node name", []string{`--options={"DRA":{}}`}, "the node's name is needed"},
		{"a log level that is none", loud.Args(), "loud"},
		{"not started by nri-gpu", args.Args(), "nri-gpu-dra is started by nri-gpu"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stderr strings.Builder
			if code := run(tc.args, &stderr); code != link.ExitConfig {
				t.Errorf("exit %d, want %d", code, link.ExitConfig)
			}
			if !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("stderr %q does not say %q", stderr.String(), tc.want)
			}
		})
	}
}

// TestKubeClient: credentials come from the kubeconfig file, or else the
// pod's service account; without either the error says what to set.
func TestKubeClient(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	if _, err := kubeClient(""); err == nil || !strings.Contains(err.Error(), "set dra.kubeconfig") {
		t.Errorf("outside a pod, without a kubeconfig: %v", err)
	}
	if _, err := kubeClient(filepath.Join(t.TempDir(), "none")); err == nil {
		t.Error("a kubeconfig that is not there was taken")
	}
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kc, []byte("apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: \"https://127.0.0.1:6443\"}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {token: t}}]\ncurrent-context: c\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := kubeClient(kc); err != nil {
		t.Errorf("a kubeconfig: %v", err)
	}
}
