#!/usr/bin/env bash
# Puts, into DIR, a glibc dynamic loader whose system directories are
# /lib64 and /usr/lib64 first, as RHEL's, Fedora's, SUSE's and Amazon
# Linux's are (glibc built with slibdir /lib64), with its libc: Debian's
# libc6-amd64, the 64-bit glibc of Debian's i386 architecture, downloaded
# from the machine's own Debian sources with apt's state kept in DIR (the
# machine's architectures and package lists are not touched). The
# hook-free end-to-end test runs it as the image's loader of a RHEL-like
# root.
#
#   hack/glibc-lib64.sh DIR    (DIR/ld.so, DIR/libc.so.6, DIR/SOURCE)
set -euo pipefail

dir=$1
if ! command -v apt-get >/dev/null 2>&1 || ! command -v dpkg-deb >/dev/null 2>&1; then
	echo "glibc-lib64.sh: apt-get and dpkg-deb (Debian/Ubuntu) fetch Debian's libc6-amd64" >&2
	exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$work/deb"
chmod -R a+rwx "$work" # apt downloads as its own user
apt=(apt-get -qq -o APT::Architecture=i386 -o APT::Architectures=i386
	-o Dir::State::Lists="$work/lists" -o Dir::Cache="$work/cache" -o Dir::State::status=/dev/null)
# One suite's list failing (a mirror mid-sync) leaves the others: the
# package is in the release's own suite too.
"${apt[@]}" update || echo "glibc-lib64.sh: some package lists did not come; using those that did" >&2
(cd "$work/deb" && "${apt[@]}" download libc6-amd64)
deb=$(ls "$work"/deb/libc6-amd64_*.deb)
dpkg-deb -x "$deb" "$work/root"
mkdir -p "$dir"
install -m 0755 "$work/root/lib64/libc.so.6" "$dir/libc.so.6"
dpkg-deb -f "$deb" Package Version Architecture > "$dir/SOURCE"
install -m 0755 "$work/root/lib64/ld-linux-x86-64.so.2" "$dir/ld.so" # last: make's target
echo "glibc-lib64.sh: $(tr '\n' ' ' < "$dir/SOURCE")"
