package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
	"github.com/nri-gpu/nri-gpu/pkg/policy"
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
	if _, err := kubeClient("", nil); err == nil || !strings.Contains(err.Error(), "set dra.kubeconfig") {
		t.Errorf("outside a pod, without a kubeconfig: %v", err)
	}
	if _, err := kubeClient(filepath.Join(t.TempDir(), "none"), nil); err == nil {
		t.Error("a kubeconfig that is not there was taken")
	}
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kc, []byte("apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: \"https://127.0.0.1:6443\"}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {token: t}}]\ncurrent-context: c\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := kubeClient(kc, nil); err != nil {
		t.Errorf("a kubeconfig: %v", err)
	}
}

// TestAPIErrorsCounted: the driver's client counts the requests the API
// server fails (a 5xx, or no answer), by verb, in the metrics it serves
// on start.dra.metricsAddress; an answer of 404 is no failure.
func TestAPIErrorsCounted(t *testing.T) {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "/resourceclaims/") {
			http.Error(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`, http.StatusNotFound)
			return
		}
		http.Error(w, "etcd is away", http.StatusInternalServerError)
	}))
	defer api.Close()
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kc, []byte("apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: \""+api.URL+"\"}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {}}]\ncurrent-context: c\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	log := logrus.New()
	log.SetOutput(io.Discard)
	prepared := func(context.Context) ([]policy.Claim, error) { return make([]policy.Claim, 2), nil }
	m, err := serveMetrics("127.0.0.1:0", prepared, log)
	if err != nil {
		t.Fatal(err)
	}
	client, err := kubeClient(kc, m.CountAPIErrors)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Pods("").List(context.Background(), metav1.ListOptions{}); err == nil {
		t.Fatal("the API server's 500 was no error")
	}
	if _, err := client.ResourceV1().ResourceClaims("tenant").Get(context.Background(), "gone", metav1.GetOptions{}); err == nil {
		t.Fatal("the API server's 404 was no error")
	}
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if !strings.Contains(rec.Body.String(), `nri_gpu_dra_api_errors_total{verb="GET"} 1`) {
		t.Errorf("want one GET counted failed (the 500, not the 404):\n%s", rec.Body.String())
	}
	if !strings.Contains(rec.Body.String(), "nri_gpu_dra_claims_prepared 2") {
		t.Errorf("want the 2 claims the pool holds prepared:\n%s", rec.Body.String())
	}
	if off, err := serveMetrics("", prepared, log); off != nil || err != nil {
		t.Errorf("metrics without an address: %v, %v; want off", off, err)
	}
}
