#!/usr/bin/env bash
# Builds kube-apiserver, etcd, kubectl, kube-proxy, for the real-node test
# bed (e2e/nodes) kube-controller-manager, kube-scheduler and kubelet, and
# with --e2e upstream's sig-network e2e.test and the Ginkgo CLI, from Go
# modules into
#   <repo>/.cache/kube/<k8s-version>-<etcd-version>/bin/
# Only Go and the Go module proxy are needed. Idempotent: when every binary
# already exists it prints the bin dir and exits at once; otherwise it builds only
# the missing ones.
#
# The three real-node binaries add (measured after the others, warm caches):
# kubelet 70 s, kube-controller-manager 34 s, kube-scheduler 9 s wall on 2
# cores, peak RSS 2.6 GB.
#
# Cold build: ~20 CPU-minutes (measured 1043s user + 179s sys), so roughly
# 10 min wall on 2 idle cores; peak RSS ~2.4 GB. Needs ~3 GB of GOCACHE.
# kube-proxy adds little on top, since it shares most packages with
# kube-apiserver and kubectl: measured 14s user + 4s sys, 43s wall (host load
# average 11), peak RSS 1.6 GB, for a 76 MB binary.
# The versions are pinned by the committed tools modules in
# scripts/kube/apiserver/go.mod and scripts/kube/etcd/go.mod.
#
# Output: the last line on stdout is the bin dir (for scripts: BIN=$(build.sh | tail -1)).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"

# Read a required module version from a tools go.mod, so the cache key can
# never drift from what is actually built.
modver() { # <go.mod> <module path>
	local v
	v="$(awk -v m="$2" '$1 == "require" && $2 == m { print $3 } $1 == m && $2 ~ /^v/ { print $2 }' "$1" | head -n1)"
	if [[ -z "$v" ]]; then
		echo "build.sh: cannot find version of $2 in $1" >&2
		exit 1
	fi
	echo "$v"
}

k8s_ver="$(modver "$here/apiserver/go.mod" k8s.io/kubernetes)"
etcd_ver="$(modver "$here/etcd/go.mod" go.etcd.io/etcd/server/v3)"
bin="$repo/.cache/kube/${k8s_ver}-${etcd_ver}/bin"

# --e2e adds upstream's sig-network e2e.test and the Ginkgo CLI (make
# conformance; about 15 more CPU-minutes cold, so not part of make test).
e2e=0
if [[ "${1:-}" == "--e2e" ]]; then
	e2e=1
elif [[ -n "${1:-}" ]]; then
	echo "build.sh: unknown argument $1 (want --e2e or nothing)" >&2
	exit 2
fi
all=(etcd kube-apiserver kubectl kube-proxy kube-controller-manager kube-scheduler kubelet)
[[ "$e2e" == 1 ]] && all+=(e2e.test ginkgo)
have=0
for b in "${all[@]}"; do [[ -x "$bin/$b" ]] && have=$((have + 1)); done
if [[ "$have" == "${#all[@]}" ]]; then
	echo "kube binaries already built" >&2
	echo "$bin"
	exit 0
fi

command -v go >/dev/null || { echo "build.sh: go not found in PATH" >&2; exit 1; }
mkdir -p "$bin"

# -mod=readonly: the committed go.sum must be complete; a build never edits it.
# Override any user GOFLAGS so the result does not depend on the environment.
export GOFLAGS="-mod=readonly -buildvcs=false"
export CGO_ENABLED=0

start_all=$SECONDS

build() { # <name> <module dir> <package> <extra ldflags>
	local name="$1" dir="$2" pkg="$3" ld="$4" t=$SECONDS
	if [[ -x "$bin/$name" ]]; then
		echo "== $name: present, skipped" >&2
		return
	fi
	echo "== building $name ($pkg) ..." >&2
	# Build into a temp name and rename, so an interrupted build never leaves
	# a half-written binary that the fast path would accept.
	(cd "$dir" && go build -trimpath -ldflags="-s -w $ld" -o "$bin/.$name.tmp" "$pkg")
	mv -f "$bin/.$name.tmp" "$bin/$name"
	echo "== $name: $((SECONDS - t))s, $(du -h "$bin/$name" | cut -f1)" >&2
}

# Without the version stamps the server reports v0.0.0-master; stamp the real
# release so clients and version-gated code see 1.37.x.
k8s_minor="$(echo "$k8s_ver" | cut -d. -f2)"
vpkg=k8s.io/component-base/version
build etcd "$here/etcd" go.etcd.io/etcd/server/v3 ""
build kube-apiserver "$here/apiserver" k8s.io/kubernetes/cmd/kube-apiserver \
	"-X $vpkg.gitVersion=$k8s_ver -X $vpkg.gitMajor=1 -X $vpkg.gitMinor=$k8s_minor -X $vpkg.gitTreeState=clean"
# kubectl for the demo's hints and the README's walkthroughs (about 1 more
# CPU-minute: it shares most packages with kube-apiserver).
build kubectl "$here/apiserver" k8s.io/kubernetes/cmd/kubectl \
	"-X $vpkg.gitVersion=$k8s_ver -X $vpkg.gitMajor=1 -X $vpkg.gitMinor=$k8s_minor -X $vpkg.gitTreeState=clean"
# kube-proxy (static, like the others) for the side-by-side benchmark and the
# parity test in the VM (e2e/vmbench, e2e/vmtests): the baseline vsplane replaces.
build kube-proxy "$here/apiserver" k8s.io/kubernetes/cmd/kube-proxy \
	"-X $vpkg.gitVersion=$k8s_ver -X $vpkg.gitMajor=1 -X $vpkg.gitMinor=$k8s_minor -X $vpkg.gitTreeState=clean"

# The real-node test bed (e2e/nodes): the controllers beside the apiserver and
# one kubelet per node in the VM, from the same pinned module.
for b in kube-controller-manager kube-scheduler kubelet; do
	build "$b" "$here/apiserver" "k8s.io/kubernetes/cmd/$b" \
		"-X $vpkg.gitVersion=$k8s_ver -X $vpkg.gitMajor=1 -X $vpkg.gitMinor=$k8s_minor -X $vpkg.gitTreeState=clean"
done

# With --e2e, Kubernetes' own sig-network e2e specs (e2e/conformance, make
# conformance): upstream's e2e.test trimmed to test/e2e/network
# (apiserver/e2enetwork), and the Ginkgo CLI that runs it in parallel
# processes. Measured cold: 749 s user + 155 s sys, peak RSS 2.2 GB.
if [[ "$e2e" == 0 ]]; then
	:
elif [[ -x "$bin/e2e.test" ]]; then
	echo "== e2e.test: present, skipped" >&2
else
	echo "== building e2e.test (k8s.io/kubernetes/test/e2e/network) ..." >&2
	t=$SECONDS
	(cd "$here/apiserver" && go test -c -trimpath -ldflags="-s -w -X $vpkg.gitVersion=$k8s_ver -X $vpkg.gitMajor=1 -X $vpkg.gitMinor=$k8s_minor -X $vpkg.gitTreeState=clean" \
		-o "$bin/.e2e.test.tmp" ./e2enetwork)
	mv -f "$bin/.e2e.test.tmp" "$bin/e2e.test"
	echo "== e2e.test: $((SECONDS - t))s, $(du -h "$bin/e2e.test" | cut -f1)" >&2
fi
[[ "$e2e" == 1 ]] && build ginkgo "$here/apiserver" github.com/onsi/ginkgo/v2/ginkgo ""

echo "== done in $((SECONDS - start_all))s" >&2
echo "$bin"
