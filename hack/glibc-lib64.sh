#!/usr/bin/env bash
# Puts, into DIR, a glibc dynamic loader whose system directories are
# /lib64 and /usr/lib64 first, as RHEL's, Fedora's, SUSE's and Amazon
# Linux's are (glibc built with slibdir /lib64), with its libc: Debian's
# libc6-amd64, the 64-bit glibc of Debian's i386 architecture
# (hack/deb.sh). The hook-free end-to-end test runs it as the image's
# loader of a RHEL-like root.
#
#   hack/glibc-lib64.sh DIR    (DIR/ld.so, DIR/libc.so.6, DIR/SOURCE)
set -euo pipefail

dir=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$(dirname "$0")/deb.sh" libc6-amd64 i386 "$work"
mkdir -p "$dir"
install -m 0755 "$work/lib64/libc.so.6" "$dir/libc.so.6"
cp "$work/SOURCE" "$dir/SOURCE"
install -m 0755 "$work/lib64/ld-linux-x86-64.so.2" "$dir/ld.so" # last: make's target
