#!/usr/bin/env bash
# Delete the kind cluster made by hack/kind/create-cluster.sh (needs Docker and kind).
set -euo pipefail
NAME=${KIND_CLUSTER_NAME:-compute-domain}
KUBECONFIG_OUT=${KUBECONFIG_OUT:-$HOME/.kube/kind-$NAME.kubeconfig}
command -v kind >/dev/null || { echo "kind not found" >&2; exit 1; }
kind delete cluster --name "$NAME" --kubeconfig "$KUBECONFIG_OUT"
rm -f "$KUBECONFIG_OUT"
