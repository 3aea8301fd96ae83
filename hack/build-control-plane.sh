#!/usr/bin/env bash
# Build the local e2e control plane from the Go module proxy:
#   kube-apiserver, kube-scheduler, kube-controller-manager,
#   kubelet, kube-proxy                                      (hack/kube/go.mod;
#                                   K8S_VERSION=v1.32.9: hack/kube-1.32/go.mod, see below)
#   etcd                                                     (hack/etcd/go.mod)
#   cdi-resolve                                              (hack/cdi/go.mod)
#   containerd, containerd-shim-runc-v2, ctr                 (hack/containerd/go.mod)
#   linux-arm64/containerd: the same containerd for linux/arm64 (GOARCH=arm64)
# The node components (kubelet, kube-proxy, containerd) serve the real-node e2e
# lane; hack/node-deps.sh installs the Debian packages that lane also needs.
# The lane's arm64 node runs linux-arm64/containerd through qemu-user binfmt:
# containerd's CRI image store only holds images of containerd's own platform,
# so an amd64 containerd cannot run arm64 images through the kubelet. Its shim
# (containerd-shim-runc-v2 from PATH), runc, kubelet and ctr stay amd64.
# One build-time change, made to a copy of the pinned containerd module in
# <bin>/.build.src (a `replace` in a copy of hack/containerd; removed after the build):
# qemu-user refuses prctl(PR_SET_SECCOMP), so containerd under qemu finds seccomp
# missing and rejects every pod sandbox (the kubelet always asks RuntimeDefault for
# it); the change makes it run such a sandbox without a seccomp profile instead.
#
# Binaries go to a cache directory OUTSIDE the repository, keyed by version:
#   ${CD_E2E_CACHE:-$HOME/.cache/compute-domain-e2e}/k8s-v<K8S>/bin/
# Each artifact has a stamp file (<bin>/.<name>.stamp) holding a hash of the
# module files it was built from; only missing/stale artifacts are rebuilt, so a
# warm run is a no-op taking well under a second.
#
# Usage:
#   hack/build-control-plane.sh                 # build what is missing; last stdout line = bin dir
#   hack/build-control-plane.sh --print-bin-dir # only print the bin dir (no build)
#   hack/build-control-plane.sh --check         # exit 0 iff everything is built and fresh
#   K8S_VERSION=v1.32.9 hack/build-control-plane.sh  # the same for another pinned release
#     (its own hack/kube-<minor>/ module and its own k8s-<version>/bin; etcd, cdi-resolve and
#     containerd are the same pins, rebuilt there from the warm Go build cache)
#
# Progress goes to stderr; stdout carries only the bin dir path.
# See docs/e2e-build.md for timings and disk usage.
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export GOTOOLCHAIN=local
export CGO_ENABLED=0
export GOFLAGS="${GOFLAGS:--mod=mod}"

log() { printf '[%s] build-control-plane: %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { printf 'build-control-plane: ERROR: %s\n' "$*" >&2; exit 1; }

mod_version() { # <go.mod> <module path>
  awk -v m="$2" '$1 == "require" && $2 == m { print $3 } $1 == m && $2 ~ /^v/ { print $2 }' "$1" | head -n1
}

# Kubernetes: hack/kube (the default, what `make test` builds), or with K8S_VERSION set
# (v1.32.9, 1.32.9 or 1.32) the hack/kube* module that pins that release (hack/kube-1.32:
# the 1.32 lane of docs/operators.md "Kubernetes versions"; made by hack/kube/update-go-mod.sh).
KUBE_DIR="$HACK_DIR/kube"
if [[ -n "${K8S_VERSION:-}" ]]; then
  want="v${K8S_VERSION#v}" KUBE_DIR="" pinned=()
  for d in "$HACK_DIR"/kube "$HACK_DIR"/kube-*; do
    [[ -f "$d/go.mod" ]] || continue
    v="$(mod_version "$d/go.mod" k8s.io/kubernetes)"; pinned+=("$v (hack/${d##*/})")
    [[ "$v" == "$want" || "$v" == "$want".* ]] && KUBE_DIR="$d"
  done
  [[ -n "$KUBE_DIR" ]] || die "K8S_VERSION=$K8S_VERSION: no hack/kube* module pins it; pinned: ${pinned[*]}"
fi
K8S_VERSION="$(mod_version "$KUBE_DIR/go.mod" k8s.io/kubernetes)"
ETCD_VERSION="$(mod_version "$HACK_DIR/etcd/go.mod" go.etcd.io/etcd/server/v3)"
CDI_VERSION="$(mod_version "$HACK_DIR/cdi/go.mod" tags.cncf.io/container-device-interface)"
CTRD_VERSION="$(mod_version "$HACK_DIR/containerd/go.mod" github.com/containerd/containerd/v2)"
[[ -n "$K8S_VERSION" && -n "$ETCD_VERSION" && -n "$CDI_VERSION" && -n "$CTRD_VERSION" ]] ||
  die "could not read pinned versions from hack/{${KUBE_DIR##*/},etcd,cdi,containerd}/go.mod"

CACHE_ROOT="${CD_E2E_CACHE:-$HOME/.cache/compute-domain-e2e}"
BIN_DIR="$CACHE_ROOT/k8s-$K8S_VERSION/bin"

# Bump when the build recipe (flags, ldflags) changes, to force a rebuild.
RECIPE=3
stamp_of() { # <module dir> <extra key> -> hash of the files that define the build
  { echo "$RECIPE $2"; cat "$1"/go.mod "$1"/go.sum "$1"/*.go; } | sha256sum | cut -d' ' -f1
}
fresh() { # <stamp name> <stamp value> <binaries...>
  local name="$1" want="$2"; shift 2
  [[ -f "$BIN_DIR/.$name.stamp" && "$(cat "$BIN_DIR/.$name.stamp")" == "$want" ]] || return 1
  local b; for b in "$@"; do [[ -x "$BIN_DIR/$b" ]] || return 1; done
}

KUBE_BINS=(kube-apiserver kube-scheduler kube-controller-manager kubelet kube-proxy)
CTRD_BINS=(containerd containerd-shim-runc-v2 ctr)
# Foreign-architecture node binaries: <bin>/linux-<arch>/<name>, stamp .containerd-linux-<arch>.
CTRD_FOREIGN_ARCHES=(arm64)
CTRD_FOREIGN_BINS=(containerd)
foreign_bins() { local b; for b in "${CTRD_FOREIGN_BINS[@]}"; do echo "linux-$1/$b"; done; }
KUBE_STAMP="$(stamp_of "$KUBE_DIR" "$K8S_VERSION")"
ETCD_STAMP="$(stamp_of "$HACK_DIR/etcd" "$ETCD_VERSION")"
CDI_STAMP="$(stamp_of "$HACK_DIR/cdi" "$CDI_VERSION")"
CTRD_STAMP="$(stamp_of "$HACK_DIR/containerd" "$CTRD_VERSION")"
# The line of the module that the foreign build replaces, and with what (see the header).
SECCOMP_FILE=internal/cri/sputil/seccomp_linux.go
SECCOMP_FROM='return nil, errors.New("seccomp is not supported")'
SECCOMP_TO='return nil, nil // qemu-user: no seccomp; run without a profile (hack/build-control-plane.sh)'
declare -A CTRD_FOREIGN_STAMP
for a in "${CTRD_FOREIGN_ARCHES[@]}"; do
  CTRD_FOREIGN_STAMP[$a]="$(stamp_of "$HACK_DIR/containerd" "$CTRD_VERSION linux/$a $SECCOMP_TO")"
done
foreign_fresh() { # <arch>
  # shellcheck disable=SC2046  # one word per binary path
  fresh "containerd-linux-$1" "${CTRD_FOREIGN_STAMP[$1]}" $(foreign_bins "$1")
}

case "${1:-}" in
  --print-bin-dir) echo "$BIN_DIR"; exit 0 ;;
  --check)
    fresh kube "$KUBE_STAMP" "${KUBE_BINS[@]}" && fresh etcd "$ETCD_STAMP" etcd &&
      fresh cdi "$CDI_STAMP" cdi-resolve && fresh containerd "$CTRD_STAMP" "${CTRD_BINS[@]}" || exit 1
    for a in "${CTRD_FOREIGN_ARCHES[@]}"; do foreign_fresh "$a" || exit 1; done
    echo "$BIN_DIR"; exit 0 ;;
  "") ;;
  *) die "unknown argument '$1' (use --print-bin-dir or --check)" ;;
esac

GO_CHECKED=0
need_go() {
  [[ $GO_CHECKED == 1 ]] && return 0
  if ! command -v go >/dev/null 2>&1; then
    [[ -x /usr/local/go/bin/go ]] && export PATH="$PATH:/usr/local/go/bin" ||
      die "'go' not found in PATH (need Go >= 1.26 to build Kubernetes $K8S_VERSION)"
  fi
  log "using $(go version) (GOPROXY=$(go env GOPROXY))"
  GO_CHECKED=1
}
download() { # <module dir> : fetch the module graph, with a clear error if the proxy is unreachable
  local out
  if ! out="$(cd "$1" && go mod download 2>&1)"; then
    printf '%s\n' "$out" | tail -n 20 >&2
    die "'go mod download' failed in $1: is the Go module proxy ($(go env GOPROXY)) reachable?"
  fi
}
install_from() { # <tmp dir> <binaries...> : move built binaries into place atomically
  local tmp="$1" b; shift
  for b in "$@"; do mv -f "$tmp/$b" "$BIN_DIR/$b"; done
  rm -rf "$tmp"
}

mkdir -p "$BIN_DIR"
trap 'rm -rf "$BIN_DIR"/.build.*' EXIT  # half-built binaries never land in $BIN_DIR
T_ALL=$SECONDS

if fresh kube "$KUBE_STAMP" "${KUBE_BINS[@]}"; then
  log "kubernetes $K8S_VERSION: up to date"
else
  need_go
  log "kubernetes $K8S_VERSION: downloading modules"
  download "$KUBE_DIR"
  minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
  # buildDate = the release's publication time from the proxy (reproducible, unlike `date`).
  build_date="$(cd "$KUBE_DIR" && go list -m -json k8s.io/kubernetes |
    python3 -c 'import json,sys; print(json.load(sys.stdin).get("Time",""))' 2>/dev/null || true)"
  ld="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X '$pkg.gitVersion=$K8S_VERSION' -X '$pkg.gitMajor=1' -X '$pkg.gitMinor=$minor'"
    ld+=" -X '$pkg.gitCommit=' -X '$pkg.gitTreeState=clean' -X '$pkg.buildDate=${build_date:-1970-01-01T00:00:00Z}'"
  done
  log "kubernetes $K8S_VERSION: go build ${KUBE_BINS[*]} (cold: ~20 min on 2 cores)"
  t=$SECONDS; tmp="$(mktemp -d "$BIN_DIR/.build.XXXXXX")"
  (cd "$KUBE_DIR" && go build -trimpath -ldflags "$ld" -o "$tmp/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-scheduler \
    k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kubelet \
    k8s.io/kubernetes/cmd/kube-proxy) || { rm -rf "$tmp"; die "go build of kubernetes failed"; }
  install_from "$tmp" "${KUBE_BINS[@]}"
  echo "$KUBE_STAMP" >"$BIN_DIR/.kube.stamp"
  log "kubernetes $K8S_VERSION: built in $((SECONDS - t))s"
fi

if fresh etcd "$ETCD_STAMP" etcd; then
  log "etcd $ETCD_VERSION: up to date"
else
  need_go
  log "etcd $ETCD_VERSION: downloading modules"
  download "$HACK_DIR/etcd"
  log "etcd $ETCD_VERSION: go build"
  t=$SECONDS; tmp="$(mktemp -d "$BIN_DIR/.build.XXXXXX")"
  (cd "$HACK_DIR/etcd" && go build -trimpath -ldflags "-s -w" -o "$tmp/etcd" .) ||
    { rm -rf "$tmp"; die "go build of etcd failed"; }
  install_from "$tmp" etcd
  echo "$ETCD_STAMP" >"$BIN_DIR/.etcd.stamp"
  log "etcd $ETCD_VERSION: built in $((SECONDS - t))s"
fi

if fresh cdi "$CDI_STAMP" cdi-resolve; then
  log "cdi-resolve (CDI $CDI_VERSION): up to date"
else
  need_go
  log "cdi-resolve (CDI $CDI_VERSION): downloading modules"
  download "$HACK_DIR/cdi"
  t=$SECONDS; tmp="$(mktemp -d "$BIN_DIR/.build.XXXXXX")"
  (cd "$HACK_DIR/cdi" && go build -trimpath -ldflags "-s -w" -o "$tmp/cdi-resolve" .) ||
    { rm -rf "$tmp"; die "go build of cdi-resolve failed"; }
  install_from "$tmp" cdi-resolve
  echo "$CDI_STAMP" >"$BIN_DIR/.cdi.stamp"
  log "cdi-resolve: built in $((SECONDS - t))s"
fi

if fresh containerd "$CTRD_STAMP" "${CTRD_BINS[@]}"; then
  log "containerd $CTRD_VERSION: up to date"
else
  need_go
  log "containerd $CTRD_VERSION: downloading modules"
  download "$HACK_DIR/containerd"
  log "containerd $CTRD_VERSION: go build ${CTRD_BINS[*]}"
  t=$SECONDS; tmp="$(mktemp -d "$BIN_DIR/.build.XXXXXX")"
  cld="-s -w -X github.com/containerd/containerd/v2/version.Version=$CTRD_VERSION"
  (cd "$HACK_DIR/containerd" && go build -trimpath -tags "no_btrfs urfave_cli_no_docs" -ldflags "$cld" \
    -o "$tmp/" github.com/containerd/containerd/v2/cmd/containerd \
    github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
    github.com/containerd/containerd/v2/cmd/ctr) || { rm -rf "$tmp"; die "go build of containerd failed"; }
  install_from "$tmp" "${CTRD_BINS[@]}"
  echo "$CTRD_STAMP" >"$BIN_DIR/.containerd.stamp"
  log "containerd $CTRD_VERSION: built in $((SECONDS - t))s"
fi

for a in "${CTRD_FOREIGN_ARCHES[@]}"; do
  if foreign_fresh "$a"; then
    log "containerd $CTRD_VERSION linux/$a: up to date"
    continue
  fi
  need_go
  download "$HACK_DIR/containerd"
  log "containerd $CTRD_VERSION linux/$a: go build ${CTRD_FOREIGN_BINS[*]} (cold: ~1.5 min on 2 cores)"
  t=$SECONDS; tmp="$(mktemp -d "$BIN_DIR/.build.XXXXXX")"
  mkdir -p "$tmp/linux-$a" "$BIN_DIR/linux-$a"
  pkgs=(); for b in "${CTRD_FOREIGN_BINS[@]}"; do pkgs+=("github.com/containerd/containerd/v2/cmd/$b"); done
  upstream="$(cd "$HACK_DIR/containerd" && go list -m -f '{{.Dir}}' github.com/containerd/containerd/v2)"
  # Fixed paths (not under $tmp): they end up in the build IDs, and the binary stays reproducible.
  src="$BIN_DIR/.build.src/containerd" mod="$BIN_DIR/.build.src/module"
  rm -rf "$BIN_DIR/.build.src" && mkdir -p "$BIN_DIR/.build.src" &&
    cp -r "$upstream" "$src" && chmod -R u+w "$src" && mkdir "$mod" &&
    cp "$HACK_DIR/containerd"/go.mod "$HACK_DIR/containerd"/go.sum "$HACK_DIR/containerd"/*.go "$mod/" ||
    { rm -rf "$tmp"; die "cannot copy the containerd module to $tmp"; }
  [[ "$(grep -cF "$SECCOMP_FROM" "$src/$SECCOMP_FILE")" == 1 ]] ||
    { rm -rf "$tmp"; die "$SECCOMP_FILE no longer has '$SECCOMP_FROM' once: revisit the qemu change"; }
  awk -v from="$SECCOMP_FROM" -v to="$SECCOMP_TO" \
    '{ i = index($0, from); if (i) $0 = substr($0, 1, i - 1) to; print }' \
    "$upstream/$SECCOMP_FILE" >"$src/$SECCOMP_FILE"
  cld="-s -w -X github.com/containerd/containerd/v2/version.Version=$CTRD_VERSION"
  (cd "$mod" && go mod edit -replace "github.com/containerd/containerd/v2=$src" &&
    GOARCH="$a" go build -trimpath -tags "no_btrfs urfave_cli_no_docs" -ldflags "$cld" \
      -o "$tmp/linux-$a/" "${pkgs[@]}") ||
    { rm -rf "$tmp"; die "go build of containerd for linux/$a failed"; }
  # shellcheck disable=SC2046  # one word per binary path
  install_from "$tmp" $(foreign_bins "$a")
  echo "${CTRD_FOREIGN_STAMP[$a]}" >"$BIN_DIR/.containerd-linux-$a.stamp"
  log "containerd $CTRD_VERSION linux/$a: built in $((SECONDS - t))s"
done

log "done in $((SECONDS - T_ALL))s; binaries in $BIN_DIR"
echo "$BIN_DIR"
