# syntax=docker/dockerfile:1
# Container images of the driver: one Dockerfile, one final target per binary in cmd/, for
# linux/amd64 and linux/arm64 (GB200/GB300 compute trays are Grace, i.e. arm64).
#   docker buildx build --platform linux/amd64,linux/arm64 --target compute-domain-daemon -t <ref> .
#   buildah build --platform linux/arm64 --target compute-domain-daemon -t <ref> .
# hack/build-images.sh builds all three targets for both architectures into one OCI image index
# per binary, with the names and tags of config/default; CI builds exactly this file the same way
# (hack/nodeimages), from a local Debian bookworm base made by mmdebstrap (BASE_IMAGE).
#
# Layout inside the images (shared by all three targets, so they share every layer but the last):
#   /opt/venv                    runtime dependencies: hack/image-requirements.txt, hash-locked
#   /opt/compute-domain-driver   pkg/ and cmd/ of this repository (PYTHONPATH), byte-compiled,
#                                pyproject.toml (the version) and build-info.json (revision, date)
#   /opt/compute-domain-driver/bin/<binary>   entry points on PATH
# pkg/imex/sim (the IMEX simulator) and pkg/testing (test doubles) are left out: nvidia-imex
# reaches the IMEX daemon only from the node's driver root through the plugin's CDI spec.

# Debian 12 (bookworm) slim, pinned by the digest of its multi-architecture index.  Python is
# Debian's python3 (3.11), installed below: the same interpreter on every architecture, with
# Debian's security updates.  Bump the digest deliberately (and rebuild).
ARG BASE_IMAGE=docker.io/library/debian:bookworm-slim@sha256:4724b8cc51e33e398f0e2e15e18d5ec2851ff0c2280647e1310bc1642182655d

# ---------------------------------------------------------------------------------------------
FROM ${BASE_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    DEBIAN_FRONTEND=noninteractive
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /build
COPY hack/image-requirements.txt ./requirements.txt
# Behind a TLS-inspecting proxy: --build-arg PIP_CERT=<CA bundle path inside the build> with the
# bundle mounted there (e.g. buildah's --volume); unset, pip uses its own CA bundle.
ARG PIP_CERT
# Binary wheels only, every file checked against the lock's hashes: nothing is compiled, so no
# compiler is needed in any stage.  pip and setuptools are removed from the venv afterwards.
RUN python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir --require-hashes --only-binary=:all: --no-deps \
       --requirement requirements.txt \
    && /opt/venv/bin/pip uninstall --yes pip setuptools \
    && rm -f /opt/venv/bin/activate* /opt/venv/bin/Activate.ps1 /opt/venv/bin/pip*
COPY pyproject.toml /opt/compute-domain-driver/pyproject.toml
COPY pkg/ /opt/compute-domain-driver/pkg/
COPY cmd/ /opt/compute-domain-driver/cmd/
ARG REVISION=unknown
ARG CREATED=unknown
# Entry points named like the binaries (the controller starts daemons with
# `compute-domain-daemon ... run`).  RUN steps are POSIX sh: an OCI-format build (buildah's
# default) has no SHELL instruction, and the one pipe here (echo | tr) cannot fail.  Byte-compile ahead of time: the root filesystem is
# read-only at run time.  build-info.json: what --version, the first log line and the
# *_build_info metric report (pkg/buildinfo.py); the same values as the image's labels.
# hadolint ignore=DL4006
RUN set -eu; \
    app=/opt/compute-domain-driver; \
    mkdir -p "${app}/bin"; \
    for bin in compute-domain-controller compute-domain-kubelet-plugin compute-domain-daemon; do \
      script="${app}/cmd/${bin}/$(echo "${bin}" | tr - _).py"; \
      printf '#!/bin/sh\nexec /opt/venv/bin/python %s "$@"\n' "${script}" > "${app}/bin/${bin}"; \
      chmod 0755 "${app}/bin/${bin}"; \
    done; \
    printf '{"revision": "%s", "created": "%s"}\n' "${REVISION}" "${CREATED}" \
      > "${app}/build-info.json"; \
    rm -rf "${app}/pkg/imex/sim" "${app}/pkg/testing"; \
    find "${app}" -name '__pycache__' -prune -exec rm -rf {} +; \
    /opt/venv/bin/python -m compileall -q "${app}" /opt/venv

# ---------------------------------------------------------------------------------------------
FROM ${BASE_IMAGE} AS runtime
ARG BASE_IMAGE
ARG VERSION=unknown
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.vendor="compute-domain-driver" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.base.name="${BASE_IMAGE}" \
      org.opencontainers.image.documentation="docs/operators.md"
ENV DEBIAN_FRONTEND=noninteractive
# Only the interpreter and its standard library (no pip, no venv module, no compiler; Debian
# byte-compiles the standard library when it installs it).  Add the unprivileged user the
# controller runs as.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/log/apt /var/log/dpkg.log \
    && groupadd --system --gid 65532 nonroot \
    && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin nonroot
COPY --from=builder /opt/venv /opt/venv
COPY --from=builder /opt/compute-domain-driver /opt/compute-domain-driver
ENV PATH=/opt/compute-domain-driver/bin:/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONPATH=/opt/compute-domain-driver \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
WORKDIR /opt/compute-domain-driver
USER 65532:65532

# ---------------------------------------------------------------------------------------------
# Controller: talks only to the API server; runs as the unprivileged user.
FROM runtime AS compute-domain-controller
LABEL org.opencontainers.image.title="compute-domain-controller" \
      org.opencontainers.image.description="ComputeDomain controller (Kubernetes DRA, NVIDIA IMEX)"
USER 65532:65532
ENTRYPOINT ["compute-domain-controller"]

# ---------------------------------------------------------------------------------------------
# IMEX daemon: rewrites the kubelet-managed /etc/hosts and the root-owned /imexd host directory,
# so it runs as root (as upstream's daemon) -- but its pod is not privileged and drops every
# capability, with a read-only root filesystem (the controller's DaemonSet, pkg/reconcilers/
# objects.py): nothing here may need writing at run time except /tmp and /var/log (emptyDirs).
FROM runtime AS compute-domain-daemon
LABEL org.opencontainers.image.title="compute-domain-daemon" \
      org.opencontainers.image.description="Per-node IMEX daemon of a ComputeDomain"
# hadolint ignore=DL3002
USER 0:0
ENTRYPOINT ["compute-domain-daemon"]

# ---------------------------------------------------------------------------------------------
# Kubelet plugin: creates sockets and files in root-owned host directories (kubelet plugin
# dirs, CDI specs), so it needs root.  Last, so a plain `docker build .` builds a complete image.
FROM runtime AS compute-domain-kubelet-plugin
LABEL org.opencontainers.image.title="compute-domain-kubelet-plugin" \
      org.opencontainers.image.description="ComputeDomain DRA kubelet plugin (IMEX channels)"
# hadolint ignore=DL3002
USER 0:0
ENTRYPOINT ["compute-domain-kubelet-plugin"]
