#!/usr/bin/env bash
# Builds the root of the cgroup v2 test node (test/vm): a Debian root made
# by debootstrap from the machine's own Debian sources (no image
# downloaded), with systemd as PID 1 on the unified cgroup hierarchy,
# Debian's cloud kernel and the initramfs installing it generates. Writes
#
#   DIR/root.img     the root as a raw ext4 disk (mkfs.ext4 -d: no mount)
#   DIR/vmlinuz      the kernel, DIR/initrd.img its initramfs
#   DIR/SOURCE       the suite, the kernel's package and version
#
# The root's one service of its own, nri-gpu-vm.service, mounts the second
# disk (the test's payload, /dev/vdb) at /payload, runs /payload/run with
# its output on the serial console, and powers the VM off.
#
#   hack/vm-root.sh DIR
set -euo pipefail

dir=$1
for tool in debootstrap mkfs.ext4; do
	command -v "$tool" >/dev/null 2>&1 || { echo "vm-root.sh: $tool missing (make deps installs it)" >&2; exit 1; }
done
if [ "$(id -u)" -ne 0 ]; then
	echo "vm-root.sh: debootstrap needs root" >&2
	exit 1
fi

# The suite this machine runs and the first mirror its apt sources name
# for it (deb822 .sources files or sources.list).
. /etc/os-release
suite=${VERSION_CODENAME:?no VERSION_CODENAME in /etc/os-release}
mirror=$(awk -v s="$suite" '
	/^URIs:/ { uri = $2 }
	/^Suites:/ { for (i = 2; i <= NF; i++) if ($i == s && uri != "") { print uri; exit } }
	/^deb / && $3 == s { print $2; exit }
' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null | head -n 1)
if [ -z "$mirror" ]; then
	echo "vm-root.sh: no apt source names suite $suite" >&2
	exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root=$work/root
# systemd and dbus (runc's systemd cgroup driver asks systemd over D-Bus),
# the kernel, and what containers need of the node: libseccomp (runc),
# iproute2 and kmod, a static busybox (the harness builds its image from
# it), and CRI-O's container monitor and image copier (conmon, skopeo, and
# the CNI plugins skopeo's containers-common asks as its network stack).
debootstrap --variant=minbase \
	--include=systemd,systemd-sysv,dbus,linux-image-cloud-amd64,iproute2,kmod,udev,libseccomp2,busybox-static,conmon,skopeo,containernetworking-plugins \
	"$suite" "$root" "$mirror" >"$work/debootstrap.log" 2>&1 || { tail -n 30 "$work/debootstrap.log" >&2; exit 1; }

# What a minbase root lacks and the node needs: /etc/hosts (CRI's sandbox
# setup reads it), a host name, an fstab for the root.
printf '127.0.0.1 localhost\n::1 localhost\n' >"$root/etc/hosts"
echo nri-gpu-vm >"$root/etc/hostname"
echo '/dev/vda / ext4 rw 0 1' >"$root/etc/fstab"
# CRI-O resolves a short image name (the chart's nri-gpu:latest) to the
# images the tests put in its store, under localhost/, and pulls nothing.
mkdir -p "$root/etc/containers"
printf 'unqualified-search-registries = ["localhost"]\nshort-name-mode = "permissive"\n' >"$root/etc/containers/registries.conf"
# No login on the console: the test's output owns it.
ln -sf /dev/null "$root/etc/systemd/system/serial-getty@ttyS0.service"
ln -sf /dev/null "$root/etc/systemd/system/getty@tty1.service"

cat >"$root/usr/local/sbin/nri-gpu-vm" <<'EOF'
#!/bin/sh
# Runs the test payload (/dev/vdb), its output on the serial console, and
# powers off; the last line says how it ended.
mkdir -p /payload
if mount -o ro /dev/vdb /payload && [ -x /payload/run ]; then
	/payload/run >/dev/ttyS0 2>&1
	rc=$?
else
	echo "nri-gpu-vm: no payload on /dev/vdb" >/dev/ttyS0
	rc=125
fi
echo "NRI-GPU-VM-EXIT $rc" >/dev/ttyS0
systemctl poweroff --no-block
EOF
chmod 0755 "$root/usr/local/sbin/nri-gpu-vm"
cat >"$root/etc/systemd/system/nri-gpu-vm.service" <<'EOF'
[Unit]
Description=nri-gpu's test payload
After=multi-user.target dbus.service
Wants=dbus.service

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/nri-gpu-vm
StandardOutput=tty
TTYPath=/dev/ttyS0

[Install]
WantedBy=multi-user.target
EOF
ln -sf /etc/systemd/system/nri-gpu-vm.service "$root/etc/systemd/system/multi-user.target.wants/nri-gpu-vm.service"

kernel=$(ls "$root"/boot/vmlinuz-* | head -n 1)
version=${kernel##*/vmlinuz-}
mkdir -p "$dir"
cp "$kernel" "$dir/vmlinuz"
cp "$root/boot/initrd.img-$version" "$dir/initrd.img"
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
# The root with room for the containers' images and state.
rm -f "$dir/root.img"
mkfs.ext4 -q -L nri-gpu-vm -d "$root" "$dir/root.img" 3G
{
	echo "suite $suite"
	echo "kernel linux-image-cloud-amd64 $version"
	chroot "$root" dpkg-query -W -f='${Package} ${Version}\n' systemd
} >"$dir/SOURCE"
echo "vm-root.sh: $(tr '\n' ' ' <"$dir/SOURCE")"
