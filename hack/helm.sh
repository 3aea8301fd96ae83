#!/usr/bin/env bash
# Print the path of a cached helm binary (the chart tests run `helm lint` and `helm template`).
# Built from the Go module proxy (`go install helm.sh/helm/v3/cmd/helm@$HELM_VERSION`, the
# module's own go.sum checked against the checksum database) with the ldflags of helm's Makefile
# that matter here: its version, and the Kubernetes version that `helm template` and `helm lint`
# assume without a cluster (that of the client-go helm is built with), so the chart's kubeVersion
# check sees a current cluster. Cached outside the repository, keyed by version and recipe:
#   ${CD_E2E_CACHE:-$HOME/.cache/compute-domain-e2e}/helm/<version>-r<recipe>/helm
# A cached binary is reused without touching Go. Cold build: docs/e2e-build.md.
# Usage: hack/helm.sh        # last (only) stdout line = the helm path; exit 1 on failure
set -euo pipefail
HELM_VERSION=v3.22.0
# The Kubernetes minor of the client-go that helm $HELM_VERSION requires (k8s.io/client-go v0.37.x).
HELM_K8S_MINOR=37
RECIPE=1
DEST="${CD_E2E_CACHE:-$HOME/.cache/compute-domain-e2e}/helm/$HELM_VERSION-r$RECIPE"

if [[ -x "$DEST/helm" ]]; then
  echo "$DEST/helm"
  exit 0
fi
command -v go >/dev/null || { echo "helm.sh: go is needed to build helm $HELM_VERSION" >&2; exit 1; }

mkdir -p "$DEST"
tmp=$(mktemp -d "$DEST/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
for pkg in pkg/lint/rules pkg/chartutil; do
  ldflags+=" -X helm.sh/helm/v3/$pkg.k8sVersionMajor=1 -X helm.sh/helm/v3/$pkg.k8sVersionMinor=$HELM_K8S_MINOR"
done
start=$(date +%s)
echo "helm.sh: building helm $HELM_VERSION from the Go module proxy" >&2
GOBIN="$tmp" GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-buildvcs=false \
  go install -trimpath -ldflags "$ldflags" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >&2
"$tmp/helm" version --short >&2
mv "$tmp/helm" "$DEST/helm"  # atomic: a concurrent run never sees half a file
echo "helm.sh: built in $(( $(date +%s) - start ))s" >&2
echo "$DEST/helm"
