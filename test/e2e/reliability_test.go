package e2e

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/test/harness"
)

// churnKind is the kind of the specs TestSpecChurn writes.
const churnKind = "example.com/churn"

func churnSpec(env string) string {
	return fmt.Sprintf("cdiVersion: \"0.6.0\"\nkind: %s\ndevices:\n  - name: \"0\"\n    containerEdits:\n      env: [%s]\n", churnKind, env)
}

// createWithin retries creating a container until ok accepts the result,
// and fails the test unless an attempt begun within 2s of since (the
// pick-up time nri-gpu promises) succeeded.
func createWithin(t *testing.T, since time.Time, what string, ok func(id string, err error) bool) {
	t.Helper()
	pod := harness.Pod{Name: fmt.Sprintf("churn-%d", podSeq.Add(1)), Namespace: "e2e",
		Annotations: map[string]string{"gpus.nri-gpu.io": churnKind + "=0"}}
	podID, err := env.ctd.RunPod(pod)
	if err != nil {
		t.Fatal(err)
	}
	defer removePod(t, podID)
	for i := 0; ; i++ {
		begun := time.Now()
		id, err := env.ctd.CreateContainer(podID, pod, harness.Container{Name: fmt.Sprintf("c%d", i)})
		if ok(id, err) {
			return
		}
		if begun.Sub(since) > 2*time.Second {
			t.Fatalf("%s: not picked up within 2s; last result: %v", what, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// envIs returns an acceptor for a created container whose spec has kv.
func envIs(t *testing.T, kv string) func(string, error) bool {
	return func(id string, err error) bool {
		if err != nil {
			return false
		}
		spec, err := env.ctd.ContainerSpec(id)
		if err != nil {
			t.Fatal(err)
		}
		return hasEnv(spec, kv)
	}
}

func unresolvable(_ string, err error) bool {
	return err != nil && strings.Contains(err.Error(), "unresolvable CDI device")
}

func TestSpecChurn(t *testing.T) {
	needEnv(t)
	dir := env.churnDir
	write := func(name, content string) time.Time {
		t.Helper()
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return time.Now()
	}

	since := write("churn.yaml", churnSpec("CHURN=added"))
	createWithin(t, since, "a spec added", envIs(t, "CHURN=added"))

	tmp := filepath.Join(env.dir, "churn.yaml.new")
	if err := os.WriteFile(tmp, []byte(churnSpec("CHURN=renamed")), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "churn.yaml")); err != nil {
		t.Fatal(err)
	}
	createWithin(t, time.Now(), "a spec replaced by an atomic rename", envIs(t, "CHURN=renamed"))

	since = write("churn.yaml", churnSpec("CHURN=edited"))
	createWithin(t, since, "a spec edited in place", envIs(t, "CHURN=edited"))

	// A broken spec beside the good ones: logged once by file name with the
	// parse error, and nothing else is affected.
	since = write("broken.yaml", "cdiVersion: \"0.6.0\"\nkind: [\n")
	deadline := since.Add(2 * time.Second)
	for !strings.Contains(env.nri.Log(), "broken.yaml") && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	createWithin(t, since, "a good spec beside a broken one", envIs(t, "CHURN=edited"))
	podID, pod := newPod(t, env.ctd, map[string]string{"gpus.nri-gpu.io": "0"})
	runContainer(t, env.ctd, podID, pod, harness.Container{Name: "gpu"})
	if n := len(slices.DeleteFunc(strings.Split(env.nri.Log(), "\n"), func(l string) bool { return !strings.Contains(l, "broken.yaml") })); n != 1 {
		t.Errorf("the broken spec was logged %d times, want once:\n%s", n, env.nri.Log())
	}
	if !strings.Contains(env.nri.Log(), "failed to load CDI Spec") {
		t.Error("the log does not give the parse error")
	}
	if err := os.Remove(filepath.Join(dir, "broken.yaml")); err != nil {
		t.Fatal(err)
	}

	if err := os.Remove(filepath.Join(dir, "churn.yaml")); err != nil {
		t.Fatal(err)
	}
	createWithin(t, time.Now(), "a spec removed", unresolvable)

	write("churn.yaml", churnSpec("CHURN=before-rmdir"))
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	createWithin(t, time.Now(), "a spec dir deleted", unresolvable)
	since = write("churn.yaml", churnSpec("CHURN=recreated"))
	createWithin(t, since, "a spec dir deleted and created again", envIs(t, "CHURN=recreated"))
}

func TestHostileAnnotations(t *testing.T) {
	needEnv(t)
	tests := []struct {
		name  string
		value string
		want  string
	}{
		{"empty items", "0,,1", `item 2 ""`},
		{"20,000 characters", strings.Repeat("a", 20000), "20000 bytes long, more than 256"},
		{"shell metacharacters", "0;$(reboot)`id`|&", "invalid character"},
		{"path traversal", "../../../dev/sda", `"../../../dev/sda"`},
		{"repeated names", strings.Repeat("0,", 999) + "0", "1000 items, more than 256"},
		{"not UTF-8 (as CRI passes it)", "0,\ufffd\ufffd", "invalid"},
		{"only commas", ",,,,", "empty device name"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			podID, pod := newPod(t, env.ctd, map[string]string{"gpus.nri-gpu.io": tc.value})
			createFails(t, podID, pod, `pod annotation "gpus.nri-gpu.io"`, "invalid device request", tc.want)
		})
	}
	podID, pod := newPod(t, env.ctd, map[string]string{"gpus.nri-gpu.io": "1"})
	if _, spec := runContainer(t, env.ctd, podID, pod, harness.Container{Name: "after"}); !slices.Equal(gpuNodes(spec), []string{"/dev/nvidia1"}) {
		t.Errorf("after hostile requests, a good one got %v", gpuNodes(spec))
	}
}

func TestContainerdRestart(t *testing.T) {
	needEnv(t)
	podID, pod := newPod(t, env.ctd, map[string]string{"gpus.nri-gpu.io": "3"})
	runContainer(t, env.ctd, podID, pod, harness.Container{Name: "before"})

	// Ready while registered; not ready while containerd is away and the
	// plugin reconnects; ready again once it has registered anew.
	base := served(t, env.nri)
	if code := readiness(t, base, "/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz %d before the restart, want 200", code)
	}
	notReady := make(chan bool, 1)
	stop := make(chan struct{})
	go func() {
		seen := false
		for {
			select {
			case <-stop:
				notReady <- seen
				return
			case <-time.After(20 * time.Millisecond):
			}
			if resp, err := http.Get(base + "/readyz"); err == nil {
				seen = seen || resp.StatusCode == http.StatusServiceUnavailable
				resp.Body.Close()
			}
		}
	}()
	before := env.nri.Registrations()
	restarted := time.Now()
	if err := env.ctd.Restart(); err != nil {
		t.Fatal(err)
	}
	for env.nri.Registrations() == before {
		if time.Since(restarted) > 10*time.Second {
			t.Fatalf("nri-gpu did not reconnect within 10s of the restart:\n%s", env.nri.Log())
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("nri-gpu serving again %s after containerd was restarted", time.Since(restarted).Round(time.Millisecond))
	close(stop)
	if !<-notReady {
		t.Error("/readyz never said 503 while containerd was away")
	}
	testutil.Within(t, 5*time.Second, "/readyz 200 after the reconnection", func() bool {
		return readiness(t, base, "/readyz") == http.StatusOK
	})
	if code := readiness(t, base, "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz %d, want 200", code)
	}
	if !strings.Contains(env.nri.Log(), "reconnecting in") {
		t.Error("the reconnection attempts were not logged")
	}
	// The running pod still holds its GPU, and the plugin injects again.
	otherID, other := newPod(t, env.ctd, map[string]string{"gpus.nri-gpu.io": "3"})
	createFails(t, otherID, other, "held by pod e2e/"+pod.Name)
	_, spec := runContainer(t, env.ctd, podID, pod, harness.Container{Name: "after"})
	if got := gpuNodes(spec); !slices.Equal(got, []string{"/dev/nvidia3"}) {
		t.Errorf("after the restart, got %v", got)
	}
}

func TestSIGTERMExitsCleanly(t *testing.T) {
	needEnv(t)
	p, err := env.ctd.StartPlugin("--config", env.config, "--name", "nri-gpu-sigterm", "--idx", "90")
	if err != nil {
		t.Fatal(err)
	}
	code, err := p.Terminate(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if code != 0 || !strings.Contains(p.Log(), "plugin stopped") {
		t.Errorf("exit status %d, log:\n%s", code, p.Log())
	}
}

// TestConcurrentCreations creates 100 pods and containers at once, 20 at
// a time, on a runtime whose nri-gpu shares GPUs: each container must get
// exactly the GPU its pod asked for.
func TestConcurrentCreations(t *testing.T) {
	needEnv(t)
	ctd := extraContainerd(t, "ctd-load", harness.Options{})
	startPlugin(t, ctd)

	const pods, parallel = 100, 20
	var (
		wg   sync.WaitGroup
		sem  = make(chan struct{}, parallel)
		mu   sync.Mutex
		errs []string
	)
	for i := 0; i < pods; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			gpu := i % env.host.GPUs
			pod := harness.Pod{Name: fmt.Sprintf("load-%d", i), Namespace: "load", Annotations: map[string]string{"gpus.nri-gpu.io": fmt.Sprint(gpu)}}
			fail := func(format string, args ...any) {
				mu.Lock()
				defer mu.Unlock()
				errs = append(errs, fmt.Sprintf("pod %d: ", i)+fmt.Sprintf(format, args...))
			}
			podID, err := ctd.RunPod(pod)
			if err != nil {
				fail("%v", err)
				return
			}
			id, err := ctd.CreateContainer(podID, pod, harness.Container{Name: "c"})
			if err != nil {
				fail("%v", err)
				return
			}
			spec, err := ctd.ContainerSpec(id)
			if err != nil {
				fail("%v", err)
				return
			}
			if got, want := gpuNodes(spec), []string{fmt.Sprintf("/dev/nvidia%d", gpu)}; !slices.Equal(got, want) {
				fail("got %v, want %v", got, want)
			}
		}(i)
	}
	wg.Wait()
	for _, e := range errs {
		t.Error(e)
	}
}

// TestOversizedErrors asks for 256 unresolvable devices while 100 spec
// files are broken: an error repeating every spec problem for every name
// would be megabytes, over ttrpc's 4 MiB, and containerd would drop
// nri-gpu. The error is short, and nri-gpu serves the next pod.
func TestOversizedErrors(t *testing.T) {
	needEnv(t)
	ctd := extraContainerd(t, "ctd-oversize", harness.Options{})
	broken := filepath.Join(ctd.Dir, "broken-specs")
	if err := os.MkdirAll(broken, 0o755); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 100; i++ {
		name := fmt.Sprintf("%03d-%s.yaml", i, strings.Repeat("x", 200))
		if err := os.WriteFile(filepath.Join(broken, name), []byte("cdiVersion: [\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	config := filepath.Join(ctd.Dir, "nri-gpu.yaml")
	if err := os.WriteFile(config, []byte(env.host.PluginConfig([]string{broken})), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ctd.StartPlugin("--config", config); err != nil {
		t.Fatal(err)
	}
	var names []string
	for i := 0; i < 256; i++ {
		names = append(names, fmt.Sprintf("nvidia.com/gpu=missing-%d", i))
	}
	podID, pod := newPod(t, ctd, nil)
	_, err := ctd.CreateContainer(podID, pod, harness.Container{Name: "c", Annotations: map[string]string{"cdi.k8s.io/many": strings.Join(names, ",")}})
	if err == nil {
		t.Fatal("a container asking for 256 unresolvable devices was created")
	}
	msg := err.Error()
	t.Logf("the error containerd returned: %d bytes", len(msg))
	if !strings.Contains(msg, "unresolvable CDI device") || len(msg) > 16<<10 {
		t.Errorf("error of %d bytes, want a short one about unresolvable devices:\n%.2000s", len(msg), msg)
	}
	goodID, good := newPod(t, ctd, map[string]string{"gpus.nri-gpu.io": "1"})
	if _, spec := runContainer(t, ctd, goodID, good, harness.Container{Name: "after"}); !slices.Equal(gpuNodes(spec), []string{"/dev/nvidia1"}) {
		t.Errorf("after the oversized request, a good one got %v: nri-gpu was dropped", gpuNodes(spec))
	}
}
