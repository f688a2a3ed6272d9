package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"

	pathrs "github.com/cyphar/filepath-securejoin/pathrs-lite"
	"github.com/opencontainers/runtime-spec/specs-go"
	"github.com/urfave/cli/v3"
	"golang.org/x/sys/unix"
)

// chmodCommand replaces NVIDIA's chmod hook (nvidia-cdi-hook chmod, kept
// for older specs; the toolkit's generators no longer write it), which
// joins each --path to the container's root and follows whatever symlink
// the image put there, to a host file. This one takes the same flags and
// resolves each path within the container's root, as the toolkit's
// create-symlinks does (filepath-securejoin's pathrs-lite): a symlink in
// the image leads to a file of the image, never of the host.
func chmodCommand(stdin io.Reader) *cli.Command {
	var (
		paths []string
		mode  string
		state string
	)
	return &cli.Command{
		Name:  "chmod",
		Usage: "Set the mode of paths in the container, each resolved within the container's root",
		Flags: []cli.Flag{
			&cli.StringSliceFlag{Name: "path", Usage: "a path in the container to set the mode of", Destination: &paths},
			&cli.StringFlag{Name: "mode", Usage: "the mode, in octal", Destination: &mode},
			&cli.StringFlag{Name: "container-spec", Usage: "the container's state (OCI); standard input when empty or -", Destination: &state},
		},
		Action: func(context.Context, *cli.Command) error {
			m, err := strconv.ParseUint(mode, 8, 32)
			if err != nil || m > 0o7777 {
				return fmt.Errorf("chmod: --mode %q is not an octal file mode", mode)
			}
			root, err := containerRoot(state, stdin)
			if err != nil {
				return fmt.Errorf("chmod: %w", err)
			}
			return chmodInRoot(root, paths, fs.FileMode(m))
		},
	}
}

// containerRoot returns the root of the container whose OCI state is in
// file (standard input when "" or "-"): its bundle's root.path.
func containerRoot(file string, stdin io.Reader) (string, error) {
	var data []byte
	var err error
	if file == "" || file == "-" {
		data, err = io.ReadAll(io.LimitReader(stdin, 1<<20))
	} else {
		data, err = os.ReadFile(file)
	}
	if err != nil {
		return "", fmt.Errorf("container state: %w", err)
	}
	var st specs.State
	if err := json.Unmarshal(data, &st); err != nil || st.Bundle == "" {
		return "", fmt.Errorf("container state: no bundle (%v)", err)
	}
	data, err = os.ReadFile(filepath.Join(st.Bundle, "config.json"))
	if err != nil {
		return "", fmt.Errorf("container spec: %w", err)
	}
	var spec specs.Spec
	if err := json.Unmarshal(data, &spec); err != nil || spec.Root == nil || spec.Root.Path == "" {
		return "", fmt.Errorf("container spec %s: no root (%v)", filepath.Join(st.Bundle, "config.json"), err)
	}
	if filepath.IsAbs(spec.Root.Path) {
		return spec.Root.Path, nil
	}
	return filepath.Join(st.Bundle, spec.Root.Path), nil
}

// chmodInRoot sets the mode of each path, resolved within root; a path
// that is not there is left out, as NVIDIA's hook does, and so is a
// permission error (a /dev mounted whole, read only).
func chmodInRoot(root string, paths []string, mode fs.FileMode) error {
	dir, err := os.OpenFile(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("chmod: container root: %w", err)
	}
	defer dir.Close()
	var errs []error
	for _, p := range paths {
		f, err := pathrs.OpenatInRoot(dir, p)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("chmod %s: %w", p, err))
			continue
		}
		// The handle is the file resolved in the root; its /proc link
		// names that inode, whatever the path's symlinks say now.
		err = unix.Fchmodat(unix.AT_FDCWD, fmt.Sprintf("/proc/self/fd/%d", f.Fd()), uint32(mode), 0)
		f.Close()
		if err != nil && !errors.Is(err, unix.EPERM) && !errors.Is(err, unix.EROFS) {
			errs = append(errs, fmt.Errorf("chmod %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}
