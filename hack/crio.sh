#!/usr/bin/env bash
# Builds, into DIR, CRI-O's crio and pinns at VERSION from CRI-O's Go
# module (the proxy serves it by exact version only): crio with the tags
# that leave out the C libraries this machine lacks (gpgme, btrfs,
# devicemapper), pinns with the C compiler from the C sources the module
# carries. conmon and skopeo are Debian's (hack/install-deps.sh); the
# runc is the one built for containerd 2.x.
#
#   hack/crio.sh VERSION DIR
#
# e.g. hack/crio.sh v1.34.0 _output/crio-1.34.0
set -euo pipefail

version=$1 dir=$2
GO=${GO:-go}
mod=github.com/cri-o/cri-o@$version
src=$("$GO" mod download -json "$mod" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
if [ -z "$src" ] || [ ! -d "$src/pinns/src" ]; then
	echo "crio.sh: $mod has no pinns sources" >&2
	exit 1
fi
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
echo "crio.sh: crio and pinns $version (several minutes the first time)"
cc -std=c99 -O2 -static -o "$dir/pinns.tmp" "$src"/pinns/src/*.c
# Built in the module's own directory, as its main module (go install
# @version would ask the proxy for the module's version list, which it
# refuses).
(cd "$src" && "$GO" build -trimpath -o "$dir/crio.tmp" \
	-tags "containers_image_openpgp exclude_graphdriver_btrfs exclude_graphdriver_devicemapper" \
	./cmd/crio)
mv "$dir/pinns.tmp" "$dir/pinns"
mv "$dir/crio.tmp" "$dir/crio"
