package dra_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/nri-gpu/nri-gpu/internal/testutil"
	"github.com/nri-gpu/nri-gpu/pkg/config"
	"github.com/nri-gpu/nri-gpu/pkg/dra"
)

// microk8s is microk8s' kubelet root, 41 bytes long.
const microk8s = "/var/snap/microk8s/common/var/lib/kubelet"

const podUID = types.UID("0d1a5e63-8f4e-4c3a-9a0f-7c2b5a1e9d42")

// TestSocketsOf: the driver's sockets fit a unix socket's path (108
// bytes) under any kubelet root: the helper's names where they fit, a
// shorter name of the pod where the DRA service's does not (microk8s'
// root), no rolling update (said why) where even those do not, and an
// error naming the path where nothing fits.
func TestSocketsOf(t *testing.T) {
	const driver = "gpu.nri-gpu.io"
	root := func(n int) string { return "/" + strings.Repeat("k", n-1) }
	for _, tc := range []struct {
		name, root   string
		uid          types.UID
		wantRegistry string // the registration socket's name
		wantPlugin   string
		rolling      bool
		wantErr      error
	}{
		{name: "kubelet's default", root: "/var/lib/kubelet", uid: podUID, wantRegistry: driver + "-" + string(podUID) + "-reg.sock", wantPlugin: "dra-" + string(podUID) + ".sock", rolling: true},
		{name: "kubelet's default, no rolling update", root: "/var/lib/kubelet", wantRegistry: driver + "-reg.sock", wantPlugin: "dra.sock"},
		{name: "microk8s", root: microk8s, uid: podUID, wantRegistry: driver + "-", wantPlugin: "dra-", rolling: true},
		{name: "a root of 55 bytes", root: root(55), uid: podUID, wantRegistry: driver + "-", wantPlugin: "dra-", rolling: true},
		{name: "a root of 60 bytes: no rolling update", root: root(60), uid: podUID, wantRegistry: driver + "-reg.sock", wantPlugin: "dra.sock"},
		{name: "a root of 70 bytes: none fits", root: root(70), uid: podUID, wantErr: dra.ErrSocketPath},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := dra.SocketsOf(driver, filepath.Join(tc.root, "plugins", driver), filepath.Join(tc.root, "plugins_registry"), tc.uid)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) || !strings.Contains(err.Error(), tc.root) {
					t.Fatalf("%+v, %v; want %v naming the path", s, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range []string{s.Registrar, s.Plugin} {
				if len(p) > 108 || !strings.HasPrefix(p, tc.root+"/") {
					t.Errorf("%s: %d bytes, want at most 108, under %s", p, len(p), tc.root)
				}
			}
			if !strings.HasPrefix(filepath.Base(s.Registrar), tc.wantRegistry) || !strings.HasPrefix(filepath.Base(s.Plugin), tc.wantPlugin) || s.RollingUpdate != tc.rolling {
				t.Errorf("%+v; want names %s…, %s…, rolling update %v", s, tc.wantRegistry, tc.wantPlugin, tc.rolling)
			}
			if (s.Why != "") != (tc.uid != "" && !tc.rolling) {
				t.Errorf("why %q, for a rolling update left out: %v", s.Why, tc.uid != "" && !tc.rolling)
			}
		})
	}
	// Two pods of a rolling update never share a socket.
	a, _ := dra.SocketsOf(driver, filepath.Join(microk8s, "plugins", driver), filepath.Join(microk8s, "plugins_registry"), podUID)
	b, _ := dra.SocketsOf(driver, filepath.Join(microk8s, "plugins", driver), filepath.Join(microk8s, "plugins_registry"), "5c3e2b1a-0000-4000-8000-000000000001")
	if a.Plugin == b.Plugin || a.Registrar == b.Registrar {
		t.Errorf("two pods' sockets: %+v and %+v", a, b)
	}
}

// TestLongKubeletRoot: a driver under a kubelet root as long as
// microk8s', for a rolling update, serves kubelet its registration and
// its DRA service at paths that fit, and says where.
func TestLongKubeletRoot(t *testing.T) {
	// Inside the test's own directory, which is removed when it ends.
	base := testutil.ShortDir(t)
	root := filepath.Join(base, strings.Repeat("k", len(microk8s)-len(base)-1))
	if len(root) != len(microk8s) {
		t.Fatalf("root %s: %d bytes", root, len(root))
	}
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := config.Default().Start.DRA
	cfg.PluginDir, cfg.RegistryDir = filepath.Join(root, "plugins"), filepath.Join(root, "plugins_registry")
	socks, err := dra.SocketsOf(cfg.DriverName, filepath.Join(cfg.PluginDir, cfg.DriverName), cfg.RegistryDir, podUID)
	if err != nil || !socks.RollingUpdate {
		t.Fatalf("%+v, %v: want a rolling update's sockets", socks, err)
	}
	for _, d := range []string{filepath.Dir(socks.Plugin), cfg.RegistryDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	log, hook := test.NewNullLogger()
	log.SetLevel(logrus.DebugLevel)
	d := dra.New(cfg, node, newSource("gpu-0"), log)
	d.RollingUpdate = podUID
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- d.Run(ctx, fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, UID: "node-uid"}}))
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	for _, p := range []string{socks.Plugin, socks.Registrar} {
		waitFor(t, p, func() bool { _, err := os.Stat(p); return err == nil })
	}
	conn, err := grpc.NewClient("unix://"+socks.Registrar, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	info, err := registerapi.NewRegistrationClient(conn).GetInfo(context.Background(), &registerapi.InfoRequest{})
	if err != nil || info.Name != cfg.DriverName || info.Endpoint != socks.Plugin {
		t.Fatalf("registration %+v, %v; want %s at %s", info, err, cfg.DriverName, socks.Plugin)
	}
	waitFor(t, "the log saying where", func() bool {
		for _, e := range hook.AllEntries() {
			if strings.Contains(e.Message, socks.Registrar) && strings.Contains(e.Message, socks.Plugin) {
				return true
			}
		}
		return false
	})
}

// TestNotServingSaysWhy: a driver under a kubelet root too long for any
// socket name is not registered, and says why: the path, its length.
func TestNotServingSaysWhy(t *testing.T) {
	cfg := config.Default().Start.DRA
	root := "/" + strings.Repeat("k", 79)
	cfg.PluginDir, cfg.RegistryDir = filepath.Join(root, "plugins"), filepath.Join(root, "plugins_registry")
	d := dra.New(cfg, node, newSource("gpu-0"), logrus.New())
	if err := d.Registered(); err == nil || !strings.Contains(err.Error(), "not serving kubelet yet") {
		t.Errorf("before Run: %v", err)
	}
	err := d.Run(context.Background(), fake.NewClientset())
	if !errors.Is(err, dra.ErrSocketPath) {
		t.Fatalf("Run: %v, want ErrSocketPath", err)
	}
	if got := d.Registered(); got == nil || !errors.Is(got, dra.ErrSocketPath) || !strings.Contains(got.Error(), "not serving kubelet: DRA driver gpu.nri-gpu.io: ") || !strings.Contains(got.Error(), root+"/plugins_registry/gpu.nri-gpu.io-reg.sock is 121 bytes long") {
		t.Errorf("registered: %v", got)
	}
}
