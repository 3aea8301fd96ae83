"""A local Kubernetes control plane for e2e tests, built from pinned Go modules.

``hack/build-control-plane.sh`` builds etcd, kube-apiserver, kube-scheduler and
kube-controller-manager into a cache dir; this package runs them on 127.0.0.1 with generated
certificates and static-token identities. Importable by name in the development venv (its
editable install maps the ``hack/`` packages, ``pyproject.toml``)::

    from localcluster import Cluster, bin_dir
    with Cluster.start(bin_dir(), "/tmp/cd-e2e") as c:
        RestClient(load_api_client(str(c.kubeconfig("admin"))))  # pkg.kube

Modules: ``pki`` (certs, identities, kubeconfigs), ``processes`` (spawning, health, logs),
``cluster`` (component flags, start/stop, state file), ``nodes`` (fake Node manifests),
``cli`` (``hack/local-cluster``), ``smoke`` (end-to-end self-check).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from .cluster import (
    COMPONENTS,
    DEFAULT_CONTROLLERS,
    DEFAULT_DRIVER_NAMESPACE,
    DRIVER_SERVICE_ACCOUNTS,
    Cluster,
    Ports,
)
from .nodes import fake_node
from .pki import Identity
from .processes import ClusterError

HACK_DIR = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = HACK_DIR / "build-control-plane.sh"


def bin_dir(*, build: bool = False) -> Path:
    """The control-plane bin dir; with ``build=True`` run the (idempotent) build script first."""
    args = [str(BUILD_SCRIPT)] if build else [str(BUILD_SCRIPT), "--print-bin-dir"]
    out = subprocess.run(args, check=True, stdout=subprocess.PIPE, text=True).stdout
    return Path(out.strip().splitlines()[-1])


__all__ = [
    "BUILD_SCRIPT",
    "COMPONENTS",
    "DEFAULT_CONTROLLERS",
    "DEFAULT_DRIVER_NAMESPACE",
    "DRIVER_SERVICE_ACCOUNTS",
    "Cluster",
    "ClusterError",
    "Identity",
    "Ports",
    "bin_dir",
    "fake_node",
]
