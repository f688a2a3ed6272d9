package harness

import (
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// devScript makes a mount namespace whose /dev is the host's with the
// device nodes of $2 added, and keeps it: an overlay over the host's /dev
// (the host's own is untouched), its sub-mounts bound again over it. $1
// is a directory of the namespace's own; it says it is ready by creating
// $1/ready.
const devScript = `set -e
d=$1
mkdir -p "$d/host" "$d/upper" "$d/work"
mount --rbind /dev "$d/host"
mount -t overlay overlay -o "lowerdir=/dev,upperdir=$d/upper,workdir=$d/work" /dev
for m in pts shm mqueue hugepages; do
	if mountpoint -q "$d/host/$m"; then mount --rbind "$d/host/$m" "/dev/$m"; fi
done
cp -a "$2/." /dev/
touch "$d/ready"
exec sleep 2147483647
`

// DevNamespace starts a process holding a mount namespace in which /dev
// holds the device nodes of devDir besides the host's, as on a node whose
// driver made them, for runtimes that take a device from the host's /dev
// at its path in the container rather than from the spec's host path
// (gVisor's runsc). It returns the prefix that runs a program there
// (Options.Prefix) and the function that ends the namespace, once
// whatever runs in it has stopped. dir is the namespace's own directory.
func DevNamespace(dir, devDir string) (prefix []string, stop func(), err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, nil, err
	}
	holder, err := startProcess("/dev namespace", filepath.Join(dir, "namespace.log"),
		"unshare", "--mount", "--propagation", "slave", "sh", "-c", devScript, "sh", dir, devDir)
	if err != nil {
		return nil, nil, err
	}
	stop = func() { holder.Stop(5 * time.Second) }
	if err := holder.waitFor("the /dev namespace", 10*time.Second, func() error {
		_, err := os.Stat(filepath.Join(dir, "ready"))
		return err
	}); err != nil {
		stop()
		return nil, nil, err
	}
	return enterMountNS(holder.Pid()), stop, nil
}

// enterMountNS is the command prefix that runs a program in the mount
// namespace of process pid.
func enterMountNS(pid int) []string {
	return []string{"nsenter", "--mount=/proc/" + strconv.Itoa(pid) + "/ns/mnt", "--"}
}
