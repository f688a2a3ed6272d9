// Command image builds nri-gpu's OCI image without Docker or a registry:
// one layer holding the nri-gpu binary, its DRA driver beside it, and
// exactly the shared objects they link (its ELF interpreter and DT_NEEDED libraries, found as the dynamic
// loader finds them, and theirs in turn), a config that runs it as a
// non-root user unless the pod says otherwise, and OCI labels. The image
// is written as a tar that `ctr images import` and `docker load` read.
//
//	go run . -binary ../../_output/bin/nri-gpu -dra-binary ../../_output/bin/nri-gpu-dra \
//	    -out ../../_output/nri-gpu-image.tar \
//	    -name nri-gpu:latest -version v0.1.0 -revision <commit> -source <repository URL>
package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Where nri-gpu and its DRA driver go in the image (the driver beside
// nri-gpu, where nri-gpu looks for it), and the user it runs as by
// default (the DaemonSet runs it as root, to reach containerd's NRI
// socket).
const (
	binaryPath    = "/usr/local/bin/nri-gpu"
	draBinaryPath = "/usr/local/bin/nri-gpu-dra"
	nonRoot       = "65532:65532"
)

// libDirs are searched, in order, for a needed library, as the dynamic
// loader of Debian, Ubuntu, Fedora and the like searches them.
var libDirs = map[elf.Machine][]string{
	elf.EM_X86_64:  {"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"},
	elf.EM_AARCH64: {"/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"},
}

var archOf = map[elf.Machine]string{elf.EM_X86_64: "amd64", elf.EM_AARCH64: "arm64"}

func main() {
	var (
		binary   = flag.String("binary", "", "the nri-gpu binary")
		dra      = flag.String("dra-binary", "", "the nri-gpu-dra binary (none when empty)")
		out      = flag.String("out", "", "the image tar to write")
		ref      = flag.String("name", "nri-gpu:latest", "the image's name and tag")
		version  = flag.String("version", "dev", "org.opencontainers.image.version")
		revision = flag.String("revision", "unknown", "org.opencontainers.image.revision")
		source   = flag.String("source", "", "org.opencontainers.image.source")
	)
	flag.Parse()
	if *binary == "" || *out == "" {
		flag.Usage()
		os.Exit(2)
	}
	labels := map[string]string{
		"org.opencontainers.image.title":       "nri-gpu",
		"org.opencontainers.image.description": "containerd NRI plugin that gives containers GPUs and other CDI devices",
		"org.opencontainers.image.version":     *version,
		"org.opencontainers.image.revision":    *revision,
		"org.opencontainers.image.licenses":    "Apache-2.0",
	}
	// No address the publisher did not give.
	if *source != "" {
		labels["org.opencontainers.image.source"] = *source
	}
	if err := build(*binary, *dra, *out, *ref, labels); err != nil {
		fmt.Fprintf(os.Stderr, "image: %v\n", err)
		os.Exit(1)
	}
}

func build(binary, dra, out, ref string, labels map[string]string) error {
	tag, err := name.NewTag(ref)
	if err != nil {
		return err
	}
	files := map[string]string{binaryPath: binary} // image path -> host file
	machine, err := closure(binary, files)
	if err != nil {
		return err
	}
	if dra != "" {
		files[draBinaryPath] = dra
		draMachine, err := closure(dra, files)
		if err != nil {
			return err
		}
		if draMachine != machine {
			return fmt.Errorf("%s is for %s, %s for %s", dra, draMachine, binary, machine)
		}
	}
	layer, err := layerOf(files)
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", archOf[machine]
	cfg.Config = v1.Config{
		Entrypoint: []string{binaryPath},
		User:       nonRoot,
		Env:        []string{"PATH=/usr/local/bin:/usr/bin:/bin"},
		Labels:     labels,
	}
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		return err
	}
	return tarball.WriteToFile(out, tag, img)
}

// closure adds to files the ELF interpreter and the shared objects binary
// needs, and theirs, each at the path the loader finds it at.
func closure(binary string, files map[string]string) (elf.Machine, error) {
	f, err := elf.Open(binary)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	machine := f.Machine
	dirs, ok := libDirs[machine]
	if !ok {
		return 0, fmt.Errorf("%s: unsupported machine %s", binary, machine)
	}
	queue := []string{binary}
	for len(queue) > 0 {
		next := queue[0]
		queue = queue[1:]
		e, err := elf.Open(next)
		if err != nil {
			return 0, err
		}
		needed, err := e.ImportedLibraries()
		interp := interpreter(e)
		e.Close()
		if err != nil {
			return 0, fmt.Errorf("%s: %w", next, err)
		}
		if interp != "" && files[interp] == "" {
			files[interp] = interp
			queue = append(queue, interp)
		}
		for _, lib := range needed {
			found := ""
			for _, d := range dirs {
				if _, err := os.Stat(filepath.Join(d, lib)); err == nil {
					found = path.Join(d, lib)
					break
				}
			}
			if found == "" {
				return 0, fmt.Errorf("%s needs %s, found in none of %v", next, lib, dirs)
			}
			if files[found] == "" {
				files[found] = found
				queue = append(queue, found)
			}
		}
	}
	return machine, nil
}

// interpreter returns the ELF interpreter (PT_INTERP) of e, or "".
func interpreter(e *elf.File) string {
	for _, p := range e.Progs {
		if p.Type == elf.PT_INTERP {
			b, err := io.ReadAll(p.Open())
			if err != nil {
				return ""
			}
			return string(bytes.TrimRight(b, "\x00"))
		}
	}
	return ""
}

// layerOf makes a layer of files (image path -> host file, symlinks
// followed), with their directories, owned by root, at a fixed time so
// that the same inputs make the same image.
func layerOf(files map[string]string) (v1.Layer, error) {
	var buf bytes.Buffer
	w := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0)
	var dirs []string
	for p := range files {
		for d := path.Dir(p); d != "/" && !slices.Contains(dirs, d); d = path.Dir(d) {
			dirs = append(dirs, d)
		}
	}
	slices.Sort(dirs)
	for _, d := range dirs {
		if err := w.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d[1:] + "/", Mode: 0o755, ModTime: epoch}); err != nil {
			return nil, err
		}
	}
	for _, p := range slices.Sorted(maps.Keys(files)) {
		data, err := os.ReadFile(files[p])
		if err != nil {
			return nil, err
		}
		fi, err := os.Stat(files[p])
		if err != nil {
			return nil, err
		}
		if !fi.Mode().IsRegular() {
			return nil, errors.New(files[p] + " is not a regular file")
		}
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: p[1:], Mode: int64(fi.Mode().Perm() | 0o444), Size: int64(len(data)), ModTime: epoch}
		if err := w.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := w.Write(data); err != nil {
			return nil, err
		}
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
}
