#!/usr/bin/env bash
# Builds, into DIR, the runc a containerd release is tested with: the
# version its Go module names in script/setup/runc-version, from runc's
# own module, with seccomp (libseccomp-dev, as containerd's CI builds it).
#
#   hack/runc.sh MODULE@VERSION DIR
#
# e.g. hack/runc.sh github.com/containerd/containerd/v2@v2.3.7 _output/containerd-2.3.7
set -euo pipefail

mod=$1 dir=$2
GO=${GO:-go}
src=$("$GO" mod download -json "$mod" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
if [ -z "$src" ] || [ ! -f "$src/script/setup/runc-version" ]; then
	echo "runc.sh: $mod has no script/setup/runc-version" >&2
	exit 1
fi
version=$(tr -d '[:space:]' < "$src/script/setup/runc-version")
mkdir -p "$dir"
echo "runc.sh: runc $version for $mod"
GOBIN=$(cd "$dir" && pwd) CGO_ENABLED=1 "$GO" install -tags seccomp \
	-ldflags "-X main.version=${version#v}" "github.com/opencontainers/runc@$version"
