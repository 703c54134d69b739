#!/usr/bin/env bash
# Builds the VM test bed's initramfs: a cached base archive (kernel modules,
# busybox, dash/bash, iproute2, ipset, iptables, ipvsadm, nft with their shared
# libraries, /init) followed by a small archive of extra binaries given as
# arguments (static Go binaries: vmexec, e2ehelper, the vsplane agent...).
# The kernel unpacks concatenated cpio archives in order, so only the small
# second part is rebuilt when a Go binary changes. Both are uncompressed.
#
#   build-initramfs.sh [-o OUT] [BINARY...]   each BINARY lands in /usr/local/bin/
#
# Prints OUT (default .cache/vm/initramfs.img) on stdout. Needs scripts/vm/deps.sh.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CACHE="${VSPLANE_VM_CACHE:-$ROOT/.cache/vm}"
OUT="$CACHE/initramfs.img"
while getopts "o:" opt; do
  case "$opt" in
    o) OUT="$OPTARG" ;;
    *) echo "usage: $0 [-o OUT] [BINARY...]" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))

die() { echo "build-initramfs.sh: $*" >&2; exit 1; }

KDIR="$(readlink -f "$CACHE/kernel" 2>/dev/null || true)"
[ -n "$KDIR" ] && [ -f "$KDIR/.done" ] || die "no kernel in $CACHE/kernel: run scripts/vm/deps.sh"
KVER="$(basename "$KDIR")"; KVER="${KVER#kernel-}"
KMOD="$KDIR/lib/modules/$KVER"
[ -d "$KMOD" ] || die "no modules at $KMOD: run scripts/vm/deps.sh"
for t in busybox dash bash cpio depmod ip ipset ipvsadm nft xtables-legacy-multi xtables-nft-multi; do
  command -v "$t" >/dev/null || die "missing $t on the host: run scripts/vm/deps.sh"
done
for b in "$@"; do
  [ -f "$b" ] && [ -x "$b" ] || die "extra binary $b is not an executable file"
done

# Host programs copied into the guest (with the libraries ldd names).
PROGS=(
  /usr/sbin/ip /usr/sbin/bridge /usr/bin/ss
  /usr/sbin/ipset /usr/sbin/ipvsadm /usr/sbin/nft
  /usr/sbin/xtables-legacy-multi /usr/sbin/xtables-nft-multi
  /usr/bin/dash /usr/bin/bash
)
XTLIB=/usr/lib/x86_64-linux-gnu/xtables
ETC=(/etc/protocols /etc/services /etc/ethertypes /etc/iproute2)

# Kernel modules: whole directories plus single modules; their dependencies
# are added from modules.dep.
MOD_DIRS=(
  kernel/net/netfilter kernel/net/ipv4/netfilter kernel/net/ipv6/netfilter
  kernel/net/bridge kernel/net/sctp kernel/crypto
)
MOD_ONE=(
  drivers/net/dummy drivers/net/veth drivers/net/virtio_net drivers/virtio/virtio_pci
  lib/libcrc32c arch/x86/crypto/crc32c-intel net/ipv4/inet_diag net/ipv4/tcp_diag
  net/ipv4/udp_diag net/ipv4/raw_diag net/core/failover drivers/net/net_failover
  drivers/block/virtio_blk fs/ext4/ext4 fs/overlayfs/overlay
  drivers/char/hw_random/virtio-rng
)
# Loaded by /init at boot (what the bed itself uses). Everything else loads on
# demand through /sbin/modprobe: IPVS schedulers, ipset types, xt matches and
# targets, iptables tables, nf_tables. Each module costs ~0.1-0.5 s under TCG.
# /init loads dummy itself, with numdummies=0 (no stray dummy0).
# nfnetlink and ip_set too: agents of several nodes starting at once raced
# each other's on-demand load of nfnetlink (EPROTONOSUPPORT on the socket).
# virtio_rng: the host's entropy seeds the guest's CRNG at once; without it
# getrandom() blocked until ~4 s of uptime under TCG, and the first TLS
# handshake of an agent started before that waited ~1 s for it.
BOOT_MODULES=(
  virtio_pci virtio_rng virtio_net veth bridge ip_vs ip_vs_rr
  nf_conntrack iptable_filter iptable_nat xt_MASQUERADE xt_conntrack
  nfnetlink ip_set
)

# The base archive is keyed by this script, the kernel and the host packages it copies.
pkgver="$(dpkg-query -W -f '${Package}=${Version}\n' busybox-static dash bash iproute2 ipset \
  iptables ipvsadm nftables libc6 2>/dev/null || true)"
key="$( { cat "${BASH_SOURCE[0]}" "$ROOT/scripts/vm/init"; echo "$KVER"; echo "$pkgver"; } | sha256sum | cut -c1-16)"
BASE="$CACHE/base-$KVER-$key.cpio"

build_base() {
  local stage; stage="$(mktemp -d "$CACHE/stage.XXXXXX")"
  # shellcheck disable=SC2064
  trap "rm -rf '$stage'" RETURN
  cd "$stage"
  # Merged /usr, like the host, so ldd's paths resolve as they do there.
  mkdir -p usr/bin usr/sbin usr/lib usr/lib64 usr/local/bin etc proc sys dev run tmp root var
  ln -s usr/bin bin; ln -s usr/sbin sbin; ln -s usr/lib lib; ln -s usr/lib64 lib64
  ln -s ../run var/run

  # Programs, their libraries, xtables plugins (dlopen'ed, so ldd does not see them).
  local f lib libs=()
  for f in "${PROGS[@]}"; do
    [ -e "$f" ] || die "missing $f on the host: run scripts/vm/deps.sh"
    cp -L "$f" ".$f"
  done
  mkdir -p ".$XTLIB"
  cp -a "$XTLIB"/. ".$XTLIB"/
  for f in "${PROGS[@]}" "$XTLIB"/*.so; do
    while read -r lib; do libs+=("$lib"); done < <(ldd "$f" 2>/dev/null | grep -o '/[^ ]*' || true)
  done
  for lib in $(printf '%s\n' "${libs[@]}" | sort -u); do
    mkdir -p ".$(dirname "$lib")"
    cp -L "$lib" ".$lib"
  done
  local n
  for n in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
    ln -s xtables-legacy-multi "usr/sbin/$n"
    ln -s xtables-legacy-multi "usr/sbin/${n/tables/tables-legacy}"
    ln -s xtables-nft-multi "usr/sbin/${n/tables/tables-nft}"
  done
  for f in "${ETC[@]}"; do [ -e "$f" ] && cp -rL "$f" etc/; done
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' > etc/passwd
  printf 'root:x:0:\nnogroup:x:65534:\n' > etc/group
  printf '127.0.0.1 localhost\n198.19.255.2 host\n198.19.255.100 hostlo\n' > etc/hosts
  echo vsplane-vm > etc/hostname

  # busybox: an applet link for every name no real program above already has
# (on PATH the real ip wins; in busybox sh the applet does).
  # The kernel runs /sbin/modprobe to load modules on demand (ipset types, xt matches).
  # /bin/sh is busybox's ash: static, so it starts ~6x faster than dash under
  # TCG. It runs its own applets before searching PATH, so scripts must name
  # /usr/sbin/ip by full path (busybox's ip lacks netns, veth peers...).
  cp -L "$(command -v busybox)" usr/bin/busybox
  ln -s busybox usr/bin/sh
  for n in $(usr/bin/busybox --list); do
    [ -e "usr/bin/$n" ] || [ -e "usr/sbin/$n" ] || [ -L "usr/sbin/$n" ] || ln -s busybox "usr/bin/$n"
  done
  [ -e usr/sbin/modprobe ] || ln -s ../bin/busybox usr/sbin/modprobe

  # Kernel modules.
  [ -f "$KMOD/modules.dep" ] || die "no $KMOD/modules.dep: run scripts/vm/deps.sh"
  local mods=() d m
  for d in "${MOD_DIRS[@]}"; do
    while read -r m; do mods+=("${m#"$KMOD"/}"); done < <(find "$KMOD/$d" -name '*.ko*' 2>/dev/null)
  done
  for m in "${MOD_ONE[@]}"; do
    for f in "$KMOD/kernel/$m".ko*; do [ -e "$f" ] && mods+=("kernel/$m${f#"$KMOD/kernel/$m"}"); done
  done
  # modules.dep lines hold each module's full dependency list.
  local all
  all="$(printf '%s\n' "${mods[@]}" | awk -v dep="$KMOD/modules.dep" '
    BEGIN { while ((getline l < dep) > 0) { split(l, p, ":"); deps[p[1]] = p[2] } }
    { print $1; n = split(deps[$1], ds, " "); for (i = 1; i <= n; i++) print ds[i] }' | sort -u)"
  local mdir="usr/lib/modules/$KVER"
  mkdir -p "$mdir"
  for m in $all; do
    mkdir -p "$mdir/$(dirname "$m")"
    cp "$KMOD/$m" "$mdir/$m"
  done
  cp "$KMOD"/modules.builtin "$KMOD"/modules.builtin.modinfo "$KMOD"/modules.order "$mdir"/
  depmod -b "$stage" "$KVER"
  printf '%s\n' "${BOOT_MODULES[@]}" > etc/vsplane-modules

  cp "$ROOT/scripts/vm/init" init
  chmod 755 init
  # The kernel opens /dev/console before /init runs.
  mknod -m 600 dev/console c 5 1 2>/dev/null || true

  # Uncompressed: decompressing in the guest under TCG costs more than copying.
  find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet > "$BASE.tmp.$$"
  mv "$BASE.tmp.$$" "$BASE"
  cd - >/dev/null
  # Bases of older scripts or kernels are dead weight (27 MB each).
  find "$CACHE" -maxdepth 1 -name 'base-*.cpio' ! -name "$(basename "$BASE")" -mmin +10 -delete
}

if [ ! -f "$BASE" ]; then
  echo "build-initramfs.sh: building base archive $(basename "$BASE")" >&2
  build_base
fi

# Extra binaries: a second archive appended to a copy of the base.
mkdir -p "$(dirname "$OUT")"
extra="$(mktemp -d "$CACHE/extra.XXXXXX")"
trap 'rm -rf "$extra"' EXIT
mkdir -p "$extra/usr/local/bin"
for b in "$@"; do cp -L "$b" "$extra/usr/local/bin/$(basename "$b")"; done
cat "$BASE" > "$OUT.tmp.$$"
(cd "$extra" && find usr | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet) >> "$OUT.tmp.$$"
mv "$OUT.tmp.$$" "$OUT"
echo "$OUT"
