#!/usr/bin/env bash
# Installs the host packages the end-to-end tests and the demo need: runc
# (the demo's; the tests build the runc each containerd is tested with),
# libseccomp's headers and pkg-config (to build those with seccomp), a
# static busybox (for the test image), musl's compiler (a musl image's
# probe, for hook-free injection), and CRI-O's container monitor (conmon)
# and image copier (skopeo, which puts the test image in CRI-O's
# storage), and what makes and boots the cgroup v2 test node (debootstrap,
# qemu's x86 system emulator). Debian/Ubuntu only; does nothing
# when they are already there.
set -euo pipefail

missing=()
command -v runc >/dev/null 2>&1 || missing+=(runc)
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
dpkg -s libseccomp-dev >/dev/null 2>&1 || missing+=(libseccomp-dev)
dpkg -s busybox-static >/dev/null 2>&1 || missing+=(busybox-static)
command -v musl-gcc >/dev/null 2>&1 || missing+=(musl-tools)
command -v conmon >/dev/null 2>&1 || missing+=(conmon)
command -v skopeo >/dev/null 2>&1 || missing+=(skopeo)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
command -v qemu-system-x86_64 >/dev/null 2>&1 || missing+=(qemu-system-x86)
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
	echo "install-deps: ${missing[*]} missing; run as root (or install them) to continue" >&2
	exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
	echo "install-deps: ${missing[*]} missing and no apt-get here; install them by hand" >&2
	exit 1
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${missing[@]}" >/dev/null
