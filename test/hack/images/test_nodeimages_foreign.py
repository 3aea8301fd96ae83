"""Foreign-architecture node images (``hack/nodeimages/foreign.py``): which platforms an archive
holds, and the arm64 pause image (built here when the cross compiler is installed).

The archive the arm64 node imports from ``build_all`` is an OCI layout whose ``index.json``
entries are image indexes (buildah's ``manifest push --all``); :func:`_multi_arch_archive`
writes that shape with :mod:`nodeimages.oci`'s pieces.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile
from pathlib import Path
from typing import Any

import pytest
from hostsys import binfmt
from nodeimages import PAUSE_IMAGE, BuildError, foreign, oci


def _layer(tmp: Path, name: str) -> oci.Blob:
    root = tmp / name
    root.mkdir()
    (root / "file").write_text(name)
    return oci.write_layer(root, tmp / f"{name}.tar")


def _blob(blobs: dict[str, bytes], obj: dict[str, Any]) -> dict[str, Any]:
    data = oci.canonical_json(obj)
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return {"digest": digest, "size": len(data)}


def _multi_arch_archive(tmp: Path, ref: str, arches: list[str], *, platform: bool) -> Path:
    """``ref`` as one image index of a manifest per arch (descriptor platforms if ``platform``,
    else only in the configs, as some tools write them)."""
    blobs: dict[str, bytes] = {}
    layers = []
    manifests = []
    for arch in arches:
        layer = _layer(tmp, arch)
        layers.append(layer)
        config = oci.image_config(layers=[layer], architecture=arch)
        cfg = {"mediaType": oci.MEDIA_CONFIG, **_blob(blobs, config)}
        man = {
            "schemaVersion": 2,
            "mediaType": oci.MEDIA_MANIFEST,
            "config": cfg,
            "layers": [layer.descriptor()],
        }
        desc = {"mediaType": oci.MEDIA_MANIFEST, **_blob(blobs, man)}
        if platform:
            desc["platform"] = {"architecture": arch, "os": "linux"}
        manifests.append(desc)
    index = {"schemaVersion": 2, "mediaType": oci.MEDIA_INDEX, "manifests": manifests}
    top = {
        "schemaVersion": 2,
        "mediaType": oci.MEDIA_INDEX,
        "manifests": [
            {
                "mediaType": oci.MEDIA_INDEX,
                **_blob(blobs, index),
                "annotations": {oci.ANNOTATION_CONTAINERD_NAME: ref},
            }
        ],
    }
    out = tmp / "multi.tar"
    with tarfile.open(out, "w") as tar:
        files: dict[str, bytes] = {
            "oci-layout": b'{"imageLayoutVersion":"1.0.0"}',
            "index.json": oci.canonical_json(top),
        }
        files.update({f"blobs/sha256/{d[7:]}": b for d, b in blobs.items()})
        files.update({f"blobs/sha256/{lay.digest[7:]}": lay.path.read_bytes() for lay in layers})
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out


@pytest.mark.parametrize("platform", [True, False], ids=["descriptor", "config"])
def test_platforms_of_a_multi_arch_index(tmp_path: Path, platform: bool) -> None:
    archive = _multi_arch_archive(
        tmp_path, "example.com/x:1", ["amd64", "arm64"], platform=platform
    )
    assert foreign.archive_platforms(archive) == {"example.com/x:1": ["linux/amd64", "linux/arm64"]}


def test_platforms_of_single_manifest_archives(tmp_path: Path) -> None:
    images = []
    for ref, arch in (("example.com/a:1", "amd64"), ("example.com/b:1", "arm64")):
        layer = _layer(tmp_path, arch)
        images.append(oci.Image(ref, oci.image_config(layers=[layer], architecture=arch), [layer]))
    oci.write_archive(tmp_path / "two.tar", images)
    assert foreign.archive_platforms(tmp_path / "two.tar") == {
        "example.com/a:1": ["linux/amd64"],
        "example.com/b:1": ["linux/arm64"],
    }


def test_not_an_archive_is_a_build_error(tmp_path: Path) -> None:
    (tmp_path / "x.tar").write_bytes(b"no tar")
    with pytest.raises(BuildError, match="not a readable OCI archive"):
        foreign.archive_platforms(tmp_path / "x.tar")


def test_elf_machine(tmp_path: Path) -> None:
    assert foreign.elf_machine(Path("/bin/sh")) == foreign.CROSS[binfmt.native_arch()][1]
    (tmp_path / "script").write_text("#!/bin/sh\n")
    assert foreign.elf_machine(tmp_path / "script") == -1


def test_unknown_arch_names_the_toolchain() -> None:
    with pytest.raises(BuildError, match="no cross toolchain known for 's390x'"):
        foreign.cross_tool("s390x", "gcc")


@pytest.mark.skipif(
    shutil.which("aarch64-linux-gnu-gcc") is None
    or os.geteuid() != 0
    or not (binfmt.BINFMT_D / "qemu-aarch64.conf").is_file(),
    reason="needs root, gcc-aarch64-linux-gnu, libc6-dev-arm64-cross, qemu-user-static "
    "(hack/node-deps.sh)",
)
def test_arm64_pause_is_built_once_and_named_like_the_host_pause(tmp_path: Path) -> None:
    before = binfmt.state()
    path = foreign.build_pause(tmp_path, "arm64", log=lambda _m: None)
    assert binfmt.state() == before, "the self-check left the binfmt handler registered"
    assert path.parent == tmp_path / "oci" and path.name.startswith("pause-arm64-")
    assert foreign.archive_platforms(path) == {PAUSE_IMAGE: ["linux/arm64"]}
    mtime = path.stat().st_mtime_ns
    assert foreign.build_pause(tmp_path, "arm64", log=lambda _m: None) == path
    assert path.stat().st_size > 0 and list((tmp_path / "oci").iterdir()) == [path]
    with tarfile.open(path) as tar:
        index = json.load(tar.extractfile("index.json"))  # type: ignore[arg-type]
        manifest = json.load(
            tar.extractfile("blobs/sha256/" + index["manifests"][0]["digest"][7:])  # type: ignore[arg-type]
        )
        config = json.load(
            tar.extractfile("blobs/sha256/" + manifest["config"]["digest"][7:])  # type: ignore[arg-type]
        )
    assert config["config"] == {"Entrypoint": ["/pause"], "User": "65535:65535"}
    assert path.stat().st_mtime_ns >= mtime
