# syntax=docker/dockerfile:1
# Container images of the driver: one Dockerfile, one final target per binary in cmd/.
#   docker build --target compute-domain-controller     -t <ref> .
#   docker build --target compute-domain-kubelet-plugin -t <ref> .
#   docker build --target compute-domain-daemon         -t <ref> .
# hack/build-images.sh builds all three with the names and tags of config/default.
#
# Layout inside the images (shared by all three targets, so they share every layer but the last):
#   /opt/venv                    runtime dependencies, pinned by hack/image-requirements.txt
#   /opt/compute-domain-driver   pkg/ and cmd/ of this repository (PYTHONPATH), byte-compiled
#   /opt/compute-domain-driver/bin/<binary>   entry points on PATH
# pkg/imex/sim (the IMEX simulator) and pkg/testing (test doubles) are left out: nvidia-imex
# reaches the IMEX daemon only from the node's driver root through the plugin's CDI spec.

# Pinned by full version tag; bump deliberately (and rebuild) for security fixes.
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

# ---------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /build
COPY hack/image-requirements.txt ./requirements.txt
# Binary wheels only: nothing is compiled, so no compiler is needed in any stage.  pip itself is
# removed from the venv afterwards.
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir --only-binary=:all: --requirement requirements.txt \
    && /opt/venv/bin/pip uninstall --yes pip
COPY pkg/ /opt/compute-domain-driver/pkg/
COPY cmd/ /opt/compute-domain-driver/cmd/
# Entry points named like the binaries (the controller starts daemons with
# `compute-domain-daemon ... run`).  Byte-compile ahead of time: the root filesystem is
# read-only at run time.
RUN set -eu; \
    mkdir -p /opt/compute-domain-driver/bin; \
    for bin in compute-domain-controller compute-domain-kubelet-plugin compute-domain-daemon; do \
      script="/opt/compute-domain-driver/cmd/${bin}/${bin//-/_}.py"; \
      printf '#!/bin/sh\nexec /opt/venv/bin/python %s "$@"\n' "${script}" \
        > "/opt/compute-domain-driver/bin/${bin}"; \
      chmod 0755 "/opt/compute-domain-driver/bin/${bin}"; \
    done; \
    rm -rf /opt/compute-domain-driver/pkg/imex/sim /opt/compute-domain-driver/pkg/testing; \
    find /opt/compute-domain-driver -name '__pycache__' -prune -exec rm -rf {} +; \
    /opt/venv/bin/python -m compileall -q /opt/compute-domain-driver /opt/venv

# ---------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.vendor="compute-domain-driver" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}" \
      org.opencontainers.image.documentation="docs/operators.md"
# No package installs: the base already has everything at run time.  Drop the base image's
# pip/setuptools/wheel (build tooling) and add the unprivileged user the controller runs as.
RUN python -m pip uninstall --yes --no-cache-dir pip setuptools wheel \
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
# so it needs root (as upstream's daemon).  The pod is not privileged.
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
