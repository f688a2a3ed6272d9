package harness

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// VMEnv names the directory hack/vm-root.sh writes: the root disk, kernel
// and initramfs of the cgroup v2 test node.
const VMEnv = "NRI_GPU_VM"

// VMImage is the cgroup v2 test node: a Debian root with systemd as PID 1
// (hack/vm-root.sh), booted by qemu's software emulation (these machines'
// guests hang under KVM). Its one service runs the payload disk's `run`
// and powers off.
type VMImage struct {
	Root, Kernel, Initrd string
	// Source says what the root was built from (its SOURCE file).
	Source string
	qemu   string
}

// FindVM finds the node's files in dir (or $NRI_GPU_VM when empty) and
// qemu and mkfs.ext4 on the host, and says which are missing.
func FindVM(dir string) (VMImage, error) {
	dir, err := dirOf(dir, VMEnv, "VM", "make e2e-tools builds it with hack/vm-root.sh")
	if err != nil {
		return VMImage{}, err
	}
	img := VMImage{Root: filepath.Join(dir, "root.img"), Kernel: filepath.Join(dir, "vmlinuz"), Initrd: filepath.Join(dir, "initrd.img")}
	errs := missing(img.Root, img.Kernel, img.Initrd)
	if b, err := os.ReadFile(filepath.Join(dir, "SOURCE")); err == nil {
		img.Source = strings.Join(strings.Fields(string(b)), " ")
	}
	if img.qemu, err = exec.LookPath("qemu-system-x86_64"); err != nil {
		errs = append(errs, fmt.Errorf("qemu-system-x86_64 (Debian's qemu-system-x86): %w", err))
	}
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		errs = append(errs, err)
	}
	return img, errors.Join(errs...)
}

// VMExit is the last line the node's service prints: the payload's exit
// status follows it.
const VMExit = "NRI-GPU-VM-EXIT "

// VMRun is what a boot of the node printed on its serial console and how
// its payload ended.
type VMRun struct {
	// Console is everything the serial console printed: the kernel's and
	// systemd's lines, then the payload's output.
	Console string
	// Status is the payload's exit status; -1 when the node did not say.
	Status int
}

// Boot boots the node with payload (a directory, as the disk the node's
// service mounts at /payload, read-only) until it powers off or timeout
// passes. The root disk is copy-on-write (nothing the node writes
// reaches the image); the node has no network device; its disks and
// console file are made in dir.
func (img VMImage) Boot(dir, payload string, timeout time.Duration) (VMRun, error) {
	run := VMRun{Status: -1}
	disk := filepath.Join(dir, "payload.img")
	if err := ext4Image(payload, disk); err != nil {
		return run, err
	}
	console := filepath.Join(dir, "console.log")
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, img.qemu,
		"-accel", "tcg", "-smp", "2", "-m", "6144",
		"-display", "none", "-monitor", "none", "-no-reboot", "-nic", "none",
		"-serial", "file:"+console,
		"-kernel", img.Kernel, "-initrd", img.Initrd,
		"-append", "root=/dev/vda rw console=ttyS0 systemd.unified_cgroup_hierarchy=1 quiet",
		"-drive", "file="+img.Root+",if=virtio,format=raw,snapshot=on",
		"-drive", "file="+disk+",if=virtio,format=raw,readonly=on")
	// qemu keeps the root's copy-on-write layer in TMPDIR: the run's own.
	cmd.Env = append(os.Environ(), "TMPDIR="+dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	b, _ := os.ReadFile(console)
	run.Console = string(b)
	if i := strings.LastIndex(run.Console, VMExit); i >= 0 {
		line, _, _ := strings.Cut(run.Console[i+len(VMExit):], "\n")
		if n, err := strconv.Atoi(strings.TrimSpace(line)); err == nil {
			run.Status = n
		}
	}
	switch {
	case ctx.Err() != nil:
		return run, fmt.Errorf("the node did not power off within %s", timeout)
	case err != nil:
		return run, fmt.Errorf("qemu: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return run, nil
}

// ext4Image makes an ext4 disk image of a directory's files, with room
// to spare (mkfs.ext4 -d: no mount needed).
func ext4Image(src, img string) error {
	var size int64
	err := filepath.WalkDir(src, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if info, err := d.Info(); err == nil && info.Mode().IsRegular() {
			size += info.Size()
		}
		return nil
	})
	if err != nil {
		return err
	}
	mib := size/(1<<20)*5/4 + 64
	if out, err := exec.Command("mkfs.ext4", "-q", "-d", src, img, strconv.FormatInt(mib, 10)+"M").CombinedOutput(); err != nil {
		return fmt.Errorf("mkfs.ext4 -d %s: %w: %s", src, err, out)
	}
	return nil
}
