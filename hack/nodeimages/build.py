"""Build the node images without Docker: the driver's three, pause and busybox, as OCI archives.

Recipes (see ``docs/e2e-build.md``):

* driver images: the repository's ``Dockerfile``, built by buildah for linux/amd64 and
  linux/arm64 (:mod:`nodeimages.driver`), one archive holding the three multi-architecture
  image indexes named as ``config/default``'s ``images:``;
* :data:`PAUSE_IMAGE`: ``build/pause/linux/pause.c`` of the pinned ``k8s.io/kubernetes`` module,
  ``gcc -static`` with upstream's flags, entrypoint ``/pause``, user 65535;
* :data:`BUSYBOX_IMAGE`: Debian's ``busybox-static`` with a symlink per applet.

Pause and busybox are the two images the ``Dockerfile`` cannot make here (their upstream images
come from registries these machines cannot reach).

Cache (``<cache>/images``): ``debs/`` downloaded packages; ``layers/<kind>-<key>.tar`` layer
blobs; ``oci/<name>-<key>.tar`` the archives; ``containers/`` buildah's storage.  Every key hashes
the inputs (package versions, build context, compiler version, recipe numbers), so a warm call
only hashes and stats files.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from . import debs, driver, oci
from .driver import TARGETS

REPO = Path(__file__).resolve().parents[2]
#: Bump to rebuild every layer and archive after a change of the recipes below.
RECIPE = 2

#: The sandbox image containerd v2.4 (``DefaultSandboxImage``) and kubeadm 1.37
#: (``PauseVersion``) default to; the real-node containerd config pins this name.
PAUSE_VERSION = "3.10.2"
PAUSE_IMAGE = f"registry.k8s.io/pause:{PAUSE_VERSION}"
#: What a workload's ``image: busybox:1.37`` normalizes to.
BUSYBOX_IMAGE = "docker.io/library/busybox:1.37"

BASE_PATH_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}

BUSYBOX_DEB = "busybox-static"
BUSYBOX_PASSWD = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/home:/bin/false\n"
BUSYBOX_GROUP = "root:x:0:\nnogroup:x:65534:\n"

Log = Callable[[str], None]


class BuildError(RuntimeError):
    """A node image could not be built; the message says what failed and what to do."""


def default_log(msg: str) -> None:
    """Progress line on stderr: ``[HH:MM:SS] build-node-images: msg``."""
    print(f"[{time.strftime('%H:%M:%S')}] build-node-images: {msg}", file=sys.stderr, flush=True)


def cache_root(cache_dir: Path | None = None) -> Path:
    """The e2e cache root: ``cache_dir``, else ``$CD_E2E_CACHE``, else the default dir.

    The default is ``~/.cache/compute-domain-e2e``, as in ``hack/build-control-plane.sh``.
    """
    if cache_dir is not None:
        return Path(cache_dir)
    env = os.environ.get("CD_E2E_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "compute-domain-e2e"


def driver_image_refs(repo: Path = REPO) -> dict[str, str]:
    """``{target: "name:tag"}`` from the ``images:`` of ``config/default/kustomization.yaml``.

    Each entry's ``name`` ends in ``/<target>``; ``newName``/``newTag`` give the reference (the
    same references ``hack/build-images.sh --print`` prints).  Raises :class:`BuildError` when a
    target has no entry.
    """
    kust = yaml.safe_load((repo / "config" / "default" / "kustomization.yaml").read_text())
    refs: dict[str, str] = {}
    for entry in kust.get("images") or []:
        target = str(entry["name"]).rsplit("/", 1)[-1]
        if target in TARGETS:
            name = entry.get("newName", entry["name"])
            tag = entry.get("newTag", "latest")
            refs[target] = f"{name}:{tag}"
    missing = [t for t in TARGETS if t not in refs]
    if missing:
        raise BuildError(f"config/default/kustomization.yaml has no images: entry for {missing}")
    return {t: refs[t] for t in TARGETS}


def _sha(*parts: object) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(json.dumps(p, sort_keys=True, default=str).encode())
        h.update(b"\0")
    return h.hexdigest()


def _go() -> str:
    go = shutil.which("go") or (
        "/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists() else None
    )
    if go is None:
        raise BuildError("`go` not found: the pause image is compiled from the kubernetes module")
    return go


def _go_env() -> dict[str, str]:
    return {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": os.environ.get("GOFLAGS", "-mod=mod")}


def k8s_version(repo: Path = REPO) -> str:
    """The ``k8s.io/kubernetes`` version pinned by ``hack/kube/go.mod``."""
    for line in (repo / "hack" / "kube" / "go.mod").read_text().splitlines():
        words = line.replace("require", " ").split()
        if len(words) >= 2 and words[0] == "k8s.io/kubernetes" and words[1].startswith("v"):
            return words[1]
    raise BuildError("hack/kube/go.mod pins no k8s.io/kubernetes version")


def pause_source(repo: Path = REPO, log: Log = default_log) -> Path:
    """``build/pause/linux/pause.c`` of the pinned kubernetes module, downloading it if needed."""
    version = k8s_version(repo)
    modcache = (
        os.environ.get("GOMODCACHE")
        or subprocess.run(
            [_go(), "env", "GOMODCACHE"], capture_output=True, text=True, check=True, env=_go_env()
        ).stdout.strip()
    )
    src = Path(modcache) / f"k8s.io/kubernetes@{version}" / "build/pause/linux/pause.c"
    if not src.is_file():
        log(f"go mod download k8s.io/kubernetes@{version} (for pause.c)")
        done = subprocess.run(
            [_go(), "mod", "download", f"k8s.io/kubernetes@{version}"],
            cwd=repo / "hack" / "kube",
            capture_output=True,
            text=True,
            check=False,
            env=_go_env(),
        )
        if done.returncode != 0 or not src.is_file():
            raise BuildError(
                f"cannot get {src} (`go mod download` in hack/kube exited {done.returncode}: "
                f"{done.stderr.strip()}); the Go module proxy must be reachable"
            )
    return src


def _gcc_version() -> str:
    gcc = shutil.which("gcc")
    if gcc is None:
        raise BuildError("`gcc` not found: apt-get install gcc libc6-dev (to compile pause.c)")
    out = subprocess.run([gcc, "--version"], capture_output=True, text=True, check=True)
    return out.stdout.splitlines()[0]


@dataclass
class Plan:
    """Inputs and keys of one build: what the cached files are named after."""

    cache: Path
    repo: Path
    arch: str
    debs: dict[str, str]
    driver_refs: dict[str, str]
    pause_src: Path
    keys: dict[str, str] = field(default_factory=dict)

    @property
    def oci_arch(self) -> str:
        """OCI architecture name (Debian's amd64/arm64 names are the same)."""
        return {"i386": "386", "armhf": "arm", "ppc64el": "ppc64le"}.get(self.arch, self.arch)

    def layer(self, kind: str) -> Path:
        """Cached layer tar of ``kind`` (base, deps, app, pause, busybox)."""
        return self.cache / "layers" / f"{kind}-{self.keys[kind][:32]}.tar"

    def archive(self, name: str) -> Path:
        """Cached OCI archive of ``name`` (compute-domain-driver, pause, busybox)."""
        return self.cache / "oci" / f"{name}-{self.keys[name][:32]}.tar"

    def outputs(self) -> dict[str, Path]:
        """``{image reference: archive}`` for every image this plan builds."""
        out = {ref: self.archive("compute-domain-driver") for ref in self.driver_refs.values()}
        out[PAUSE_IMAGE] = self.archive("pause")
        out[BUSYBOX_IMAGE] = self.archive("busybox")
        return out


def make_plan(cache: Path, repo: Path = REPO, log: Log = default_log) -> Plan:
    """Resolve every input (apt candidates, repo files, pause.c, compiler) and derive the keys."""
    arch = debs.host_arch()
    versions = debs.resolve((BUSYBOX_DEB,), cache / "debs")
    plan = Plan(
        cache=cache,
        repo=repo,
        arch=arch,
        debs=versions,
        driver_refs=driver_image_refs(repo),
        pause_src=pause_source(repo, log),
    )
    k = plan.keys
    k["compute-domain-driver"] = _sha(RECIPE, driver.driver_key(repo), plan.driver_refs)
    k["pause"] = _sha(
        RECIPE, "pause", arch, plan.pause_src.read_bytes(), _gcc_version(), pause_cflags(repo)
    )
    k["busybox"] = _sha(RECIPE, "busybox", arch, versions[BUSYBOX_DEB], BUSYBOX_PASSWD)
    return plan


def pause_cflags(repo: Path = REPO) -> list[str]:
    """Upstream's pause ``CFLAGS`` (``build/pause/Makefile``) with the version it stamps."""
    return ["-Os", "-Wall", "-Werror", "-static", f"-DVERSION=v{PAUSE_VERSION}-{k8s_version(repo)}"]


# --- running things in the image root ----------------------------------------------------------


def chroot(
    root: Path,
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    user: str = "0:0",
    cwd: str = "/",
    check: bool = True,
    what: str = "",
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` inside ``root`` (``chroot --userspec``) with exactly ``env``, from ``cwd``.

    With ``check`` a non-zero exit raises :class:`BuildError` quoting the command and its output.
    """
    script = 'cd "$1" && shift && exec "$@"'
    cmd = ["chroot", f"--userspec={user}", str(root), "/bin/sh", "-c", script, "sh", cwd, *argv]
    done = subprocess.run(
        cmd,
        env=dict(env if env is not None else BASE_PATH_ENV),
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    if check and done.returncode != 0:
        raise BuildError(
            f"{what or 'image self-check'} failed: `{' '.join(argv)}` (user {user}, cwd {cwd}) "
            f"exited {done.returncode} in {root}:\n{(done.stdout + done.stderr)[-4000:]}"
        )
    return done


def _symlink(target: str, link: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.exists() and not link.is_symlink():
        link.symlink_to(target)


def _busybox_applets(root: Path) -> None:
    """A symlink to ``/bin/busybox`` per applet (``busybox --list-full``), where nothing is."""
    out = subprocess.run(
        [str(root / "bin" / "busybox"), "--list-full"], capture_output=True, text=True, check=True
    )
    for rel in out.stdout.split():
        _symlink("/bin/busybox", root / rel)


def _base_files(root: Path, passwd: str, group: str) -> None:
    etc = root / "etc"
    etc.mkdir(parents=True, exist_ok=True)
    (etc / "passwd").write_text(passwd)
    (etc / "group").write_text(group)
    for name in ("passwd", "group"):
        (etc / name).chmod(0o644)
    tmp = root / "tmp"
    tmp.mkdir(exist_ok=True)
    tmp.chmod(0o1777)
    home = root / "root"
    home.mkdir(exist_ok=True)
    home.chmod(0o700)


# --- driver layers --------------------------------------------------------------------------


# --- cache plumbing ---------------------------------------------------------------------------


def _cached_blob(path: Path) -> oci.Blob | None:
    meta = path.with_suffix(".json")
    if not (path.is_file() and meta.is_file()):
        return None
    data = json.loads(meta.read_text())
    return oci.Blob(path, str(data["digest"]), int(data["size"]))


def _store_blob(blob: oci.Blob) -> oci.Blob:
    meta = blob.path.with_suffix(".json")
    tmp = meta.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"digest": blob.digest, "size": blob.size}) + "\n")
    os.replace(tmp, meta)
    return blob


def _layer(
    plan: Plan,
    kind: str,
    root: Path,
    build: Callable[[], None],
    *,
    log: Log,
    include: Sequence[str] | None = None,
) -> oci.Blob:
    """The cached ``kind`` layer unpacked into ``root``, or ``build()`` it there and cache it."""
    path = plan.layer(kind)
    blob = _cached_blob(path)
    if blob is not None:
        log(f"{kind} layer: cached {path.name}, unpacking")
        oci.extract_layer(path, root)
        return blob
    t0 = time.monotonic()
    log(f"{kind} layer: building")
    build()
    path.parent.mkdir(parents=True, exist_ok=True)
    blob = _store_blob(oci.write_layer(root, path, include=include))
    log(f"{kind} layer: {blob.size / 1e6:.1f} MB, {time.monotonic() - t0:.0f}s")
    return blob


def _build_pause(plan: Plan, work: Path, log: Log) -> None:
    root = work / "pause"
    root.mkdir()

    def build() -> None:
        gcc = shutil.which("gcc") or "gcc"
        out = root / "pause"
        done = subprocess.run(
            [gcc, *pause_cflags(plan.repo), "-o", str(out), str(plan.pause_src)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise BuildError(
                f"gcc -static {plan.pause_src} failed (needs gcc and libc6-dev):\n{done.stderr}"
            )
        subprocess.run(["strip", str(out)], check=False, capture_output=True)
        out.chmod(0o755)
        ver = subprocess.run([str(out), "-v"], capture_output=True, text=True, check=False)
        if ver.returncode != 0 or "pause.c" not in ver.stdout:
            raise BuildError(f"compiled pause does not run: {ver.stdout}{ver.stderr}")

    layer = _layer(plan, "pause", root, build, log=log)
    config = oci.image_config(
        layers=[layer],
        architecture=plan.oci_arch,
        entrypoint=["/pause"],
        user="65535:65535",
        history=[f"gcc {' '.join(pause_cflags(plan.repo))} build/pause/linux/pause.c"],
    )
    _write_archive(plan, "pause", [oci.Image(PAUSE_IMAGE, config, [layer])], log)


def _build_busybox(plan: Plan, deb: Path, work: Path, log: Log) -> None:
    root = work / "busybox"
    root.mkdir()

    def build() -> None:
        unpacked = work / "busybox-deb"
        debs.unpack(deb, unpacked)
        (root / "bin").mkdir()
        shutil.copy2(unpacked / "bin" / "busybox", root / "bin" / "busybox")
        (root / "bin" / "busybox").chmod(0o755)
        _busybox_applets(root)
        _base_files(root, BUSYBOX_PASSWD, BUSYBOX_GROUP)
        probe = chroot(root, ["sh", "-c", "echo ok"], what="busybox sh")
        if probe.stdout.strip() != "ok":
            raise BuildError(f"busybox sh printed {probe.stdout!r}")

    layer = _layer(plan, "busybox", root, build, log=log)
    config = oci.image_config(
        layers=[layer],
        architecture=plan.oci_arch,
        cmd=["sh"],
        env=BASE_PATH_ENV,
        history=[f"debian {BUSYBOX_DEB}={plan.debs[BUSYBOX_DEB]}: /bin/busybox + applet links"],
    )
    _write_archive(plan, "busybox", [oci.Image(BUSYBOX_IMAGE, config, [layer])], log)


def _write_archive(plan: Plan, name: str, images: Sequence[oci.Image], log: Log) -> None:
    out = plan.archive(name)
    out.parent.mkdir(parents=True, exist_ok=True)
    oci.write_archive(out, images)
    log(f"{name}: wrote {out} ({out.stat().st_size / 1e6:.1f} MB)")


@contextlib.contextmanager
def _locked(cache: Path) -> Iterator[None]:
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / ".lock").open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _prune(plan: Plan) -> None:
    """Drop old layers and archives: per kind, keep the current ones and the most recently used
    others (two layers, one archive: a driver archive is 250 MB)."""
    current = {plan.layer(k).name for k in ("pause", "busybox")}
    current |= {p.name for p in plan.outputs().values()}
    for sub, keep in (("layers", 2), ("oci", 1)):
        d = plan.cache / sub
        if not d.is_dir():
            continue
        groups: dict[str, list[Path]] = {}
        for p in d.glob("*.tar"):
            groups.setdefault(p.name.rsplit("-", 1)[0], []).append(p)
        for paths in groups.values():
            stale = [p for p in paths if p.name not in current]
            stale.sort(key=lambda p: p.stat().st_mtime, reverse=True)
            for p in stale[keep:]:
                p.unlink(missing_ok=True)
                p.with_suffix(".json").unlink(missing_ok=True)


def images_dir(cache_dir: Path | None = None) -> Path:
    """Where images are cached: ``<cache root>/images`` (see :func:`cache_root`)."""
    return cache_root(cache_dir) / "images"


def is_fresh(cache_dir: Path | None = None, repo: Path = REPO) -> bool:
    """True iff every archive for the current inputs is already cached (nothing to build)."""
    plan = make_plan(images_dir(cache_dir), repo, lambda _msg: None)
    return all(p.is_file() for p in plan.outputs().values())


def build_all(
    cache_dir: Path | None = None, *, repo: Path = REPO, log: Log = default_log
) -> dict[str, Path]:
    """Build (or reuse) every node image; returns ``{image reference: OCI archive path}``.

    ``cache_dir`` is the e2e cache root (default ``$CD_E2E_CACHE`` or
    ``~/.cache/compute-domain-e2e``); images live in its ``images/`` subdirectory.  The three
    driver references map to one archive holding their multi-architecture image indexes
    (shared layers stored once); :data:`PAUSE_IMAGE` and :data:`BUSYBOX_IMAGE` have their own.
    A warm call (all archives cached for the current inputs) only hashes inputs and stats files.
    Building needs root, buildah, mmdebstrap and qemu-user-static (the driver images), apt/dpkg
    with current lists, gcc with static libc and go (for the kubernetes module's pause.c); any
    failure raises :class:`BuildError` (or :class:`nodeimages.debs.DebError`) saying what is
    missing.
    """
    cache = images_dir(cache_dir)
    try:
        plan = make_plan(cache, repo, log)
    except debs.DebError:
        if os.geteuid() != 0:
            raise
        debs.apt_update(log)  # no lists yet (fresh machine) or stale ones
        plan = make_plan(cache, repo, log)
    outputs = plan.outputs()
    if all(p.is_file() for p in outputs.values()):
        for p in set(outputs.values()):
            os.utime(p)
        return outputs
    if os.geteuid() != 0:
        raise BuildError("building node images needs root (chroot self-check, file owners 0:0)")
    t0 = time.monotonic()
    with _locked(cache):
        plan = make_plan(cache, repo, log)
        outputs = plan.outputs()
        missing = {p for p in outputs.values() if not p.is_file()}
        if missing:
            tmp_parent = cache / "tmp"
            # Under the lock nobody else builds: whatever an interrupted build left is garbage.
            shutil.rmtree(tmp_parent, ignore_errors=True)
            for sub in ("layers", "oci"):
                for partial in (cache / sub).glob("*.tmp"):
                    partial.unlink(missing_ok=True)
            tmp_parent.mkdir(parents=True, exist_ok=True)
            try:
                deb_files = debs.fetch(plan.debs, cache / "debs", log)
            except debs.DebError as err:  # stale lists name versions the mirror dropped
                log(f"download failed, refreshing the package lists: {str(err).splitlines()[0]}")
                debs.apt_update(log)
                plan = make_plan(cache, repo, log)
                outputs = plan.outputs()
                missing = {p for p in outputs.values() if not p.is_file()}
                deb_files = debs.fetch(plan.debs, cache / "debs", log)
            with tempfile.TemporaryDirectory(dir=tmp_parent) as tmp:
                work = Path(tmp)
                out = plan.archive("compute-domain-driver")
                if out in missing:
                    out.parent.mkdir(parents=True, exist_ok=True)
                    try:
                        driver.build_driver_archive(
                            plan.repo, cache, plan.driver_refs, out, work=work, log=log
                        )
                    except driver.ImageError as err:
                        raise BuildError(str(err)) from err
                if plan.archive("pause") in missing:
                    _build_pause(plan, work, log)
                if plan.archive("busybox") in missing:
                    _build_busybox(plan, deb_files[BUSYBOX_DEB], work, log)
            _prune(plan)
            log(f"done in {time.monotonic() - t0:.0f}s")
    return outputs
