"""Debian packages for the image root filesystems: resolve, download once, unpack.

Versions are the candidates of the host's apt lists (``apt-cache policy``), downloaded with
``apt-get download`` into ``<cache>/debs/`` and reused from there.  ``apt-cache`` needs about
1.5 s on these machines, too slow for a warm no-op build, so a resolution is memoized in
``<cache>/debs/resolved-<key>.json`` keyed by the package names and the size/mtime of every
file in ``/var/lib/apt/lists``: an ``apt-get update`` that changes a list re-resolves.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

APT_LISTS = Path("/var/lib/apt/lists")


class DebError(RuntimeError):
    """A package cannot be resolved, downloaded or unpacked (the message says what to do)."""


def _need(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise DebError(
            f"`{tool}` not found: building node images needs Debian's apt and dpkg "
            "(a Debian/Ubuntu host; the images are assembled from Debian packages)"
        )
    return path


def host_arch() -> str:
    """Debian architecture of the host (``amd64``, ``arm64``, ...): the packages' architecture."""
    out = subprocess.run(
        [_need("dpkg"), "--print-architecture"], check=True, capture_output=True, text=True
    )
    return out.stdout.strip()


def _lists_fingerprint() -> str:
    h = hashlib.sha256()
    if APT_LISTS.is_dir():
        for p in sorted(APT_LISTS.iterdir()):
            if p.is_file() and p.name != "lock":
                st = p.stat()
                h.update(f"{p.name} {st.st_size} {st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def _parse_policy(text: str) -> dict[str, str]:
    """``{package: candidate}`` from ``apt-cache policy`` output (``(none)`` left out)."""
    found: dict[str, str] = {}
    current: str | None = None
    for line in text.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            current = line[:-1].split(":", 1)[0]  # "libc6:" or "libc6:amd64:"
        elif current and line.strip().startswith("Candidate:"):
            cand = line.split(":", 1)[1].strip()
            if cand and cand != "(none)":
                found[current] = cand
    return found


def resolve(packages: Sequence[str], debs_dir: Path) -> dict[str, str]:
    """Candidate version of each package, memoized per state of the apt lists.

    Raises :class:`DebError` naming the packages apt does not know, with the fix
    (``apt-get update``), when the lists are empty or stale.
    """
    debs_dir.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha256(
        ("\n".join(sorted(packages)) + "\n" + _lists_fingerprint()).encode()
    ).hexdigest()[:24]
    memo = debs_dir / f"resolved-{key}.json"
    if memo.is_file():
        data: dict[str, str] = json.loads(memo.read_text())
        return data
    out = subprocess.run(
        [_need("apt-cache"), "policy", *packages], capture_output=True, text=True, check=False
    )
    found = _parse_policy(out.stdout)
    missing = [p for p in packages if p not in found]
    if missing:
        raise DebError(
            f"apt knows no installable version of {', '.join(missing)}. The apt package lists "
            "are missing or stale: run `apt-get update` (as root) and retry."
            + (f"\napt-cache: {out.stderr.strip()}" if out.stderr.strip() else "")
        )
    resolved = {p: found[p] for p in packages}
    for old in debs_dir.glob("resolved-*.json"):
        old.unlink(missing_ok=True)
    tmp = memo.with_suffix(".tmp")
    tmp.write_text(json.dumps(resolved, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, memo)
    return resolved


def apt_update(log: Callable[[str], None]) -> None:
    """``apt-get update``: fresh lists, for a resolution or download that failed on stale ones.

    Raises :class:`DebError` with apt's output when the update itself fails.
    """
    log("apt-get update (package lists missing or stale)")
    out = subprocess.run(
        [_need("apt-get"), "update", "-q"], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise DebError(
            f"`apt-get update` failed (exit {out.returncode}); node images are assembled from "
            f"Debian packages, so this host needs a reachable apt source:\n"
            f"{(out.stdout + out.stderr).strip()[-3000:]}"
        )


def _deb_name(pkg: str, version: str) -> str:
    return f"{pkg}_{version.replace(':', '%3a')}_"


def cached(pkg: str, version: str, debs_dir: Path) -> Path | None:
    """The cached ``.deb`` of ``pkg`` at ``version`` (any architecture), or None."""
    hits = sorted(debs_dir.glob(_deb_name(pkg, version) + "*.deb"))
    return hits[0] if hits else None


def fetch(versions: dict[str, str], debs_dir: Path, log: Callable[[str], None]) -> dict[str, Path]:
    """The ``.deb`` file of every ``{package: version}``, downloading the missing ones.

    One ``apt-get download pkg=version ...`` call into a temp dir next to the cache; each file's
    control fields are checked before it is moved in.  A failed download raises
    :class:`DebError` with apt's output and what to check (apt lists, the package mirror).
    """
    debs_dir.mkdir(parents=True, exist_ok=True)
    result: dict[str, Path] = {}
    todo: list[str] = []
    for pkg, ver in versions.items():
        hit = cached(pkg, ver, debs_dir)
        if hit is None:
            todo.append(pkg)
        else:
            result[pkg] = hit
    if todo:
        log(f"apt-get download {' '.join(todo)}")
        with tempfile.TemporaryDirectory(dir=debs_dir, prefix=".dl-") as tmp:
            os.chmod(tmp, 0o755)
            out = subprocess.run(
                [
                    _need("apt-get"),
                    "download",
                    "-q",
                    "-o",
                    "APT::Sandbox::User=root",
                    *(f"{p}={versions[p]}" for p in todo),
                ],
                cwd=tmp,
                capture_output=True,
                text=True,
                check=False,
            )
            if out.returncode != 0:
                raise DebError(
                    f"`apt-get download {' '.join(todo)}` failed (exit {out.returncode}):\n"
                    f"{(out.stdout + out.stderr).strip()}\n"
                    "Node images are assembled from Debian packages: this host needs a working "
                    "apt source (run `apt-get update`; check /etc/apt/sources.list*)."
                )
            for pkg in todo:
                files = sorted(Path(tmp).glob(f"{pkg}_*.deb"))
                if len(files) != 1:
                    raise DebError(f"apt-get download left {files} for {pkg}")
                got = deb_fields(files[0], "Package", "Version")
                if got != [pkg, versions[pkg]]:
                    raise DebError(f"{files[0]} is {got}, expected {pkg} {versions[pkg]}")
                dest = debs_dir / files[0].name
                os.replace(files[0], dest)
                result[pkg] = dest
    return {p: result[p] for p in versions}


def deb_fields(deb: Path, *fields: str) -> list[str]:
    """Control fields of a ``.deb`` (``dpkg-deb -f``), in the order asked."""
    out = subprocess.run(
        [_need("dpkg-deb"), "-f", str(deb), *fields], check=True, capture_output=True, text=True
    )
    values: dict[str, str] = {}
    for line in out.stdout.splitlines():
        if ":" in line and not line.startswith(" "):
            k, v = line.split(":", 1)
            values[k.strip()] = v.strip()
    if len(fields) == 1 and not values:
        return [out.stdout.strip()]
    return [values.get(f, "") for f in fields]


def unpack(deb: Path, root: Path) -> None:
    """Unpack a package's files into ``root`` (``dpkg-deb -x``: no maintainer scripts run)."""
    subprocess.run([_need("dpkg-deb"), "-x", str(deb), str(root)], check=True)
