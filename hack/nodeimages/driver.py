"""The driver's images from the repository's ``Dockerfile``, built by buildah, for every
architecture of :data:`ARCHES`, as one OCI archive of three multi-architecture image indexes.

What users build is what CI runs: ``buildah build --target <binary> --platform linux/<arch>`` of
the unchanged ``Dockerfile``, with one difference, the base: users get the digest-pinned
``debian:bookworm-slim`` from Docker Hub, which these machines cannot reach, so CI builds the
same Debian release locally with ``mmdebstrap`` (:func:`ensure_base`, the ``minbase`` variant with
slim's documentation filter) and passes it as ``BASE_IMAGE``.

* buildah runs rootful without a daemon, in a private storage (``<cache>/images/containers``,
  overlay) so nothing touches the host's own container storage; ``--layers`` keeps the
  stages shared by the three targets and by later builds.
* Foreign ``RUN`` steps (arm64 on an amd64 host) run through qemu-user binfmt, registered only
  for the build (:func:`hostsys.binfmt.foreign_arch`).
* A host that reaches PyPI through a TLS-inspecting proxy (its CA in the host's trust store and
  ``/etc/pip.conf``) passes that CA to the build's pip with the ``Dockerfile``'s ``PIP_CERT``
  argument and a ``/tmp`` volume; the file lives in no layer.
* :func:`check_image` opens every built image: the entry points answer ``--version`` with the
  revision of the image's label, and there is no test code, simulator, compiler or pip.

The archive key hashes every input (``Dockerfile``, ``.dockerignore``, the lock, ``pyproject``,
``pkg/``, ``cmd/``, the base's recipe, :data:`RECIPE`): a warm run only hashes.  The revision and
date in the labels are those of the commit that first built these bytes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import time
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hostsys import binfmt

Log = Callable[[str], None]

#: Bump to rebuild the base and driver images after a change of the recipes below.
RECIPE = 1
#: Every driver image is built for these (OCI names).
ARCHES = ("amd64", "arm64")
TARGETS = ("compute-domain-controller", "compute-domain-daemon", "compute-domain-kubelet-plugin")
SUITE = "bookworm"
#: What Docker's ``debian:<suite>-slim`` leaves out (its /etc/dpkg/dpkg.cfg.d/docker), so the
#: local base and the published one install packages the same way.
SLIM_DPKG_FILTER = (
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*",
    "path-include=/usr/share/locale/locale.alias",
    "path-exclude=/usr/share/lintian/*",
)
#: Repository paths the build context holds (what ``.dockerignore`` lets through).
CONTEXT = ("Dockerfile", ".dockerignore", "pyproject.toml", "hack/image-requirements.txt")
CONTEXT_DIRS = ("pkg", "cmd")
IGNORED = {"__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache"}
APP = "/opt/compute-domain-driver"
#: Nothing of these may be in an image (relative to its root): test code, the IMEX simulator,
#: compilers, pip.
FORBIDDEN = (
    "opt/compute-domain-driver/pkg/testing",
    "opt/compute-domain-driver/pkg/imex/sim",
    "opt/compute-domain-driver/test",
    "opt/venv/bin/pip",
    "opt/venv/lib/python3.11/site-packages/pip",
    "usr/lib/python3/dist-packages/pip",
    "usr/bin/pip3",
    "usr/bin/gcc",
    "usr/bin/cc",
    "usr/bin/x86_64-linux-gnu-gcc-12",
    "usr/bin/aarch64-linux-gnu-gcc-12",
    "usr/lib/python3.11/ensurepip",
)
#: Past this size the storage's cached build layers are pruned (a build adds ~0.1 GB to them).
STORAGE_CAP = 6 << 30
#: The host's pip trust, passed to the build's pip (see the module docstring).
HOST_PIP_CONF = Path("/etc/pip.conf")


class ImageError(RuntimeError):
    """A driver image could not be built or failed its check (the message says why)."""


class Buildah:
    """``buildah`` on a private storage root; every call raises :class:`ImageError` on failure."""

    def __init__(self, storage: Path, log: Log) -> None:
        exe = shutil.which("buildah")
        if exe is None:
            raise ImageError("`buildah` not found: apt-get install buildah (hack/node-deps.sh)")
        self.storage = storage
        self._base = [
            exe,
            "--root",
            str(storage / "storage"),
            "--runroot",
            str(storage / "run"),
            "--storage-driver",
            "overlay",
        ]
        self._log = log

    def __call__(self, *args: str, cwd: Path | None = None, timeout: float = 3600) -> str:
        """Run ``buildah <args>``; returns stdout."""
        done = subprocess.run(
            [*self._base, *args],
            cwd=cwd,
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
        )
        if done.returncode != 0:
            raise ImageError(
                f"`buildah {' '.join(args[:3])} ...` exited {done.returncode}:\n"
                f"{(done.stdout + done.stderr)[-6000:]}"
            )
        return done.stdout

    def exists(self, ref: str) -> bool:
        """Whether the storage holds an image named ``ref``."""
        done = subprocess.run(
            [*self._base, "images", "--quiet", ref], capture_output=True, text=True, check=False
        )
        return done.returncode == 0 and bool(done.stdout.strip())


@dataclass(frozen=True)
class Revision:
    """What the images' labels and ``build-info.json`` say about the build."""

    version: str
    revision: str
    created: str


def _sha(*parts: object) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(json.dumps(p, sort_keys=True, default=str).encode())
        h.update(b"\0")
    return h.hexdigest()


def context_files(repo: Path) -> list[str]:
    """The repository files in the build context (sorted, relative)."""
    files = [f for f in CONTEXT if (repo / f).is_file()]
    for top in CONTEXT_DIRS:
        for dirpath, dirnames, filenames in os.walk(repo / top):
            dirnames[:] = sorted(d for d in dirnames if d not in IGNORED)
            rel = Path(dirpath).relative_to(repo)
            files.extend(str(rel / f) for f in sorted(filenames) if not f.endswith(".pyc"))
    return files


def context_hash(repo: Path) -> str:
    """sha256 over the build context's paths, modes and contents."""
    h = hashlib.sha256()
    for rel in context_files(repo):
        p = repo / rel
        h.update(f"{rel}\0{p.lstat().st_mode & 0o111:o}\0".encode())
        h.update(p.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def base_key(arch: str) -> str:
    """Key of the local Debian base of ``arch``."""
    return _sha(RECIPE, "base", SUITE, arch, SLIM_DPKG_FILTER)[:16]


def base_ref(arch: str) -> str:
    """Name of the local Debian base image of ``arch`` in the private storage."""
    return f"localhost/compute-domain-base:{SUITE}-{arch}-{base_key(arch)}"


def driver_key(repo: Path) -> str:
    """Key of the driver archive: the build context and the bases."""
    return _sha(RECIPE, "driver", context_hash(repo), [base_key(a) for a in ARCHES], TARGETS)


def revision(repo: Path) -> Revision:
    """The version (pyproject.toml), git revision (``unknown`` outside git) and build date."""
    with (repo / "pyproject.toml").open("rb") as f:
        version = str(tomllib.load(f)["project"]["version"])
    done = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    )
    rev = done.stdout.strip() if done.returncode == 0 else "unknown"
    return Revision(version, rev, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))


def ensure_base(b: Buildah, arch: str, work: Path, log: Log) -> str:
    """The local Debian base of ``arch`` (made by ``mmdebstrap`` when missing); its name."""
    ref = base_ref(arch)
    if b.exists(ref):
        return ref
    exe = shutil.which("mmdebstrap")
    if exe is None:
        raise ImageError("`mmdebstrap` not found: apt-get install mmdebstrap (hack/node-deps.sh)")
    tar = work / f"base-{arch}.tar"
    t0 = time.monotonic()
    argv = [exe, "--variant=minbase", f"--arch={arch}", "--quiet"]
    argv += [f"--dpkgopt={opt}" for opt in SLIM_DPKG_FILTER]
    argv += [SUITE, str(tar)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=1800)
    if done.returncode != 0:
        raise ImageError(f"mmdebstrap {arch} exited {done.returncode}:\n{done.stderr[-4000:]}")
    ctr = b("from", "--arch", arch, "scratch").strip()
    try:
        b("add", ctr, str(tar), "/")
        b("config", "--arch", arch, "--os", "linux", "--cmd", "bash", ctr)
        b(
            "config",
            "--env",
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            ctr,
        )
        b("commit", "--quiet", ctr, ref)
    finally:
        b("rm", ctr)
        tar.unlink(missing_ok=True)
    log(f"base {ref}: mmdebstrap {SUITE} {arch} in {time.monotonic() - t0:.0f}s")
    return ref


def _pip_trust(work: Path) -> list[str]:
    """buildah arguments that hand the host's pip CA bundle to the build (or none)."""
    cert: str | None = os.environ.get("PIP_CERT")
    if cert is None and HOST_PIP_CONF.is_file():
        for line in HOST_PIP_CONF.read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "cert" and value.strip():
                cert = value.strip()
    if not cert or not Path(cert).is_file():
        return []
    tmp = work / "build-tmp"
    tmp.mkdir(exist_ok=True)
    tmp.chmod(0o1777)  # the build's /tmp: apt's sandbox user writes there too
    shutil.copyfile(cert, tmp / "host-ca.crt")
    (tmp / "host-ca.crt").chmod(0o644)
    return ["--volume", f"{tmp}:/tmp:rw", "--build-arg", "PIP_CERT=/tmp/host-ca.crt"]


def build_target(
    b: Buildah,
    repo: Path,
    *,
    arch: str,
    target: str,
    tag: str,
    base: str,
    rev: Revision,
    work: Path,
) -> None:
    """``buildah build`` of one ``Dockerfile`` target for one architecture, tagged ``tag``."""
    b(
        "build",
        "--layers",
        "--force-rm",
        "--isolation",
        "chroot",
        "--platform",
        f"linux/{arch}",
        "--target",
        target,
        "--build-arg",
        f"BASE_IMAGE={base}",
        "--build-arg",
        f"VERSION={rev.version}",
        "--build-arg",
        f"REVISION={rev.revision}",
        "--build-arg",
        f"CREATED={rev.created}",
        *_pip_trust(work),
        "--tag",
        tag,
        "--file",
        "Dockerfile",
        ".",
        cwd=repo,
    )


def check_image(b: Buildah, tag: str, target: str, rev: Revision) -> None:
    """Open the built image: its labels name ``rev``, ``<target> --version`` prints the same
    revision, and nothing of :data:`FORBIDDEN` is inside.  Raises :class:`ImageError`."""
    info = json.loads(b("inspect", "--type", "image", tag))
    labels = (info.get("OCIv1") or {}).get("config", {}).get("Labels") or {}
    want = {
        "org.opencontainers.image.version": rev.version,
        "org.opencontainers.image.revision": rev.revision,
        "org.opencontainers.image.title": target,
    }
    wrong = {k: labels.get(k) for k, v in want.items() if labels.get(k) != v}
    if wrong:
        raise ImageError(f"{tag}: labels {wrong}, want {want}")
    ctr = b("from", "--pull-never", tag).strip()
    try:
        root = Path(b("mount", ctr).strip())
        try:
            present = [p for p in FORBIDDEN if (root / p).exists() or (root / p).is_symlink()]
            if present:
                raise ImageError(f"{tag} holds what an image must not: {present}")
        finally:
            b("umount", ctr)
        out = b("run", "--isolation", "chroot", ctr, "--", target, "--version")
    finally:
        b("rm", ctr)
    if rev.revision not in out or rev.version not in out:
        raise ImageError(f"`{target} --version` in {tag} says {out.strip()!r}, not {rev}")


def name_images(index: dict[str, Any], refs: Mapping[str, str]) -> dict[str, Any]:
    """``index`` (an OCI layout's ``index.json`` whose entries buildah named by target) with each
    entry named as ``refs[target]``: ``io.containerd.image.name`` the full reference (what
    ``ctr images import`` names the image), ``org.opencontainers.image.ref.name`` its tag.
    Raises :class:`ImageError` when a target has no entry or an entry is not a target."""
    out: dict[str, Any] = json.loads(json.dumps(index))
    seen: set[str] = set()
    for desc in out.get("manifests") or []:
        ann = desc.setdefault("annotations", {})
        target = ann.get("org.opencontainers.image.ref.name", "")
        if target not in refs:
            raise ImageError(f"OCI layout entry {target!r} is none of {sorted(refs)}")
        ann["io.containerd.image.name"] = refs[target]
        ann["org.opencontainers.image.ref.name"] = refs[target].rsplit(":", 1)[1]
        seen.add(target)
    if seen != set(refs):
        raise ImageError(f"OCI layout lacks {sorted(set(refs) - seen)}")
    return out


def export_archive(
    b: Buildah, refs: Mapping[str, str], tags: Mapping[tuple[str, str], str], out: Path, work: Path
) -> None:
    """One OCI archive at ``out``: per target an image index of its :data:`ARCHES` images,
    named ``refs[target]`` (``io.containerd.image.name``, for ``ctr images import``)."""
    layout = work / "layout"
    shutil.rmtree(layout, ignore_errors=True)
    for target in refs:
        lst = f"localhost/cd-manifest-{target}:{out.stem}"
        if b.exists(lst):
            b("manifest", "rm", lst)
        b("manifest", "create", lst)
        try:
            for arch in ARCHES:
                b("manifest", "add", lst, f"containers-storage:{tags[(target, arch)]}")
            b("manifest", "push", "--all", "--quiet", lst, f"oci:{layout}:{target}")
        finally:
            b("manifest", "rm", lst)
    index_path = layout / "index.json"
    index = name_images(json.loads(index_path.read_text()), refs)
    index_path.write_text(json.dumps(index, separators=(",", ":")))
    tmp = out.with_suffix(".tmp")
    with tarfile.open(tmp, "w") as tar:
        for p in sorted(layout.rglob("*")):
            tar.add(p, arcname=str(p.relative_to(layout)), recursive=False)
    tmp.replace(out)
    shutil.rmtree(layout, ignore_errors=True)


def build_driver_archive(
    repo: Path,
    cache: Path,
    refs: Mapping[str, str],
    out: Path,
    *,
    work: Path,
    log: Log,
    arches: Sequence[str] = ARCHES,
) -> None:
    """Build every target of the ``Dockerfile`` for ``arches``, check each image, and write the
    archive ``out`` (see :func:`export_archive`).  Needs root, buildah, mmdebstrap and, for a
    foreign architecture, qemu-user-static.  Raises :class:`ImageError`."""
    b = Buildah(cache / "containers", log)
    rev = revision(repo)
    key = out.stem.rsplit("-", 1)[-1]
    tags: dict[tuple[str, str], str] = {}
    for arch in arches:
        with binfmt.foreign_arch(arch, log):
            t0 = time.monotonic()
            base = ensure_base(b, arch, work, log)
            for target in TARGETS:
                tag = f"localhost/cd-build-{target}:{arch}-{key}"
                build_target(
                    b, repo, arch=arch, target=target, tag=tag, base=base, rev=rev, work=work
                )
                check_image(b, tag, target, rev)
                tags[(target, arch)] = tag
            log(f"driver images linux/{arch}: built and checked in {time.monotonic() - t0:.0f}s")
    export_archive(b, refs, tags, out, work)
    _prune_storage(b, set(tags.values()) | {base_ref(a) for a in ARCHES}, log)
    log(f"driver archive {out} ({out.stat().st_size / 1e6:.0f} MB)")


def _storage_bytes(storage: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(storage):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def _prune_storage(b: Buildah, keep: set[str], log: Log) -> None:
    """Remove working containers an interrupted build left and earlier builds' tagged images
    (keeping ``keep``); the untagged layers ``--layers`` caches (apt and pip steps, reused by the
    next build) go only once the storage exceeds :data:`STORAGE_CAP`.  Best effort: a failure
    is logged, never raised."""
    try:
        b("rm", "--all")
        out = b("images", "--format", "{{.Name}}:{{.Tag}}")
        for name in out.split():
            if name.startswith("localhost/cd-build-") and name not in keep:
                b("rmi", "--force", name)
        if _storage_bytes(b.storage) > STORAGE_CAP:
            log(f"image storage over {STORAGE_CAP >> 30} GiB: pruning the cached layers")
            b("rmi", "--prune")
    except ImageError as err:
        log(f"pruning the image storage failed (the next build retries): {err}")
