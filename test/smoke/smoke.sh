#!/usr/bin/env bash
# Smoke test for a node where nri-gpu was just installed (containerd 1.7 or
# 2.x, NRI on, a GPU or the fake one). It runs a pod that asks for a device
# with crictl, shows with ctr the devices, env, mounts and hooks in the
# container's final spec and the device node inside the container, cleans
# up, and exits non-zero with the reason on any miss.
#
#   IMAGE=<an image already on the node, with sh and ls> test/smoke/smoke.sh
#
# Settings (environment):
#   IMAGE      image for the pod, present on the node: it is never pulled (required)
#   DEVICE     the gpus.nri-gpu.io request (default: 0)
#   NAMESPACE  the pod's namespace (default: default)
#   ADDRESS    containerd's socket (default: /run/containerd/containerd.sock)
#   CRICTL, CTR  the binaries (default: crictl, ctr on PATH)
set -euo pipefail

: "${IMAGE:?set IMAGE to an image present on the node (it is not pulled)}"
DEVICE=${DEVICE:-0}
NAMESPACE=${NAMESPACE:-default}
ADDRESS=${ADDRESS:-/run/containerd/containerd.sock}
CRICTL=${CRICTL:-crictl}
CTR=${CTR:-ctr}

crictl() { "$CRICTL" --runtime-endpoint "unix://$ADDRESS" --image-endpoint "unix://$ADDRESS" "$@"; }
ctr() { "$CTR" --address "$ADDRESS" -n k8s.io "$@"; }
fail() { echo "SMOKE FAIL: $*" >&2; exit 1; }

work=$(mktemp -d)
pod=""
cleanup() {
	[ -n "$pod" ] && crictl rmp --force "$pod" >/dev/null 2>&1 || true
	rm -rf "$work"
}
trap cleanup EXIT

name=nri-gpu-smoke-$$
cat > "$work/pod.json" <<JSON
{"metadata": {"name": "$name", "namespace": "$NAMESPACE", "uid": "$name", "attempt": 0},
 "annotations": {"gpus.nri-gpu.io": "$DEVICE"},
 "log_directory": "$work",
 "linux": {"security_context": {"namespace_options": {"network": 2}}}}
JSON
cat > "$work/ctr.json" <<JSON
{"metadata": {"name": "smoke"}, "image": {"image": "$IMAGE"},
 "command": ["sleep", "300"], "log_path": "smoke.log", "linux": {}}
JSON

echo "== pod $NAMESPACE/$name asks for gpus.nri-gpu.io: $DEVICE"
pod=$(crictl runp "$work/pod.json") || fail "crictl runp failed"
ctrid=$(crictl create --no-pull "$pod" "$work/ctr.json" "$work/pod.json" 2>"$work/create.err") ||
	fail "the container was not created: $(cat "$work/create.err")"
crictl start "$ctrid" >/dev/null || fail "crictl start failed"

echo "== the container's final spec (ctr -n k8s.io containers info)"
ctr containers info "$ctrid" > "$work/info.pretty" || fail "ctr containers info failed"
# One line, no layout whitespace, so that grep can pick objects out.
tr -d '\n' < "$work/info.pretty" | sed -E 's/[[:space:]]+("|\{|\}|\[|\])/\1/g; s/":[[:space:]]+/":/g' > "$work/info.json"
info=$work/info.json
show() { # show "title" grep-pattern: each match on a line
	echo "$1:"
	grep -o "$2" "$info" | sed 's/^/  /' || echo "  (none)"
}
show "devices" '{"path":"/dev/[^}]*}'
show "cgroup rules" '{"allow":true,"type":"[cb]","major":[0-9]*,"minor":[0-9]*,"access":"[a-z]*"}'
echo "env:"; grep -o '"env":\[[^]]*\]' "$info" | head -n 1 | grep -o '"[^"]*=[^"]*"' | sed 's/^/  /'
echo "host mounts (not containerd's own):"
grep -o '{"destination":"[^"]*",\("type":"[^"]*",\)\{0,1\}"source":"/[^"]*","options":\[[^]]*\]}' "$info" |
	grep -v '/io\.containerd\.' | sed 's/^/  /' || echo "  (none)"
show "hooks" '{"path":"[^"]*","args":\[[^]]*\][^}]*}'
grep -q '"path":"/dev/nvidia' "$info" || fail "no /dev/nvidia* device in the container's spec: is nri-gpu running and NRI on?"

echo "== inside the container (ctr -n k8s.io tasks exec)"
inside=$(ctr tasks exec --exec-id "smoke-$$" "$ctrid" sh -c 'ls -l /dev/nvidia*') || fail "no /dev/nvidia* node inside the container"
echo "$inside"
grep -q '^c' <<<"$inside" || fail "the /dev/nvidia* entries inside the container are not character devices"
echo "SMOKE OK"
