// Command supervisor is what a sandbox's supervisor does with the record
// nri-gpu mounts into each container it gives devices: it reads the
// record (named by NRI_GPU_ACCESS) with CDI's own library, confines
// itself with Landlock to exactly the device nodes (read-write) and
// mounts (read-only) the record lists, then tries each path it is given
// and each path named on its command line, printing one line per path:
//
//	given  /dev/nvidia0: <error or ok>
//	other  /etc/hostname: <error or ok>
//
// The e2e tests run it in a container; it is an example for operators.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"

	"github.com/landlock-lsm/go-landlock/landlock"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "supervisor: %v\n", err)
		os.Exit(1)
	}
}

func run(others []string, out io.Writer) error {
	path := os.Getenv("NRI_GPU_ACCESS")
	if path == "" {
		return errors.New("NRI_GPU_ACCESS is not set: this container was given no devices")
	}
	spec, err := cdi.ReadSpec(path, 0)
	if err != nil {
		return err
	}
	if len(spec.Devices) != 1 {
		return fmt.Errorf("%s: %d devices, want the container alone", path, len(spec.Devices))
	}
	edits := spec.Devices[0].ContainerEdits
	var (
		rules []landlock.Rule
		given []string
	)
	for _, n := range edits.DeviceNodes {
		rules = append(rules, landlock.RWFiles(n.Path))
		given = append(given, n.Path)
	}
	for _, m := range edits.Mounts {
		info, err := os.Stat(m.ContainerPath)
		if err != nil {
			return err
		}
		if info.IsDir() {
			rules = append(rules, landlock.RODirs(m.ContainerPath))
		} else {
			rules = append(rules, landlock.ROFiles(m.ContainerPath))
		}
		given = append(given, m.ContainerPath)
	}
	// Strict: the kernel's Landlock must handle all of V5 (6.10 on).
	if err := landlock.V5.RestrictPaths(rules...); err != nil {
		return fmt.Errorf("landlock: %w", err)
	}
	fmt.Fprintf(out, "confined to %d paths\n", len(given))
	for _, p := range given {
		fmt.Fprintf(out, "given %s: %s\n", p, try(p))
	}
	for _, p := range others {
		fmt.Fprintf(out, "other %s: %s\n", p, try(p))
	}
	return nil
}

// try opens path read-write if it is a device, else reads it, and says
// what came of it.
func try(path string) string {
	info, err := os.Stat(path)
	if err != nil {
		return errno(err)
	}
	if info.Mode()&os.ModeDevice != 0 {
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			return errno(err)
		}
		f.Close()
		return "ok"
	}
	if info.IsDir() {
		_, err = os.ReadDir(path)
	} else {
		_, err = os.ReadFile(path)
	}
	if err != nil {
		return errno(err)
	}
	return "ok"
}

// errno names the system error of err: EACCES, ENXIO, ...
func errno(err error) string {
	var e syscall.Errno
	if errors.As(err, &e) {
		switch e {
		case syscall.EACCES:
			return "EACCES"
		case syscall.ENXIO:
			return "ENXIO"
		case syscall.ENOENT:
			return "ENOENT"
		}
	}
	return err.Error()
}
