package main

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// TestHook runs nri-gpu as the CDI hook of the specs it generates, as a
// runtime does ("nri-gpu create-symlinks --link ...", the container's
// state on standard input): it makes the link libcuda.so -> libcuda.so.1
// in the container's root that lets a program load the driver by name.
func TestHook(t *testing.T) {
	bundle := t.TempDir()
	rootfs := filepath.Join(bundle, "rootfs")
	if err := os.MkdirAll(filepath.Join(rootfs, "usr/lib/x86_64-linux-gnu"), 0o755); err != nil {
		t.Fatal(err)
	}
	config, _ := json.Marshal(map[string]any{"ociVersion": "1.0.0", "root": map[string]any{"path": "rootfs"}})
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), config, 0o644); err != nil {
		t.Fatal(err)
	}
	state, _ := json.Marshal(map[string]any{"ociVersion": "1.0.0", "id": "c", "status": "creating", "pid": os.Getpid(), "bundle": bundle})
	stdin := filepath.Join(t.TempDir(), "state.json")
	if err := os.WriteFile(stdin, state, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(stdin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	saved := os.Stdin
	os.Stdin = f
	defer func() { os.Stdin = saved }()

	var stderr bytes.Buffer
	if code := run([]string{"create-symlinks", "--link", "libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so"}, io.Discard, &stderr); code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	target, err := os.Readlink(filepath.Join(rootfs, "usr/lib/x86_64-linux-gnu/libcuda.so"))
	if err != nil || target != "libcuda.so.1" {
		t.Errorf("link %q, %v; want libcuda.so -> libcuda.so.1", target, err)
	}
	if code := run([]string{"hook", "noop"}, io.Discard, &stderr); code != exitOK {
		t.Errorf("nri-gpu hook noop: exit %d: %s", code, stderr.String())
	}
}
