"""Node images of a foreign architecture: the sandbox (pause) image of an arm64 node.

A real node's containerd runs pods only from images of its own platform (its CRI image store is
created for ``platforms.Default()``), so the lane's arm64 node, whose containerd is the arm64
binary run through qemu-user (``hack/build-control-plane.sh``, ``linux-arm64/``), needs an arm64
:data:`~nodeimages.build.PAUSE_IMAGE`.  :func:`build_pause` compiles the same
``build/pause/linux/pause.c`` of the pinned kubernetes module with the same upstream flags as
the host's pause image (:func:`nodeimages.build.pause_cflags`), with Debian's cross compiler
(``gcc-aarch64-linux-gnu`` + ``libc6-dev-arm64-cross``, from ``hack/node-deps.sh``), runs it once
through the qemu binfmt handler (``pause -v``), and writes a single-architecture OCI archive
named :data:`~nodeimages.build.PAUSE_IMAGE`.  :func:`archive_platforms` says which platforms
an archive's images have (a node of a foreign architecture imports only its own).

Cache: ``<cache>/oci/pause-<arch>-<key>.tar`` next to the host's archives; the key hashes the
recipe, pause.c, the cross compiler's version and the flags, so a warm call only hashes and
stats.  Older keys of the same architecture are removed when a new one is written.  No lock is
taken (the caller may hold ``build_all``'s): the archive is written under a unique temporary
name and renamed into place, so concurrent builders of the same key write identical bytes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from hostsys import binfmt

from . import oci
from .build import (
    PAUSE_IMAGE,
    RECIPE,
    BuildError,
    Log,
    _sha,
    default_log,
    pause_cflags,
    pause_source,
)

#: Bump to rebuild the foreign pause images after a change of the recipe below.
FOREIGN_RECIPE = 1
#: OCI architecture -> (GNU triplet of Debian's cross toolchain, ELF ``e_machine``).
CROSS: dict[str, tuple[str, int]] = {
    "arm64": ("aarch64-linux-gnu", 183),  # EM_AARCH64
    "amd64": ("x86_64-linux-gnu", 62),  # EM_X86_64
}
CROSS_PACKAGES = {"arm64": "gcc-aarch64-linux-gnu libc6-dev-arm64-cross"}


def cross_tool(arch: str, tool: str) -> str:
    """The path of ``<triplet>-<tool>`` (``gcc``, ``strip``) for ``arch``; raises
    :class:`BuildError` naming the Debian packages when it is not installed."""
    if arch not in CROSS:
        raise BuildError(f"no cross toolchain known for {arch!r}: one of {sorted(CROSS)}")
    name = f"{CROSS[arch][0]}-{tool}"
    found = shutil.which(name)
    if found is None:
        pkgs = CROSS_PACKAGES.get(arch, f"gcc-{CROSS[arch][0]}")
        raise BuildError(f"`{name}` not found: apt-get install {pkgs} (hack/node-deps.sh)")
    return found


def elf_machine(path: Path) -> int:
    """``e_machine`` of an ELF file (little-endian), or -1 when ``path`` is not ELF."""
    head = path.read_bytes()[:20]
    if len(head) < 20 or head[:4] != b"\x7fELF":
        return -1
    return int.from_bytes(head[18:20], "little")


def pause_key(arch: str, pause_src: Path, gcc: str) -> str:
    """The cache key of the ``arch`` pause archive: recipes, source, compiler, flags."""
    version = subprocess.run([gcc, "--version"], capture_output=True, text=True, check=True)
    return _sha(
        RECIPE,
        FOREIGN_RECIPE,
        "pause",
        arch,
        pause_src.read_bytes(),
        version.stdout.splitlines()[0],
        pause_cflags(),
    )


def pause_archive(cache: Path, arch: str, key: str) -> Path:
    """Where the ``arch`` pause archive of ``key`` is cached under ``cache`` (``images/``)."""
    return cache / "oci" / f"pause-{arch}-{key[:32]}.tar"


def _compile(arch: str, src: Path, out: Path, log: Log) -> None:
    gcc = cross_tool(arch, "gcc")
    done = subprocess.run(
        [gcc, *pause_cflags(), "-o", str(out), str(src)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise BuildError(
            f"{Path(gcc).name} -static {src} failed "
            f"(needs {CROSS_PACKAGES.get(arch, 'the cross compiler')}):\n{done.stderr}"
        )
    subprocess.run([cross_tool(arch, "strip"), str(out)], check=False, capture_output=True)
    out.chmod(0o755)
    if elf_machine(out) != CROSS[arch][1]:
        raise BuildError(f"{out} is not an ELF executable for {arch}")
    # Run it once, through qemu-user where arch is foreign: the compiled pause really starts.
    try:
        with binfmt.foreign_arch(arch, log):
            ver = subprocess.run([str(out), "-v"], capture_output=True, text=True, check=False)
    except binfmt.BinfmtError as err:
        raise BuildError(f"cannot run the {arch} pause to check it: {err}") from err
    if ver.returncode != 0 or "pause.c" not in ver.stdout:
        raise BuildError(f"compiled {arch} pause does not run: {ver.stdout}{ver.stderr}")


def _prune(cache: Path, arch: str, keep: Path) -> None:
    for p in (cache / "oci").glob(f"pause-{arch}-*.tar"):
        if p != keep:
            p.unlink(missing_ok=True)


def _platform(desc: dict[str, Any]) -> str:
    plat = desc.get("platform") or {}
    out = f"{plat.get('os', '')}/{plat.get('architecture', '')}"
    return out + (f"/{plat['variant']}" if plat.get("variant") else "")


def archive_platforms(archive: Path) -> dict[str, list[str]]:
    """``{image reference: [platform, ...]}`` of an OCI archive: per ``index.json`` entry named
    ``io.containerd.image.name``, the platforms of its manifests (an image index: those of its
    entries, ``linux/arm64``; a manifest: its descriptor's, or its config's when the descriptor
    has none).  Raises :class:`BuildError` when the archive is not an OCI layout."""

    def blob(tar: tarfile.TarFile, digest: str) -> dict[str, Any]:
        member = tar.extractfile("blobs/sha256/" + digest.removeprefix("sha256:"))
        if member is None:
            raise BuildError(f"{archive}: blob {digest} missing")
        data: dict[str, Any] = json.load(member)
        return data

    def platforms(tar: tarfile.TarFile, desc: dict[str, Any]) -> list[str]:
        if desc.get("mediaType") == oci.MEDIA_INDEX:
            nested = blob(tar, desc["digest"])
            return [p for d in nested.get("manifests", []) for p in platforms(tar, d)]
        if desc.get("platform"):
            return [_platform(desc)]
        config = blob(tar, blob(tar, desc["digest"])["config"]["digest"])
        return [_platform({"platform": config})]

    try:
        with tarfile.open(archive) as tar:
            member = tar.extractfile("index.json")
            if member is None:
                raise BuildError(f"{archive}: no index.json")
            out: dict[str, list[str]] = {}
            for desc in json.load(member).get("manifests", []):
                ref = (desc.get("annotations") or {}).get(oci.ANNOTATION_CONTAINERD_NAME)
                if ref:
                    found = [p for p in platforms(tar, desc) if p != "unknown/unknown"]
                    out.setdefault(ref, []).extend(found)
            return out
    except (OSError, KeyError, ValueError, tarfile.TarError) as err:
        raise BuildError(f"{archive} is not a readable OCI archive: {err}") from err


def build_pause(cache: Path, arch: str, log: Log = default_log) -> Path:
    """The OCI archive of :data:`~nodeimages.build.PAUSE_IMAGE` for ``arch`` (OCI name,
    ``arm64``), built or reused; returns its path.

    ``cache`` is the images cache (:func:`nodeimages.images_dir`, what ``build_all`` uses).  The
    archive holds one linux/``arch`` manifest (entrypoint ``/pause``, user 65535, as the host's
    pause image), named ``PAUSE_IMAGE`` (``io.containerd.image.name``).  Building needs the cross
    compiler of ``arch``, root and qemu-user-static (the ``pause -v`` self-check registers the
    binfmt handler for its duration unless it already is) and ``go`` (pause.c comes from the
    kubernetes module).  Raises :class:`BuildError` saying what is missing or failed.
    """
    src = pause_source(log=log)
    key = pause_key(arch, src, cross_tool(arch, "gcc"))
    out = pause_archive(cache, arch, key)
    if out.is_file():
        os.utime(out)
        return out
    t0 = time.monotonic()
    log(f"pause linux/{arch}: cross-compiling {src.name}")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".pause-") as tmp:
        work = Path(tmp)
        root = work / "root"
        root.mkdir()
        _compile(arch, src, root / "pause", log)
        layer = oci.write_layer(root, work / "layer.tar")
        config = oci.image_config(
            layers=[layer],
            architecture=arch,
            entrypoint=["/pause"],
            user="65535:65535",
            history=[f"{CROSS[arch][0]}-gcc {' '.join(pause_cflags())} build/pause/linux/pause.c"],
        )
        staged = work / out.name
        oci.write_archive(staged, [oci.Image(PAUSE_IMAGE, config, [layer])])
        os.replace(staged, out)
    _prune(cache, arch, out)
    log(f"pause linux/{arch}: wrote {out} in {time.monotonic() - t0:.1f}s")
    return out


__all__ = [
    "CROSS",
    "archive_platforms",
    "build_pause",
    "cross_tool",
    "elf_machine",
    "pause_archive",
    "pause_key",
]
