#!/usr/bin/env bash
# The README's main job: real etcd + kube-apiserver, a vsplane control plane,
# a QEMU VM with two nodes running vsplane-agent, and a Service answered
# through IPVS. Ensures the dependencies (cached after the first run), then
# runs e2e/cmd/demo. DURATION=90s stops by itself; otherwise Ctrl-C.
# REAL_NODES=1: the real-node cluster instead (kubelets, containerd and Pods
# in the VM, vsplane deployed from its images and manifests, CoreDNS).
# Extra arguments go to the demo (e.g. -v, --requests 20).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

echo "==> dependencies: kube-apiserver + etcd, QEMU + kernel, grpcurl" >&2
bash scripts/kube/build.sh >/dev/null
bash scripts/vm/deps.sh >/dev/null
[[ -x bin/grpcurl ]] || make --no-print-directory tools >&2

args=()
if [[ -n "${REAL_NODES:-}" && "${REAL_NODES}" != 0 ]]; then
  echo "==> dependencies of real nodes: containerd, CNI plugins" >&2
  bash scripts/nodes/build.sh >/dev/null
  args+=(--real-nodes)
fi
if [[ -n "${DURATION:-}" ]]; then
  args+=(--duration "$DURATION")
fi
echo "==> building the demo" >&2
go build -o "$ROOT/bin/vsplane-demo" ./e2e/cmd/demo
# exec: SIGINT/SIGTERM reach the demo itself, which cleans up.
exec "$ROOT/bin/vsplane-demo" "${args[@]}" "$@"
