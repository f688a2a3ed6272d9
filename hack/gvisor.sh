#!/usr/bin/env bash
# Builds gVisor's runsc and containerd-shim-runsc-v1 into DIR from the
# module test/tools/gvisor (gVisor's own code, the version its go.mod
# names), for the end-to-end test of GPU pods in gVisor.
#
# One change to gVisor's code, made in a vendored copy under DIR: its shim
# makes itself all but unkillable by the OOM killer (oom_score_adj -999),
# which needs CAP_SYS_RESOURCE, and these machines' root has none, so the
# shim fails to start ("failed to set OOM Score on shim: permission
# denied"); the copy built here leaves the shim's score at 0. Nothing a
# container is given depends on it.
#
#   hack/gvisor.sh DIR    (DIR/runsc, DIR/containerd-shim-runsc-v1)
set -euo pipefail

dir=$(mkdir -p "$1" && cd "$1" && pwd)
src=$(cd "$(dirname "$0")/../test/tools/gvisor" && pwd)
work=$dir/src
rm -rf "$work" && mkdir -p "$work"
cp "$src/go.mod" "$src/go.sum" "$work/"
cd "$work"
"${GO:-go}" mod vendor
manager=vendor/gvisor.dev/gvisor/pkg/shim/v1/manager.go
grep -q 'oomScoreMax = -999' "$manager" || { echo "gvisor.sh: $manager no longer sets oomScoreMax = -999; look again" >&2; exit 1; }
sed -i 's/oomScoreMax = -999/oomScoreMax = 0/' "$manager"
CGO_ENABLED=0 "${GO:-go}" build -mod=vendor -o "$dir/runsc" gvisor.dev/gvisor/runsc
CGO_ENABLED=0 "${GO:-go}" build -mod=vendor -o "$dir/containerd-shim-runsc-v1" gvisor.dev/gvisor/shim # last: make's target
rm -rf "$work"
