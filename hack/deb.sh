#!/usr/bin/env bash
# Extracts a Debian package, downloaded from the machine's own Debian
# sources, into DIR, with apt's state kept in a temp dir: the machine's
# package lists, architectures and installed packages are not touched,
# and nothing of the package runs (no maintainer script, no service).
#
#   hack/deb.sh PACKAGE ARCH DIR    (DIR/usr/..., DIR/SOURCE: its name and version)
set -euo pipefail

pkg=$1 arch=$2 dir=$3
if ! command -v apt-get >/dev/null 2>&1 || ! command -v dpkg-deb >/dev/null 2>&1; then
	echo "deb.sh: apt-get and dpkg-deb (Debian/Ubuntu) fetch Debian's $pkg" >&2
	exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$work/deb"
chmod -R a+rwx "$work" # apt downloads as its own user
apt=(apt-get -qq -o APT::Architecture="$arch" -o APT::Architectures="$arch"
	-o Dir::State::Lists="$work/lists" -o Dir::Cache="$work/cache" -o Dir::State::status=/dev/null)
# One suite's list failing (a mirror mid-sync) leaves the others: the
# package is in the release's own suite too.
"${apt[@]}" update || echo "deb.sh: some package lists did not come; using those that did" >&2
(cd "$work/deb" && "${apt[@]}" download "$pkg")
deb=$(ls "$work"/deb/"$pkg"_*.deb)
mkdir -p "$dir"
dpkg-deb -x "$deb" "$dir"
dpkg-deb -f "$deb" Package Version Architecture > "$dir/SOURCE"
echo "deb.sh: $(tr '\n' ' ' < "$dir/SOURCE")"
