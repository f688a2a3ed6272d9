package e2e

import (
	"fmt"
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

// TestTakeOver: a rolling update with surge on real containerd. nri-gpu A
// serves; pod a holds GPU 0; B starts with --take-over on the same state
// file and waits, not serving. Containers of pod b, each asking for GPU 1,
// are created one after another throughout while A is stopped (SIGTERM,
// as kubelet stops the pod it replaces): B takes over as A lets go, and
// every container is served by exactly one of them, GPU 1 once in its
// spec; one created in between (neither serving) would be stopped by B
// when it connects, and is counted. B holds pod a's GPU 0 as A did.
func TestTakeOver(t *testing.T) {
	needEnv(t)
	ctd := extraContainerd(t, "ctd-takeover", harness.Options{})
	config := filepath.Join(ctd.Dir, "nri-gpu.yaml")
	if err := os.WriteFile(config, []byte(env.host.PluginConfig(nil, "exclusive: true")), 0o644); err != nil {
		t.Fatal(err)
	}
	a, err := ctd.StartPlugin("--config", config)
	if err != nil {
		t.Fatal(err)
	}
	aID, aPod := newPod(t, ctd, map[string]string{"gpus.nri-gpu.io": "0"})
	runContainer(t, ctd, aID, aPod, harness.Container{Name: "a"})
	b, err := ctd.StartStandby("--config", config)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Stop)
	if strings.Contains(b.Log(), "Started plugin") {
		t.Fatalf("B registered while A held the state file:\n%s", b.Log())
	}

	bID, bPod := newPod(t, ctd, map[string]string{"gpus.nri-gpu.io": "1"})
	type created struct {
		id    string
		nodes []string
		err   error
	}
	var (
		mu   sync.Mutex
		made []created
		done = make(chan struct{})
		wg   sync.WaitGroup
	)
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-done:
				return
			default:
			}
			id, err := ctd.CreateContainer(bID, bPod, harness.Container{Name: fmt.Sprintf("c%d", i)})
			c := created{id: id, err: err}
			if err == nil {
				if spec, serr := ctd.ContainerSpec(id); serr == nil {
					c.nodes = gpuNodes(spec)
				} else {
					c.err = serr
				}
			}
			mu.Lock()
			made = append(made, c)
			mu.Unlock()
		}
	})
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(made) }
	testutil.Within(t, 10*time.Second, "containers created while A serves", func() bool { return count() >= 3 })
	term := time.Now()
	if code, err := a.Terminate(10 * time.Second); err != nil || code != 0 {
		t.Fatalf("A: exit %d, %v", code, err)
	}
	testutil.Within(t, 10*time.Second, "B registered", func() bool { return strings.Contains(b.Log(), "Started plugin") })
	served := time.Since(term)
	before := count()
	testutil.Within(t, 20*time.Second, "containers created while B serves", func() bool { return count() >= before+3 })
	close(done)
	wg.Wait()

	var stopped int
	for _, c := range made {
		switch {
		case c.err != nil:
			t.Errorf("container %s: %v", c.id, c.err)
		case len(c.nodes) == 0:
			stopped++ // created while neither served: B stops it (TestUnservedStopped)
		case !slices.Equal(c.nodes, []string{"/dev/nvidia1"}):
			t.Errorf("container %s got %v, want GPU 1 once", c.id, c.nodes)
		}
	}
	t.Logf("%d containers created through the take-over, %d while neither served; B registered %s after A was told to stop", len(made), stopped, served.Round(time.Millisecond))
	if !strings.Contains(b.Log(), "took over the state file") {
		t.Errorf("B does not say it took over:\n%s", b.Log())
	}
	otherID, other := newPod(t, ctd, map[string]string{"gpus.nri-gpu.io": "0"})
	createFailsOn(t, ctd, otherID, other, harness.Container{Name: "c"}, "held by pod e2e/"+aPod.Name)
}
