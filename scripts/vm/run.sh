#!/usr/bin/env bash
# Boots the test-bed VM interactively, its serial console on this terminal:
# press Enter for a root shell (busybox sh; iproute2 is /usr/sbin/ip),
# Ctrl-A X quits QEMU. Arguments: extra static binaries for /usr/local/bin.
# Tests use the Go package e2e/vm instead; its kernel arguments are the same.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CACHE="${VSPLANE_VM_CACHE:-$ROOT/.cache/vm}"
"$ROOT/scripts/vm/deps.sh" >/dev/null
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
(cd "$ROOT" && CGO_ENABLED=0 go build -trimpath -o "$tmp/" ./e2e/cmd/vmexec ./e2e/cmd/e2ehelper)
"$ROOT/scripts/vm/build-initramfs.sh" -o "$tmp/initramfs.img" "$tmp/vmexec" "$tmp/e2ehelper" "$@" >/dev/null
qemu-system-x86_64 -accel tcg -m 1024 -smp 2 -nodefaults -display none -no-reboot \
  -serial mon:stdio -kernel "$CACHE/kernel/vmlinux" -initrd "$tmp/initramfs.img" \
  -append "console=ttyS0 panic=-1 quiet cryptomgr.notests mitigations=off" \
  -nic "user,model=virtio-net-pci,restrict=on,net=198.19.255.0/24,host=198.19.255.2" \
  -object rng-random,filename=/dev/urandom,id=rng0 -device virtio-rng-pci,rng=rng0
