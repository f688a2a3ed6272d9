package main

import (
	"archive/tar"
	"errors"
	"io"
	"maps"
	"path/filepath"
	"slices"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// TestBuild builds the image of dynamically linked programs (/bin/ls as
// nri-gpu, /bin/cat as its DRA driver) and reads it back as `ctr images
// import` would: the programs executable, the driver beside nri-gpu; the
// loader and libc at the paths the loader looks at; a non-root user; the
// labels.
func TestBuild(t *testing.T) {
	out := filepath.Join(t.TempDir(), "image.tar")
	if err := build("/bin/ls", "/bin/cat", out, "nri-gpu:test", map[string]string{"org.opencontainers.image.revision": "abc"}); err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(out, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Config.User != nonRoot || !slices.Equal(cfg.Config.Entrypoint, []string{binaryPath}) || cfg.Config.Labels["org.opencontainers.image.revision"] != "abc" || cfg.OS != "linux" {
		t.Errorf("config %+v", cfg.Config)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers %v, %v", layers, err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	modes := map[string]int64{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		modes["/"+h.Name] = h.Mode
	}
	for _, p := range []string{binaryPath, draBinaryPath} {
		if modes[p]&0o111 == 0 {
			t.Errorf("%s not executable: %o (files %v)", p, modes[p], modes)
		}
	}
	if filepath.Dir(draBinaryPath) != filepath.Dir(binaryPath) {
		t.Errorf("the DRA driver at %s, not beside nri-gpu at %s, where nri-gpu looks for it", draBinaryPath, binaryPath)
	}
	if !slices.ContainsFunc(slices.Collect(maps.Keys(modes)), func(p string) bool { return filepath.Base(p) == "libc.so.6" }) {
		t.Errorf("no libc in the image: %v", modes)
	}
}
