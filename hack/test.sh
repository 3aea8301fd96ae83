#!/usr/bin/env bash
# The README's test command (`make test`): static gates, unit tests, then the e2e suite
# against a real Kubernetes control plane built from Go modules (cached outside the repo): one lane
# on simulated nodes (scale, speed), one on real kubelets + containerd running our images.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${VENV:-.venv}/bin/python
start=$(date +%s)
hack/check.sh
echo "==> helm (test/unit/helm; built from the Go module proxy once, then cached)"
hack/helm.sh >/dev/null
echo "==> unit tests"
"$PY" -m pytest test/unit test/hack -q -p no:cacheprovider
if [[ "${SKIP_E2E:-}" != "1" ]]; then
  echo "==> control plane and node binaries; Debian packages of the real-node tier"
  hack/build-control-plane.sh
  hack/node-deps.sh
  echo "==> e2e tests (simulated nodes)"
  "$PY" -m pytest test/e2e -q -p no:cacheprovider
  echo "==> e2e tests (real nodes: kubelet + containerd, the driver as pods)"
  "$PY" -m pytest test/e2e_nodes -q -p no:cacheprovider
fi
echo "==> make test finished in $(( $(date +%s) - start ))s"
