"""Deterministic OCI image pieces: layer tars from directory trees, configs, image-layout tars.

Everything here is pure file writing (no containerd, no Docker), so it is unit-tested on its own
(``test/hack/images``).  Determinism rules: entries sorted by path, owner ``0:0`` with empty
user/group names, one fixed mtime (:data:`EPOCH`), permission bits kept, hard links inside a
layer written as tar hard links to the first path seen; JSON written with sorted keys and no
whitespace.  Two runs over the same tree therefore produce byte-identical blobs and digests.

Layers are uncompressed tars (``application/vnd.oci.image.layer.v1.tar``): the archives are
only ever imported locally, where gzip costs time twice and saves nothing, and the layer digest
equals its ``diff_id``.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import stat
import subprocess
import tarfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

#: mtime of every entry in every layer (1980-01-01T00:00:00Z, the oldest time zip/pyc-safe).
EPOCH = 315532800
EPOCH_ISO = "1980-01-01T00:00:00Z"

MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
ANNOTATION_REF_NAME = "org.opencontainers.image.ref.name"
ANNOTATION_CONTAINERD_NAME = "io.containerd.image.name"
_CHUNK = 1 << 20


class OCIError(RuntimeError):
    """A tree cannot be written as a layer, or a layout cannot be assembled."""


@dataclass(frozen=True)
class Blob:
    """A content-addressed blob: ``digest`` is ``sha256:<hex>`` of the file's bytes."""

    path: Path
    digest: str
    size: int
    media_type: str = MEDIA_LAYER

    def descriptor(self) -> dict[str, Any]:
        """The OCI descriptor (mediaType, digest, size) pointing at this blob."""
        return {"mediaType": self.media_type, "digest": self.digest, "size": self.size}


@dataclass(frozen=True)
class Image:
    """One image of an archive: its full reference, config JSON and layers (bottom first)."""

    ref: str
    config: Mapping[str, Any]
    layers: Sequence[Blob]


class _HashingWriter(io.RawIOBase):
    """File-like sink that writes to ``out`` and hashes what passes through."""

    def __init__(self, out: IO[bytes]) -> None:
        super().__init__()
        self._out = out
        self.sha = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        data = bytes(b)
        self._out.write(data)
        self.sha.update(data)
        self.size += len(data)
        return len(data)


def canonical_json(obj: Any) -> bytes:
    """``obj`` as compact JSON with sorted keys: the exact bytes that get hashed."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def sha256_file(path: Path) -> str:
    """``sha256:<hex>`` of a file's content."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def _norm(rel: str) -> str:
    rel = rel.strip("/")
    if not rel or rel.startswith("..") or "/../" in f"/{rel}/":
        raise OCIError(f"bad layer path {rel!r}")
    return rel


def _walk(root: Path, include: Sequence[str] | None, exclude: Sequence[str]) -> Iterator[str]:
    """Relative paths under ``root`` in sorted order; parents of included subtrees first."""
    excluded = {_norm(e) for e in exclude}
    tops = sorted({_norm(i) for i in include}) if include is not None else None

    def skip(rel: str) -> bool:
        return any(rel == e or rel.startswith(e + "/") for e in excluded)

    def subtree(rel: str) -> Iterator[str]:
        if skip(rel):
            return
        yield rel
        p = root / rel
        if p.is_dir() and not p.is_symlink():
            for name in sorted(os.listdir(p)):
                yield from subtree(f"{rel}/{name}")

    if tops is None:
        for name in sorted(os.listdir(root)):
            yield from subtree(name)
        return
    emitted: set[str] = set()
    for top in tops:
        parts = top.split("/")
        for i in range(1, len(parts)):
            parent = "/".join(parts[:i])
            if parent not in emitted:
                emitted.add(parent)
                yield parent
        if not (root / top).exists() and not (root / top).is_symlink():
            raise OCIError(f"{root / top} does not exist")
        for rel in subtree(top):
            if rel not in emitted:
                emitted.add(rel)
                yield rel


def _tarinfo(root: Path, rel: str, links: dict[tuple[int, int], str]) -> tarfile.TarInfo:
    st = os.lstat(root / rel)
    ti = tarfile.TarInfo(rel)
    ti.mode = stat.S_IMODE(st.st_mode)
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    ti.mtime = EPOCH
    if stat.S_ISDIR(st.st_mode):
        ti.type = tarfile.DIRTYPE
    elif stat.S_ISLNK(st.st_mode):
        ti.type = tarfile.SYMTYPE
        ti.linkname = os.readlink(root / rel)
    elif stat.S_ISREG(st.st_mode):
        key = (st.st_dev, st.st_ino)
        if st.st_nlink > 1 and key in links:
            ti.type = tarfile.LNKTYPE
            ti.linkname = links[key]
        else:
            if st.st_nlink > 1:
                links[key] = rel
            ti.type = tarfile.REGTYPE
            ti.size = st.st_size
    else:
        raise OCIError(f"{root / rel}: only files, directories and symlinks go into layers")
    return ti


def write_layer(
    root: Path,
    out: Path,
    *,
    include: Sequence[str] | None = None,
    exclude: Sequence[str] = (),
) -> Blob:
    """Write the tree under ``root`` as a deterministic uncompressed layer tar at ``out``.

    ``include`` limits the layer to those subtrees (relative paths; their parent directories are
    added as plain directory entries); ``exclude`` drops subtrees.  Device nodes, sockets and
    FIFOs are refused (:class:`OCIError`).  The file is written to ``out`` + ``.tmp`` and renamed
    into place, so ``out`` is either complete or absent.  Returns the blob (digest = diff_id).
    """
    tmp = out.with_name(out.name + ".tmp")
    links: dict[tuple[int, int], str] = {}
    with tmp.open("wb") as f:
        sink = _HashingWriter(f)
        with tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for rel in _walk(root, include, exclude):
                ti = _tarinfo(root, rel, links)
                if ti.type == tarfile.REGTYPE:
                    with (root / rel).open("rb") as src:
                        tar.addfile(ti, src)
                else:
                    tar.addfile(ti)
    os.replace(tmp, out)
    return Blob(out, "sha256:" + sink.sha.hexdigest(), sink.size)


def image_config(
    *,
    layers: Sequence[Blob],
    architecture: str,
    entrypoint: Sequence[str] | None = None,
    cmd: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
    user: str = "",
    working_dir: str = "",
    labels: Mapping[str, str] | None = None,
    history: Iterable[str] = (),
) -> dict[str, Any]:
    """An OCI image config (``application/vnd.oci.image.config.v1+json``) for ``layers``.

    ``env`` keeps its insertion order (``KEY=value`` entries); ``history`` gives one
    ``created_by`` text per layer.  ``created`` is :data:`EPOCH_ISO`, so the config and hence
    the manifest digest depend only on the arguments.
    """
    config: dict[str, Any] = {}
    if entrypoint is not None:
        config["Entrypoint"] = list(entrypoint)
    if cmd is not None:
        config["Cmd"] = list(cmd)
    if env:
        config["Env"] = [f"{k}={v}" for k, v in env.items()]
    if user:
        config["User"] = user
    if working_dir:
        config["WorkingDir"] = working_dir
    if labels:
        config["Labels"] = dict(labels)
    out: dict[str, Any] = {
        "created": EPOCH_ISO,
        "architecture": architecture,
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [layer.digest for layer in layers]},
    }
    steps = list(history)
    if steps:
        out["history"] = [{"created": EPOCH_ISO, "created_by": s} for s in steps]
    return out


def _ref_tag(ref: str) -> str:
    """The tag of ``ref`` (``latest`` when it has none); digests are not supported."""
    if "@" in ref:
        raise OCIError(f"{ref}: digest references cannot name an image in an archive")
    last = ref.rsplit("/", 1)[-1]
    return last.split(":", 1)[1] if ":" in last else "latest"


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    ti = tarfile.TarInfo(name)
    ti.size = len(data)
    ti.mode = mode
    ti.mtime = EPOCH
    ti.uname = ti.gname = ""
    tar.addfile(ti, io.BytesIO(data))


def _add_dir(tar: tarfile.TarFile, name: str) -> None:
    ti = tarfile.TarInfo(name)
    ti.type = tarfile.DIRTYPE
    ti.mode = 0o755
    ti.mtime = EPOCH
    ti.uname = ti.gname = ""
    tar.addfile(ti)


def layout_index(images: Sequence[Image]) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The ``index.json`` object of an archive of ``images`` and the JSON blobs it points at.

    Each manifest descriptor carries ``io.containerd.image.name`` (the full reference, what
    ``ctr images import`` names the image) and ``org.opencontainers.image.ref.name`` (its tag,
    as ``docker save`` writes it) plus the platform.  Returns ``(index, {digest: bytes})`` for
    the configs and manifests.
    """
    if not images:
        raise OCIError("an archive needs at least one image")
    refs = [img.ref for img in images]
    if len(set(refs)) != len(refs):
        raise OCIError(f"duplicate references in one archive: {refs}")
    blobs: dict[str, bytes] = {}
    manifests: list[dict[str, Any]] = []
    for img in images:
        cfg = canonical_json(img.config)
        cfg_digest = "sha256:" + hashlib.sha256(cfg).hexdigest()
        diff_ids = img.config.get("rootfs", {}).get("diff_ids")
        if diff_ids != [layer.digest for layer in img.layers]:
            raise OCIError(f"{img.ref}: config rootfs.diff_ids do not match the layers")
        manifest = {
            "schemaVersion": 2,
            "mediaType": MEDIA_MANIFEST,
            "config": {"mediaType": MEDIA_CONFIG, "digest": cfg_digest, "size": len(cfg)},
            "layers": [layer.descriptor() for layer in img.layers],
        }
        man = canonical_json(manifest)
        man_digest = "sha256:" + hashlib.sha256(man).hexdigest()
        blobs[cfg_digest] = cfg
        blobs[man_digest] = man
        manifests.append(
            {
                "mediaType": MEDIA_MANIFEST,
                "digest": man_digest,
                "size": len(man),
                "annotations": {
                    ANNOTATION_CONTAINERD_NAME: img.ref,
                    ANNOTATION_REF_NAME: _ref_tag(img.ref),
                },
                "platform": {
                    "architecture": img.config["architecture"],
                    "os": img.config.get("os", "linux"),
                },
            }
        )
    index = {"schemaVersion": 2, "mediaType": MEDIA_INDEX, "manifests": manifests}
    return index, blobs


def write_archive(out: Path, images: Sequence[Image]) -> None:
    """Write an OCI image-layout tarball of ``images`` (shared layers stored once) at ``out``.

    Contents, in this order: ``oci-layout``, ``index.json``, ``blobs/sha256/<hex>`` sorted by
    digest.  Layer blobs are copied from their files, whose digests are checked on the way.
    Written to ``out`` + ``.tmp`` and renamed, so ``out`` is complete or absent.
    """
    index, json_blobs = layout_index(images)
    layer_files: dict[str, Blob] = {}
    for img in images:
        for layer in img.layers:
            layer_files.setdefault(layer.digest, layer)
    tmp = out.with_name(out.name + ".tmp")
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _add_bytes(tar, "oci-layout", canonical_json({"imageLayoutVersion": "1.0.0"}))
        _add_bytes(tar, "index.json", canonical_json(index))
        _add_dir(tar, "blobs")
        _add_dir(tar, "blobs/sha256")
        for digest in sorted({*json_blobs, *layer_files}):
            name = "blobs/sha256/" + digest.removeprefix("sha256:")
            if digest in json_blobs:
                _add_bytes(tar, name, json_blobs[digest], 0o444)
                continue
            layer = layer_files[digest]
            ti = tarfile.TarInfo(name)
            ti.size = layer.path.stat().st_size
            if ti.size != layer.size:
                raise OCIError(f"{layer.path}: size {ti.size} != {layer.size} recorded")
            ti.mode = 0o444
            ti.mtime = EPOCH
            ti.uname = ti.gname = ""
            with layer.path.open("rb") as src:
                hashing = _HashingReader(src)
                tar.addfile(ti, hashing)
            if "sha256:" + hashing.sha.hexdigest() != digest:
                raise OCIError(f"{layer.path}: content does not match {digest}")
    os.replace(tmp, out)


class _HashingReader:
    """Read-only wrapper that hashes what is read (``tarfile.addfile`` only calls read)."""

    def __init__(self, src: IO[bytes]) -> None:
        self._src = src
        self.sha = hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        data = self._src.read(n)
        self.sha.update(data)
        return data


def read_archive_index(path: Path) -> dict[str, Any]:
    """``index.json`` of an OCI layout tarball (for checks and tests)."""
    with tarfile.open(path) as tar:
        member = tar.extractfile("index.json")
        if member is None:
            raise OCIError(f"{path}: no index.json")
        data: dict[str, Any] = json.load(member)
        return data


def extract_layer(layer: Path, root: Path) -> None:
    """Unpack a layer tar into ``root`` with owners and modes as recorded (needs root for 0:0).

    Uses GNU tar (several times faster than :mod:`tarfile` on ~10k files); whiteouts are not
    interpreted, which is fine for the additive layers this package writes.
    """
    root.mkdir(parents=True, exist_ok=True)
    tar = shutil.which("tar")
    if tar is None:
        raise OCIError("GNU tar is needed to unpack cached layers (apt-get install tar)")
    subprocess.run(
        [tar, "-C", str(root), "--numeric-owner", "-p", "-xf", str(layer)],
        check=True,
    )
