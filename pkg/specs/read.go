package specs

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

// maxSpecSize caps the bytes read from one spec file, far above any
// published spec (an 8-GPU NVIDIA spec with MIG profiles is some 100 KiB).
const maxSpecSize = 8 << 20

// loaded is what one load of the spec directories found.
type loaded struct {
	// devices are the devices of the specs read, a later directory's
	// winning over an earlier one's, conflicts within a directory dropped.
	devices map[string]*cdi.Device
	// paths are the files the specs were read from.
	paths map[*cdi.Spec]string
	// untrusted says why a spec read is not trusted.
	untrusted map[*cdi.Spec]error
	// problems are, by file or directory, why it or some of its devices
	// are not used.
	problems map[string][]error
}

// readDirs reads the specs of dirs as CDI's cache would (the .json and
// .yaml files of each directory, later directories winning, conflicting
// devices of one directory dropped), but trusting what is read, not a
// path: each directory is opened and judged by fstat on its descriptor,
// and one that is not trusted is not read at all; each file is opened
// once, relative to its open directory, not through a symlink unless the
// target's directory is trusted too, must be a regular file under
// maxSpecSize, and is judged by fstat on its descriptor; CDI parses
// exactly the bytes read.
func readDirs(dirs []string) *loaded {
	l := &loaded{
		devices:   map[string]*cdi.Device{},
		paths:     map[*cdi.Spec]string{},
		untrusted: map[*cdi.Spec]error{},
		problems:  map[string][]error{},
	}
	conflicts := map[string]bool{}
	for priority, dir := range dirs {
		l.readDir(dir, priority, conflicts)
	}
	for name := range conflicts {
		delete(l.devices, name)
	}
	return l
}

// readDir reads the specs of one directory into l, recording in
// conflicts the devices two of its specs define.
func (l *loaded) readDir(dir string, priority int, conflicts map[string]bool) {
	d, err := openDir(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return
	case errors.Is(err, ErrUntrusted):
		l.problems[dir] = append(l.problems[dir], fmt.Errorf("not read: %w", err))
		return
	case err != nil:
		l.problems[dir] = append(l.problems[dir], err)
		return
	}
	defer d.Close()
	entries, err := d.ReadDir(-1)
	if err != nil {
		l.problems[dir] = append(l.problems[dir], err)
		return
	}
	for _, entry := range entries {
		if ext := filepath.Ext(entry.Name()); entry.IsDir() || (ext != ".json" && ext != ".yaml") {
			continue
		}
		path := filepath.Join(dir, entry.Name())
		spec, untrusted, err := readSpec(d, path, priority)
		if err != nil {
			l.problems[path] = append(l.problems[path], fmt.Errorf("failed to load CDI Spec: %w", err))
			continue
		}
		l.paths[spec] = path
		if untrusted != nil {
			l.untrusted[spec] = untrusted
			l.problems[path] = append(l.problems[path], untrusted)
		}
		for _, raw := range spec.Devices {
			dev := spec.GetDevice(raw.Name)
			name := dev.GetQualifiedName()
			if other, ok := l.devices[name]; ok && other.GetSpec().GetPriority() == priority {
				otherPath := l.paths[other.GetSpec()]
				err := fmt.Errorf("conflicting device %q (specs %q, %q)", name, path, otherPath)
				l.problems[path] = append(l.problems[path], err)
				l.problems[otherPath] = append(l.problems[otherPath], err)
				conflicts[name] = true
				continue
			}
			l.devices[name] = dev
		}
	}
}

// readSpec reads and parses one spec file, saying whether its owner and
// mode make it untrusted.
func readSpec(dir *os.File, path string, priority int) (spec *cdi.Spec, untrusted error, err error) {
	data, untrusted, err := readFile(dir, path)
	if err != nil {
		return nil, nil, err
	}
	spec, err = parse(data, priority)
	if err != nil {
		return nil, nil, err
	}
	return spec, untrusted, nil
}

// openDir opens a spec directory, following symlinks (the directories
// are the administrator's choice), and judges it by fstat on the
// descriptor: an error wrapping ErrUntrusted if others may write it.
func openDir(dir string) (*os.File, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: dir, Err: err}
	}
	f := os.NewFile(uintptr(fd), dir)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		f.Close()
		return nil, &fs.PathError{Op: "fstat", Path: dir, Err: err}
	}
	if err := ownerAndMode(dir, st.Uid, os.FileMode(st.Mode&0o777)); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// readFile reads the spec file at path, an entry of the open directory
// dir, as readDirs says.
func readFile(dir *os.File, path string) (data []byte, untrusted error, err error) {
	parent, name, target := dir, filepath.Base(path), path
	var lst unix.Stat_t
	if err := unix.Fstatat(int(dir.Fd()), name, &lst, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return nil, nil, &fs.PathError{Op: "lstat", Path: path, Err: err}
	}
	if lst.Mode&unix.S_IFMT == unix.S_IFLNK {
		if target, err = filepath.EvalSymlinks(path); err != nil {
			return nil, nil, err
		}
		td, err := openDir(filepath.Dir(target))
		if err != nil {
			return nil, nil, fmt.Errorf("a symlink to %s: %w", target, err)
		}
		defer td.Close()
		parent, name = td, filepath.Base(target)
	}
	// O_NOFOLLOW: a symlink swapped in since is not followed; O_NONBLOCK:
	// a FIFO does not block the open.
	fd, err := unix.Openat(int(parent.Fd()), name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, &fs.PathError{Op: "open", Path: target, Err: err}
	}
	f := os.NewFile(uintptr(fd), target)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, nil, &fs.PathError{Op: "fstat", Path: target, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, nil, fmt.Errorf("%s is not a regular file", target)
	}
	if st.Size > maxSpecSize {
		return nil, nil, fmt.Errorf("%s has %d bytes, more than %d", target, st.Size, maxSpecSize)
	}
	untrusted = ownerAndMode(target, st.Uid, os.FileMode(st.Mode&0o777))
	data, err = io.ReadAll(io.LimitReader(f, maxSpecSize+1))
	if err != nil {
		return nil, nil, &fs.PathError{Op: "read", Path: target, Err: err}
	}
	if len(data) > maxSpecSize {
		return nil, nil, fmt.Errorf("%s has more than %d bytes", target, maxSpecSize)
	}
	return data, untrusted, nil
}

// parse has CDI read and validate a spec from data. CDI reads specs from
// a path only, so data is handed to it in an anonymous memory file: what
// it parses is what was read and checked, whatever happens on disk.
func parse(data []byte, priority int) (*cdi.Spec, error) {
	fd, err := unix.MemfdCreate("cdi-spec", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), "cdi-spec")
	defer f.Close()
	if _, err := f.Write(data); err != nil {
		return nil, err
	}
	proc := fmt.Sprintf("/proc/self/fd/%d", fd)
	spec, err := cdi.ReadSpec(proc, priority)
	if err != nil {
		// CDI names the file it read; the caller names the spec file.
		return nil, errors.New(strings.ReplaceAll(err.Error(), fmt.Sprintf("%q", proc), "spec"))
	}
	return spec, nil
}
