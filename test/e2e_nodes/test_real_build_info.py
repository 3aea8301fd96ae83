"""Which build runs, read the three ways an operator would, against the image it runs from.

The lane's pods run the ``Dockerfile``'s images (``hack/nodeimages``, built by buildah). For each
driver binary in a live pod (the controller, every node's plugin, every node's IMEX daemon of a
formed domain): ``<binary> --version`` inside the container, the first line of its log and its
``*_build_info`` gauge all name the version and revision of the image's OCI labels
(``org.opencontainers.image.version`` / ``.revision``), and those are this checkout's.
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

from localcluster.realnode import RealNodes
from nodeimages import archive_platforms, build_all, driver_image_refs
from prometheus_client.parser import text_string_to_metric_families
from testsupport.realsupport import (
    REAL_NODES,
    REPO,
    Kubectl,
    apply,
    channel_pod,
    domain,
    phase,
    ready_daemon,
    scrape,
    wait_for,
)

#: binary -> (pod label selector in the driver namespace, metrics port, gauge name)
BINARIES = {
    "compute-domain-controller": (
        "app.kubernetes.io/name=compute-domain-controller",
        8080,
        "nvidia_dra_compute_domain_controller_build_info",
    ),
    "compute-domain-kubelet-plugin": (
        "app.kubernetes.io/name=compute-domain-kubelet-plugin",
        8081,
        "nvidia_dra_compute_domain_kubelet_plugin_build_info",
    ),
    "compute-domain-daemon": (
        "resource.nvidia.com/computeDomain",  # the daemon pods (any domain)
        9400,
        "compute_domain_daemon_build_info",
    ),
}


def _labels(binary: str) -> dict[str, str]:
    ref = driver_image_refs()[binary]
    configs = archive_platforms(build_all()[ref], ref)
    assert set(configs) == {"linux/amd64", "linux/arm64"}, f"{ref}: {sorted(configs)}"
    # The base differs by architecture (its name too, here); every other label is the build's.
    base = "org.opencontainers.image.base.name"
    labels = [
        {k: v for k, v in c["config"]["Labels"].items() if k != base} for c in configs.values()
    ]
    assert labels[0] == labels[1], "the architectures' labels differ"
    return dict(labels[0])


def _gauge(text: str, name: str) -> dict[str, str]:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                assert sample.value == 1
                return dict(sample.labels)
    raise AssertionError(f"{name} not served")


def test_version_log_and_metric_name_the_image_labels(
    kubectl: Kubectl, nodes: RealNodes, driver: str, ns: str
) -> None:
    head = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    apply(
        kubectl,
        domain(ns),
        *(channel_pod(ns, f"w{i}", node, "sleep 3600") for i, node in enumerate(REAL_NODES)),
    )
    uid = kubectl.json("-n", ns, "get", "computedomain/cd")["metadata"]["uid"]
    for i, node in enumerate(REAL_NODES):

        def running(pod: str = f"w{i}") -> bool:
            return phase(kubectl, ns, pod) == "Running"

        def daemon_ready(node: str = node) -> dict[str, Any] | None:
            return ready_daemon(kubectl, driver, uid, node)

        wait_for(f"workload w{i} to run", running, 180, 1)
        wait_for(f"the daemon on {node} Ready", daemon_ready, 60)

    for binary, (selector, port, gauge) in BINARIES.items():
        labels = _labels(binary)
        version = labels["org.opencontainers.image.version"]
        revision = labels["org.opencontainers.image.revision"]
        assert version == _pyproject_version()
        # A cached image was built from an earlier commit with the same build context.
        assert re.fullmatch(r"[0-9a-f]{40}", revision), revision
        if revision != head:
            assert (
                subprocess.run(
                    ["git", "-C", str(REPO), "merge-base", "--is-ancestor", revision, head],
                    check=False,
                ).returncode
                == 0
            ), f"{binary}: image revision {revision} is not in this history"
        pods = [
            p
            for p in kubectl.items("pods", "-n", driver, "-l", selector)
            if p["status"].get("phase") == "Running"
        ]
        assert pods, f"no running {binary} pod ({selector})"
        for pod in pods:
            name = pod["metadata"]["name"]
            out = kubectl("-n", driver, "exec", name, "--", binary, "--version")
            assert out.strip().startswith(f"{binary} version {version} (revision {revision},"), out
            logs = kubectl("-n", driver, "logs", name)
            first = logs.splitlines()[0]
            assert f"starting {binary}" in first, first
            assert f"version={version}" in first and f"revision={revision}" in first, first
            served = _gauge(scrape(nodes, pod, port), gauge)
            assert (served["version"], served["revision"]) == (version, revision), served


def _pyproject_version() -> str:
    with (Path(REPO) / "pyproject.toml").open("rb") as f:
        return str(tomllib.load(f)["project"]["version"])
