#!/usr/bin/env bash
# Debian packages the real-node e2e tier needs on the host (hack/localcluster/realnode.py):
#   runc                         the OCI runtime containerd's runc shim calls
#   containernetworking-plugins  CNI bridge, host-local, loopback, portmap (/usr/lib/cni)
#   busybox-static, curl         the workload image's busybox; probes inside node namespaces
#   iptables, iproute2, util-linux  namespaces, veths, kubelet/kube-proxy rules
#   qemu-user-static             qemu-aarch64 binfmt handler: the arm64 node's containerd and pods
#   gcc-aarch64-linux-gnu        cross compiler of the arm64 pause image (hack/nodeimages/foreign.py)
#   libc6-dev-arm64-cross        the static arm64 libc that pause links against
#   buildah                      builds the driver images from the Dockerfile (hack/nodeimages)
#   mmdebstrap, arch-test        the images' local Debian base (no registry reachable); arch-test
#                                lets mmdebstrap build the foreign (arm64) one
# Idempotent: installs only what is missing; needs root and Debian's package mirror.
set -euo pipefail
PKGS=(runc containernetworking-plugins busybox-static curl iptables iproute2 util-linux
  qemu-user-static gcc-aarch64-linux-gnu libc6-dev-arm64-cross buildah mmdebstrap arch-test)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0
if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
  echo "node-deps: need Debian packages ${missing[*]}: install them as root with apt-get" >&2
  exit 1
fi
echo "node-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >&2; then
  echo "node-deps: apt-get could not install ${missing[*]} (is Debian's package mirror reachable?)" >&2
  exit 1
fi
