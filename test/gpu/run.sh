#!/usr/bin/env bash
# Checks nri-gpu's spec generation on a real NVIDIA host. Run it in a root
# shell on a node with the NVIDIA driver (no Container Toolkit needed):
#
#   make e2e-tools && test/gpu/run.sh
#
# It generates the spec of the node's GPUs with NVML, has the CDI library
# load it (nri-gpu devices, which also prints each GPU's health and, with
# more than one GPU, the topology matrix count requests score), checks
# that every device node and file the
# spec names exists, then (TestRealGPU in test/gpu) runs nri-gpu on a
# throwaway containerd and gives GPU 0 to a container that loads
# libcuda.so.1, calls cuInit and cuDeviceGetCount, and runs nvidia-smi -L,
# once with the spec's hooks and once hook-free (hookFree: true) on
# containerd 2.3.7 whose NRI validator refuses every hook a plugin adds;
# and (TestRealGPUAttributes) checks that the DRA driver's devices carry
# NVML's product, architecture, versions, memory and the PCIe root; and
# (TestRealMPS) shares GPU 0 two ways with MPS, nri-gpu running the
# driver's nvidia-cuda-mps-control, and runs a small CUDA program in two
# pods at once: the one allocating past its 2 GiB limit fails there, the
# other keeps running; the clients' pipe directory is read-only, and what
# a client does when its control socket is a tenant's listener instead of
# the daemon is measured (the line starting MEASURED); and
# (TestRealMemoryBounds) shares GPU 0 two ways by time-slicing with 4 GiB
# counted: the driver bounds each pod to its 2 GiB (nri-gpu sets the
# per-cgroup limit at the container's start), a pod allocating 1.5 GiB
# succeeds and one asking 3 GiB fails near 2 GiB (where the node cannot
# bound GPU memory, it checks nri-gpu refuses the pod and says why).
# It writes nothing outside temp dirs, and exits non-zero with the reason
# on any miss.
set -euo pipefail

bin=${NRI_GPU:-$(cd "$(dirname "$0")/../.." && pwd)/_output/bin/nri-gpu}
[ -x "$bin" ] || { echo "run.sh: $bin missing; run make build first" >&2; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
spec=$out/nvidia.com-gpu.yaml

echo "== nri-gpu generate"
"$bin" generate --output "$spec" ${DRIVER_ROOT:+--driver-root "$DRIVER_ROOT"}
echo "== spec ($(grep -c '^- ' "$spec" || true) top-level entries)"
cat "$spec"

echo "== nri-gpu devices"
devices=$("$bin" devices --cdi-spec-dirs "$out" ${DRIVER_ROOT:+--driver-root "$DRIVER_ROOT"})
echo "$devices"
grep -q "HEALTH" <<<"$devices" || { echo "run.sh: nri-gpu devices printed no health of the GPUs" >&2; exit 1; }
if grep -q "not used" <<<"$devices"; then
	echo "FAIL: the CDI library did not load the generated spec" >&2
	exit 1
fi
if grep -q "none (run nri-gpu generate)" <<<"$devices"; then
	echo "FAIL: a GPU NVML reports has no CDI device in the generated spec" >&2
	exit 1
fi

echo "== every host path the spec names exists"
missing=0
while read -r path; do
	if [ -e "$path" ]; then
		echo "ok       $path"
	else
		echo "MISSING  $path"
		missing=1
	fi
done < <(sed -n 's/^ *hostPath: *//p' "$spec" | sort -u)
[ "$missing" -eq 0 ] || { echo "FAIL: the spec names host paths that do not exist" >&2; exit 1; }

echo "== a container given GPU 0: CUDA loads, nvidia-smi -L, with hooks and hook-free; the DRA driver's attributes from NVML (TestRealGPUAttributes); two pods on GPU 0 under MPS (TestRealMPS); two time-sliced pods bounded by the driver (TestRealMemoryBounds)"
cd "$(dirname "$0")/../.."
NRI_GPU_REAL=1 NRI_GPU_TOOLS="$(dirname "$bin")" NRI_GPU_CONTAINERD2="${NRI_GPU_CONTAINERD2:-$(dirname "$bin")/../containerd-2.3.7}" go test -count=1 -v -run "TestRealGPU|TestRealMPS|TestRealMemoryBounds" ./test/gpu/
echo "PASS"
