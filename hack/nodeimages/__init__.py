"""Container images for real (kubelet + containerd) e2e nodes, built without Docker.

The driver images of ``config/default`` (the ``Dockerfile``'s targets built by buildah for
linux/amd64 and linux/arm64), the pause image containerd and kubelet default to, and a busybox
for workloads, each written as an OCI image-layout tarball for ``ctr -n k8s.io images import``.
Importable by name in the development venv (as ``localcluster``)::

    from nodeimages import BUSYBOX_IMAGE, PAUSE_IMAGE, build_all, import_images
    archives = build_all()                       # {image ref: archive path}, cached
    import_images(bin_dir / "ctr", "/run/node-1/containerd.sock", archives.values())

Modules: ``oci`` (deterministic layer tars, configs, layout archives), ``debs`` (apt
resolution, download cache, unpacking), ``driver`` (the Dockerfile with buildah, its checks),
``build`` (recipes, cache keys).
CLI: ``hack/build-node-images.py``.
"""

from __future__ import annotations

import json
import subprocess
import tarfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .build import (
    BUSYBOX_IMAGE,
    PAUSE_IMAGE,
    BuildError,
    build_all,
    cache_root,
    driver_image_refs,
    images_dir,
    is_fresh,
)
from .debs import DebError
from .oci import read_archive_index

#: containerd namespace the CRI plugin (and so the kubelet) sees.
K8S_NAMESPACE = "k8s.io"


def archive_refs(archive: Path) -> list[str]:
    """Image references an archive names (``io.containerd.image.name`` of its index)."""
    index = read_archive_index(archive)
    return [m["annotations"]["io.containerd.image.name"] for m in index["manifests"]]


def _blob(tar: tarfile.TarFile, digest: str) -> dict[str, Any]:
    member = tar.extractfile("blobs/" + digest.replace(":", "/", 1))
    if member is None:
        raise KeyError(digest)
    data: dict[str, Any] = json.load(member)
    return data


def archive_platforms(archive: Path, ref: str) -> dict[str, dict[str, Any]]:
    """``{"<os>/<arch>": image config}`` of the image ``ref`` in ``archive`` (one entry for a
    single-platform image, one per manifest of an image index)."""
    with tarfile.open(archive) as tar:
        index = read_archive_index(archive)
        [desc] = [
            m
            for m in index["manifests"]
            if m.get("annotations", {}).get("io.containerd.image.name") == ref
        ]
        top = _blob(tar, desc["digest"])
        manifests = top["manifests"] if "manifests" in top else [desc | {"platform": None}]
        out: dict[str, dict[str, Any]] = {}
        for m in manifests:
            manifest = _blob(tar, m["digest"]) if "manifests" in top else top
            config = _blob(tar, manifest["config"]["digest"])
            out[f"{config['os']}/{config['architecture']}"] = config
        return out


#: Labels a CRI pull gives an image; pinned images are never garbage-collected by the kubelet.
CRI_LABELS = ("io.cri-containerd.image=managed",)
CRI_PINNED = "io.cri-containerd.pinned=pinned"


def _ctr(base: list[str], *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*base, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def import_images(
    ctr_bin: Path,
    address: str,
    tars: Iterable[Path],
    *,
    namespace: str = K8S_NAMESPACE,
    pin: bool = True,
    timeout: float = 600.0,
) -> None:
    """Import OCI archives into the containerd at socket ``address`` (each archive once).

    Runs ``ctr --address <address> -n <namespace> images import --local <tar>`` (``--local``:
    the ctr process writes the content and unpacks it into the default snapshotter, without
    containerd's transfer service; both ways work with these archives), then labels every
    imported image as a CRI pull would (``io.cri-containerd.image=managed``) and, with ``pin``,
    ``io.cri-containerd.pinned=pinned``: the kubelet's image GC must never remove images that
    cannot be pulled again.  Raises :class:`RuntimeError` with ctr's output when a step fails or
    when ``ctr images ls`` then misses a reference an archive names.
    """
    archives = list(dict.fromkeys(Path(t) for t in tars))
    base = [str(ctr_bin), "--address", address, "-n", namespace]
    labels = [*CRI_LABELS, *([CRI_PINNED] if pin else [])]
    for tar in archives:
        done = _ctr(base, "images", "import", "--local", str(tar), timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(
                f"`ctr images import {tar}` into {address} failed (exit {done.returncode}):\n"
                f"{(done.stdout + done.stderr).strip()}"
            )
        for ref in archive_refs(tar):
            done = _ctr(base, "images", "label", ref, *labels, timeout=60)
            if done.returncode != 0:
                raise RuntimeError(
                    f"`ctr images label {ref}` at {address} failed (exit {done.returncode}):\n"
                    f"{(done.stdout + done.stderr).strip()}"
                )
    listed = _ctr(base, "images", "ls", "-q", timeout=60)
    have = set(listed.stdout.split())
    wanted = [ref for tar in archives for ref in archive_refs(tar)]
    missing = [ref for ref in wanted if ref not in have]
    if listed.returncode != 0 or missing:
        raise RuntimeError(
            f"after import, `ctr -n {namespace} images ls` at {address} lacks {missing} "
            f"(exit {listed.returncode}): {(listed.stdout + listed.stderr).strip()}"
        )


__all__ = [
    "BUSYBOX_IMAGE",
    "CRI_LABELS",
    "CRI_PINNED",
    "K8S_NAMESPACE",
    "PAUSE_IMAGE",
    "BuildError",
    "DebError",
    "archive_platforms",
    "archive_refs",
    "build_all",
    "cache_root",
    "driver_image_refs",
    "images_dir",
    "import_images",
    "is_fresh",
]
