package harness

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"runtime"
	"slices"
	"strings"
	"time"
)

// ImageRef is the name the busybox image is imported under.
const ImageRef = "localhost/nri-gpu-e2e/busybox:latest"

// busyboxApplets are linked to busybox in the image.
var busyboxApplets = []string{
	"sh", "ls", "cat", "env", "sleep", "stat", "grep", "echo", "test", "true", "mount", "head", "readlink", "mknod",
	"rm", "mv", "touch", "mkdir", "timeout",
}

// File is a file to put in an image.
type File struct {
	// Name is its path in the image, without the leading "/".
	Name string
	Data []byte
	Mode int64
	// Link, when set, makes it a symbolic link to Link (Data unused).
	Link string
}

// BuildImage writes an OCI image layout tar holding one layer with the
// static busybox at /bin/busybox and its applets, and the extra files,
// named ImageRef.
func BuildImage(busybox, out string, extra ...File) error {
	return BuildNamedImage(busybox, out, ImageRef, extra...)
}

// BuildNamedImage is BuildImage with the image named name (a stand-in
// for an image a published manifest names, which tests never pull).
func BuildNamedImage(busybox, out, name string, extra ...File) error {
	bin, err := os.ReadFile(busybox)
	if err != nil {
		return fmt.Errorf("reading busybox: %w", err)
	}
	layer, diffID, err := busyboxLayer(bin, extra)
	if err != nil {
		return err
	}
	config, err := json.Marshal(map[string]any{
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"config": map[string]any{
			"Env": []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			"Cmd": []string{"/bin/sleep", "2147483647"},
		},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{diffID}},
	})
	if err != nil {
		return err
	}
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        descriptor("application/vnd.oci.image.config.v1+json", config, nil),
		"layers":        []any{descriptor("application/vnd.oci.image.layer.v1.tar+gzip", layer, nil)},
	})
	if err != nil {
		return err
	}
	index, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.index.v1+json",
		"manifests": []any{descriptor("application/vnd.oci.image.manifest.v1+json", manifest, map[string]string{
			"io.containerd.image.name":          name,
			"org.opencontainers.image.ref.name": name[strings.LastIndex(name, ":")+1:],
		})},
	})
	if err != nil {
		return err
	}

	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	files := []struct {
		name string
		data []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", index},
		{blobPath(config), config},
		{blobPath(manifest), manifest},
		{blobPath(layer), layer},
	}
	for _, file := range files {
		if err := writeFile(tw, file.name, file.data, 0o644); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return f.Close()
}

func busyboxLayer(bin []byte, extra []File) (layer []byte, diffID string, err error) {
	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	dirs := []string{"bin/", "dev/", "proc/", "sys/", "tmp/", "etc/", "usr/", "usr/lib/"}
	for _, f := range extra {
		for d := path.Dir(f.Name); d != "." && d != "/"; d = path.Dir(d) {
			if !slices.Contains(dirs, d+"/") {
				dirs = append(dirs, d+"/")
			}
		}
	}
	slices.Sort(dirs) // parents first
	for _, dir := range dirs {
		if err := tw.WriteHeader(&tar.Header{Name: dir, Typeflag: tar.TypeDir, Mode: 0o755, ModTime: time.Unix(0, 0)}); err != nil {
			return nil, "", err
		}
	}
	for _, f := range extra {
		if f.Link != "" {
			if err := tw.WriteHeader(&tar.Header{Name: f.Name, Typeflag: tar.TypeSymlink, Linkname: f.Link, Mode: 0o777, ModTime: time.Unix(0, 0)}); err != nil {
				return nil, "", err
			}
			continue
		}
		if err := writeFile(tw, f.Name, f.Data, f.Mode); err != nil {
			return nil, "", err
		}
	}
	if err := writeFile(tw, "bin/busybox", bin, 0o755); err != nil {
		return nil, "", err
	}
	for _, a := range busyboxApplets {
		if err := tw.WriteHeader(&tar.Header{Name: "bin/" + a, Typeflag: tar.TypeSymlink, Linkname: "busybox", Mode: 0o777, ModTime: time.Unix(0, 0)}); err != nil {
			return nil, "", err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, "", err
	}
	diffID = fmt.Sprintf("sha256:%x", sha256.Sum256(raw.Bytes()))
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	if _, err := io.Copy(zw, &raw); err != nil {
		return nil, "", err
	}
	if err := zw.Close(); err != nil {
		return nil, "", err
	}
	return gz.Bytes(), diffID, nil
}

func writeFile(tw *tar.Writer, name string, data []byte, mode int64) error {
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: mode, Size: int64(len(data)), ModTime: time.Unix(0, 0)}); err != nil {
		return err
	}
	_, err := tw.Write(data)
	return err
}

func digest(b []byte) string { return fmt.Sprintf("sha256:%x", sha256.Sum256(b)) }

func blobPath(b []byte) string { return fmt.Sprintf("blobs/sha256/%x", sha256.Sum256(b)) }

func descriptor(mediaType string, b []byte, annotations map[string]string) map[string]any {
	d := map[string]any{"mediaType": mediaType, "digest": digest(b), "size": len(b)}
	if annotations != nil {
		d["annotations"] = annotations
	}
	return d
}

// ProgramFiles returns a program, at name in the image, and, when it is
// dynamically linked, the C library and loader it needs, at the paths ldd
// names, so that it runs in the busybox image.
func ProgramFiles(program, name string) ([]File, error) {
	data, err := os.ReadFile(program)
	if err != nil {
		return nil, err
	}
	files := []File{{Name: name, Data: data, Mode: 0o755}}
	out, err := exec.Command("ldd", program).CombinedOutput()
	if err != nil {
		if strings.Contains(string(out), "not a dynamic executable") {
			return files, nil
		}
		return nil, fmt.Errorf("ldd %s: %w: %s", program, err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		var p string
		if _, after, ok := strings.Cut(line, "=> "); ok {
			p, _, _ = strings.Cut(after, " ")
		} else if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], "/") {
			p = f[0]
		}
		if !strings.HasPrefix(p, "/") {
			continue
		}
		data, err := os.ReadFile(p) // through links: the file itself
		if err != nil {
			return nil, err
		}
		files = append(files, File{Name: strings.TrimPrefix(p, "/"), Data: data, Mode: 0o755})
	}
	return files, nil
}
