package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/dra/link"
)

// TestPodEvents: the events nri-gpu tells reach nri-gpu-dra's event
// command (here a stand-in on the PATH that keeps what it is given),
// with the node and the kubeconfig configured; a command that fails is
// said in the log, and the next events are still posted.
func TestPodEvents(t *testing.T) {
	dir := t.TempDir()
	got := filepath.Join(dir, "got")
	stub := "#!/bin/sh\necho \"$@\" >> " + got + "\ncat >> " + got + "\ncase \"$*\" in *fail*) exit 1;; esac\n"
	if err := os.WriteFile(filepath.Join(dir, driverProgram), []byte(stub), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+":"+os.Getenv("PATH"))
	t.Setenv(nodeNameEnv, "node-a")
	for _, tc := range []struct {
		name, kubeconfig, want string
		fails                  bool
	}{
		{name: "posted", kubeconfig: "/etc/nri-gpu/kubeconfig", want: "event --node node-a --kubeconfig /etc/nri-gpu/kubeconfig"},
		{name: "refused", kubeconfig: "/fail", want: "event --node node-a --kubeconfig /fail", fails: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			os.Remove(got)
			log, hook := logtest.NewNullLogger()
			sink, run, err := podEvents(config.Events{Enabled: true, Kubeconfig: tc.kubeconfig}, "", os.Stderr, log)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go run(ctx)
			sink.Post(link.Event{Namespace: "tenant", Pod: "a", Reason: "StoppedByNRIGPU", Note: "first"})
			sink.Post(link.Event{Namespace: "tenant", Pod: "b", Reason: "StoppedByNRIGPU", Note: "second"})
			testutil.Within(t, 10*time.Second, "both events posted", func() bool {
				data, _ := os.ReadFile(got)
				return strings.Contains(string(data), `"note":"first"`) && strings.Contains(string(data), `"note":"second"`)
			})
			data, _ := os.ReadFile(got)
			if !strings.Contains(string(data), tc.want) {
				t.Errorf("the command was run as %q, want %q", data, tc.want)
			}
			if tc.fails {
				testutil.Within(t, 10*time.Second, "the failure logged", func() bool {
					for _, e := range hook.AllEntries() {
						if e.Level == logrus.WarnLevel && strings.Contains(e.Message, "events of pods") && strings.Contains(e.Message, "exit status 1") {
							return true
						}
					}
					return false
				})
			}
		})
	}
}
