#!/usr/bin/env bash
# Installs what the real-kernel VM test bed needs on the host and unpacks
# Debian's stock kernel (with its modules) into .cache/vm/kernel-<version>/
# without installing it into the host's /boot. Idempotent: a second run only
# checks and exits in well under a second.
#
# Prints the kernel directory on its last line of stdout.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CACHE="${VSPLANE_VM_CACHE:-$ROOT/.cache/vm}"
mkdir -p "$CACHE"

# Host tools: command -> Debian package.
declare -A NEED=(
  [qemu-system-x86_64]=qemu-system-x86
  [socat]=socat
  [ip]=iproute2
  [ipset]=ipset
  [iptables-legacy]=iptables
  [ipvsadm]=ipvsadm
  # kube-proxy's nftables mode in the side-by-side benchmark (e2e/vmbench).
  [nft]=nftables
  [cpio]=cpio
  [depmod]=kmod
  [dpkg-deb]=dpkg
  [xz]=xz-utils
  [dash]=dash
  # The real-node test bed (e2e/nodes): the OCI runtime its containerd runs
  # (copied with its libraries onto the node disk) and mkfs.ext4 for that disk.
  [runc]=runc
  [mkfs.ext4]=e2fsprogs
)
APT=(apt-get -y -q -o DPkg::Lock::Timeout=600 --no-install-recommends)

missing=()
for cmd in "${!NEED[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || [ -x "/usr/sbin/$cmd" ] || [ -x "/sbin/$cmd" ] || missing+=("${NEED[$cmd]}")
done
# busybox must be the static build: it is copied into the guest as is.
bb="$(command -v busybox || true)"
{ [ -n "$bb" ] && "$bb" --list 2>/dev/null | grep -qx modprobe && ! ldd "$bb" >/dev/null 2>&1; } ||
  missing+=(busybox-static)

updated=0
apt_update() {
  if [ "$updated" = 0 ]; then
    apt-get -q -o DPkg::Lock::Timeout=600 update >&2
    updated=1
  fi
}

if [ "${#missing[@]}" -gt 0 ]; then
  # shellcheck disable=SC2207
  pkgs=($(printf '%s\n' "${missing[@]}" | sort -u))
  echo "deps.sh: installing ${pkgs[*]}" >&2
  apt_update
  DEBIAN_FRONTEND=noninteractive "${APT[@]}" install "${pkgs[@]}" >&2
fi

# The kernel: the exact linux-image-<ver>-amd64 package that the
# linux-image-amd64 meta package points at.
find_kernel_pkg() {
  apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}'
}
# A kernel already unpacked is kept (reproducible runs, no apt look-up);
# VSPLANE_VM_REFRESH=1 resolves linux-image-amd64 again.
cached="$(readlink "$CACHE/kernel" 2>/dev/null || true)"
if [ -z "${VSPLANE_VM_REFRESH:-}" ] && [ -n "$cached" ] && [ -f "$CACHE/$cached/.done" ] &&
  [ -s "$CACHE/$cached/vmlinux" ] && [ -s "$CACHE/$cached/lib/modules/${cached#kernel-}/modules.dep" ]; then
  echo "$CACHE/$cached"
  exit 0
fi
kpkg="$(find_kernel_pkg || true)"
if [ -z "$kpkg" ]; then
  # No package lists yet (fresh machine): fetch them once.
  apt_update
  kpkg="$(find_kernel_pkg || true)"
fi
if [ -z "$kpkg" ]; then
  echo "deps.sh: cannot resolve linux-image-amd64 to a kernel package" >&2
  exit 1
fi
kver="${kpkg#linux-image-}"
kdir="$CACHE/kernel-$kver"

if [ ! -f "$kdir/.done" ]; then
  echo "deps.sh: fetching $kpkg into $kdir" >&2
  tmp="$(mktemp -d "$CACHE/dl.XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  chmod 755 "$tmp" # let apt's sandbox user write the download
  (cd "$tmp" && apt-get -q download "$kpkg" >&2) || {
    apt_update
    (cd "$tmp" && apt-get -q download "$kpkg" >&2)
  }
  rm -rf "$kdir"
  mkdir -p "$kdir"
  dpkg-deb -x "$tmp"/"$kpkg"_*.deb "$kdir"
  [ -f "$kdir/boot/vmlinuz-$kver" ] || { echo "deps.sh: no vmlinuz in $kpkg" >&2; exit 1; }
  [ -d "$kdir/lib/modules/$kver" ] || [ -d "$kdir/usr/lib/modules/$kver" ] || {
    echo "deps.sh: no modules in $kpkg" >&2; exit 1; }
  touch "$kdir/.done"
fi
# QEMU boots an uncompressed ELF vmlinux through its PVH entry point directly,
# skipping the BIOS and the in-guest xz decompression (many seconds under TCG).
if [ ! -s "$kdir/vmlinux" ]; then
  bz="$kdir/boot/vmlinuz-$kver"
  off="$(LC_ALL=C grep -m1 -obUaP '\xfd7zXZ\x00' "$bz" | cut -d: -f1)"
  [ -n "$off" ] || { echo "deps.sh: $bz is not xz-compressed; cannot extract vmlinux" >&2; exit 1; }
  # xz stops after the stream, so tail may die of SIGPIPE: judge by the result.
  (set +o pipefail; tail -c +"$((off + 1))" "$bz" | xz -dc --single-stream > "$kdir/vmlinux.tmp") || true
  [ "$(head -c 4 "$kdir/vmlinux.tmp" | od -An -c | tr -d ' ')" = '177ELF' ] ||
    { echo "deps.sh: extracting vmlinux from $bz failed" >&2; exit 1; }
  mv "$kdir/vmlinux.tmp" "$kdir/vmlinux"
fi
# modules.dep of the whole tree, once: build-initramfs.sh picks modules with it.
kmods="$kdir/lib/modules/$kver"
[ -s "$kmods/modules.dep" ] || depmod -b "$kdir" "$kver"
# A stable pointer for the other scripts and the Go package.
ln -sfn "kernel-$kver" "$CACHE/kernel"
echo "$kdir"
