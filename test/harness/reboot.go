package harness

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// PowerOff ends the node as a power cut does, as far as what a reboot
// loses goes: kubelet and containerd killed (SIGKILL), every process of
// its pods and their shims too, the mounts made in its namespace since
// it was made (containers' root filesystems, pod volumes, network
// namespaces) gone, the pods' cgroups and bridge gone, and what its /run
// (a tmpfs) and containerd's state held removed, but for the names in
// keep (kept, as a disk keeps them) and /run's CDI specs (which a node
// writes again at boot: the toolkit's nvidia-cdi-refresh) and NRI socket
// directory. /var/lib (containerd's images and metadata, kubelet's
// checkpoints) stays. PowerOn boots it again.
func (n *Node) PowerOff(keep ...string) error {
	n.kubelet.kill()
	n.Ctd.kill()
	var errs []error
	errs = append(errs, killShims(n.Ctd.Address, n.Ctd.Dir), killCgroup(n.cgroupRoot))
	errs = append(errs, n.unmountSinceMade())
	errs = append(errs, removeCgroup(n.cgroupRoot), n.deleteBridge())
	errs = append(errs, emptyDir(filepath.Join(n.Dir, "run"), append(keep, "cdi", "nri")...))
	errs = append(errs, emptyDir(filepath.Join(n.Ctd.Dir, "state")))
	return errors.Join(errs...)
}

// PowerOn boots the node after PowerOff: containerd, then kubelet, and
// waits until the node is Ready again.
func (n *Node) PowerOn() error {
	if err := makeCgroup(n.cgroupRoot); err != nil {
		return err
	}
	if err := n.Ctd.start(); err != nil {
		return err
	}
	if err := n.StartKubelet(); err != nil {
		return err
	}
	return n.WaitReady(90 * time.Second)
}

// kill ends containerd and what is left of its process group (SIGKILL).
func (c *Containerd) kill() {
	if c.cmd == nil || c.cmd.Process == nil {
		return
	}
	_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
	c.done <- <-c.done
}

// kill ends the process group at once (SIGKILL).
func (p *process) kill() {
	if !p.Running() {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	p.done <- <-p.done
}

// killCgroup kills every process in cgroup path and below, in every
// hierarchy, until none is left.
func killCgroup(path string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		left := 0
		for _, m := range cgroupMounts() {
			_ = filepath.WalkDir(filepath.Join(m, path), func(p string, d os.DirEntry, err error) error {
				if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
					return nil
				}
				data, _ := os.ReadFile(p)
				for _, f := range strings.Fields(string(data)) {
					if pid, err := strconv.Atoi(f); err == nil {
						left++
						_ = syscall.Kill(pid, syscall.SIGKILL)
					}
				}
				return nil
			})
		}
		if left == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup %s: %d processes still there after SIGKILL", path, left)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// cgroupMounts are the cgroup hierarchies of the machine.
func cgroupMounts() []string {
	mounts, _ := filepath.Glob("/sys/fs/cgroup/*")
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		return []string{"/sys/fs/cgroup"}
	}
	return slices.DeleteFunc(mounts, func(m string) bool {
		st, err := os.Stat(m)
		return err != nil || !st.IsDir()
	})
}

// mountIDs returns the mounts of the node's namespace: each mount's ID
// with its mount point.
func (n *Node) mountIDs() (map[string]string, error) {
	f, err := os.Open(filepath.Join("/proc", strconv.Itoa(n.holder.Pid()), "mountinfo"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ids := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) > 4 {
			ids[fields[0]] = fields[4]
		}
	}
	return ids, sc.Err()
}

// unmountSinceMade lazily unmounts, in the node's namespace, every mount
// made since the namespace was (deepest first), until none is left.
func (n *Node) unmountSinceMade() error {
	for range 5 {
		ids, err := n.mountIDs()
		if err != nil {
			return err
		}
		var points []string
		for id, p := range ids {
			if !n.baseMounts[id] {
				points = append(points, p)
			}
		}
		if len(points) == 0 {
			return nil
		}
		slices.Sort(points)
		slices.Reverse(points)
		script := `for p; do umount -l "$p" 2>/dev/null; done; true`
		argv := append(n.enter(), append([]string{"sh", "-c", script, "sh"}, points...)...)
		if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
			return fmt.Errorf("unmounting in %s: %w: %s", n.Name, err, out)
		}
	}
	return fmt.Errorf("%s: mounts left after unmounting five times", n.Name)
}

// emptyDir removes what dir holds but the entries named in keep.
func emptyDir(dir string, keep ...string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		if !slices.Contains(keep, e.Name()) {
			errs = append(errs, os.RemoveAll(filepath.Join(dir, e.Name())))
		}
	}
	return errors.Join(errs...)
}
