#!/usr/bin/env bash
# Builds the real-node test bed's node software from Go modules into
#   <repo>/.cache/nodes/<containerd-version>-<cni-version>/bin/
#     containerd containerd-shim-runc-v2 ctr      (github.com/containerd/containerd/v2)
#     cni/{ptp,bridge,host-local,loopback,portmap} (github.com/containernetworking/plugins)
# All static (CGO_ENABLED=0: each exec under TCG costs less without a dynamic
# loader). The kubelet comes from scripts/kube/build.sh, the OCI runtime (crun)
# from Debian (scripts/vm/deps.sh). Idempotent: when every binary exists it
# prints the bin dir and exits at once.
#
# Cold build: about 1 min wall on 2 cores (containerd 50 s, the plugins 5 s).
# The versions are pinned by the tools modules scripts/nodes/containerd and
# scripts/nodes/cni. Output: the last line on stdout is the bin dir.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"

modver() { # <go.mod> <module path>
	local v
	v="$(awk -v m="$2" '$1 == "require" && $2 == m { print $3 } $1 == m && $2 ~ /^v/ { print $2 }' "$1" | head -n1)"
	if [[ -z "$v" ]]; then
		echo "nodes/build.sh: cannot find version of $2 in $1" >&2
		exit 1
	fi
	echo "$v"
}

ctrd_ver="$(modver "$here/containerd/go.mod" github.com/containerd/containerd/v2)"
cni_ver="$(modver "$here/cni/go.mod" github.com/containernetworking/plugins)"
bin="$repo/.cache/nodes/containerd-${ctrd_ver}-cni-${cni_ver}/bin"

ctrd_bins=(containerd containerd-shim-runc-v2 ctr)
cni_bins=(ptp bridge host-local loopback portmap)
complete() {
	local b
	for b in "${ctrd_bins[@]}"; do [[ -x "$bin/$b" ]] || return 1; done
	for b in "${cni_bins[@]}"; do [[ -x "$bin/cni/$b" ]] || return 1; done
}
if complete; then
	echo "node binaries already built" >&2
	echo "$bin"
	exit 0
fi

command -v go >/dev/null || { echo "nodes/build.sh: go not found in PATH" >&2; exit 1; }
mkdir -p "$bin/cni"
export GOFLAGS="-mod=readonly -buildvcs=false"
export CGO_ENABLED=0
t=$SECONDS

# Build into a temp dir and rename, so an interrupted build never leaves a
# half-written binary that the fast path would accept.
tmp="$(mktemp -d "$bin/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
echo "== building containerd $ctrd_ver ..." >&2
# no_btrfs etc.: snapshotters that need cgo headers; the bed uses overlayfs.
(cd "$here/containerd" && go build -trimpath -tags "no_btrfs no_devmapper no_zfs" -ldflags="-s -w" -o "$tmp/" \
	github.com/containerd/containerd/v2/cmd/containerd \
	github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
	github.com/containerd/containerd/v2/cmd/ctr)
echo "== building CNI plugins $cni_ver ..." >&2
mkdir -p "$tmp/cni"
(cd "$here/cni" && go build -trimpath -ldflags="-s -w" -o "$tmp/cni/" \
	github.com/containernetworking/plugins/plugins/main/ptp \
	github.com/containernetworking/plugins/plugins/main/bridge \
	github.com/containernetworking/plugins/plugins/main/loopback \
	github.com/containernetworking/plugins/plugins/ipam/host-local \
	github.com/containernetworking/plugins/plugins/meta/portmap)
for b in "${ctrd_bins[@]}"; do mv -f "$tmp/$b" "$bin/$b"; done
for b in "${cni_bins[@]}"; do mv -f "$tmp/cni/$b" "$bin/cni/$b"; done
echo "== done in $((SECONDS - t))s" >&2
echo "$bin"
