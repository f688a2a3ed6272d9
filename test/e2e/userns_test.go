package e2e

import (
	"strings"
	"testing"

	"github.com/nri-gpu/nri-gpu/test/harness"
)

// TestUserNamespaceProbe: a user-namespaced pod asking for GPU 0.
func TestUserNamespaceProbe(t *testing.T) {
	needEnv(t)
	pod := harness.Pod{Name: "userns-probe", Namespace: "e2e", Annotations: map[string]string{"gpus.nri-gpu.io": "0"}, UserNS: true}
	id, err := env.ctd.RunPod(pod)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = env.ctd.Crictl("rmp", "--force", id) })
	cid, err := env.ctd.CreateContainer(id, pod, harness.Container{Name: "c"})
	if err != nil {
		t.Fatal(err)
	}
	if err := env.ctd.StartContainer(cid); err != nil {
		t.Fatal(err)
	}
	out, err := env.ctd.Exec(cid, "sh", "-c", "id; cat /proc/self/uid_map; ls -ln /dev/nvidia0; head -c 1 /dev/nvidia0 | wc -c")
	t.Logf("%v: %s", err, strings.TrimSpace(out))
}
