"""Build the node images without Docker: driver images, pause, busybox, as OCI archives.

Recipes (see ``docs/e2e-build.md``):

* driver images (one archive holding the three images of ``config/default``'s ``images:``), the
  layout of the ``Dockerfile`` targets, in three layers shared by all three images:

  - ``base``: Debian packages of :data:`RUNTIME_DEBS` unpacked with ``dpkg-deb -x`` (the Python
    3.11 runtime and its shared libraries, busybox-static as ``/bin/sh`` and ``/usr/bin/env``),
    ``/etc/passwd`` and ``/etc/group`` with ``nonroot`` (65532), ``/etc/nsswitch.conf``, the
    standard library byte-compiled;
  - ``deps``: ``/opt/venv``, a hand-made venv (``pyvenv.cfg``, ``bin/python`` ->
    ``/usr/bin/python3.11``) with the pinned wheels of ``hack/image-requirements.txt``;
  - ``app``: ``/opt/compute-domain-driver`` with ``pkg/``, ``cmd/`` and the ``bin/`` wrappers.

  Each build is checked in a ``chroot`` before it is cached: imports, every entry point's
  ``--help`` as the image's user, ``/usr/bin/env python3``, and that every ELF object finds its
  shared libraries.
* :data:`PAUSE_IMAGE`: ``build/pause/linux/pause.c`` of the pinned ``k8s.io/kubernetes`` module,
  ``gcc -static`` with upstream's flags, entrypoint ``/pause``, user 65535.
* :data:`BUSYBOX_IMAGE`: Debian's ``busybox-static`` with a symlink per applet.

Cache (``<cache>/images``): ``debs/`` downloaded packages; ``layers/<kind>-<key>.tar`` layer
blobs; ``oci/<name>-<key>.tar`` the archives.  Every key hashes the inputs (package versions,
requirements, repository files, compiler version, recipe number), so a warm call only hashes
and stats files.
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
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from . import debs, oci

REPO = Path(__file__).resolve().parents[2]
#: Bump to rebuild every layer and archive after a change of the recipes below.
RECIPE = 1

#: The sandbox image containerd v2.4 (``DefaultSandboxImage``) and kubeadm 1.37
#: (``PauseVersion``) default to; the real-node containerd config pins this name.
PAUSE_VERSION = "3.10.2"
PAUSE_IMAGE = f"registry.k8s.io/pause:{PAUSE_VERSION}"
#: What a workload's ``image: busybox:1.37`` normalizes to.
BUSYBOX_IMAGE = "docker.io/library/busybox:1.37"

#: The Dockerfile's final targets (one image each), in the order of the Dockerfile.
TARGETS = ("compute-domain-controller", "compute-domain-daemon", "compute-domain-kubelet-plugin")
#: USER of each target, as in the Dockerfile: only the controller runs unprivileged.
TARGET_USERS = {
    "compute-domain-controller": "65532:65532",
    "compute-domain-daemon": "0:0",
    "compute-domain-kubelet-plugin": "0:0",
}
TARGET_DESCRIPTIONS = {
    "compute-domain-controller": "ComputeDomain controller (Kubernetes DRA, NVIDIA IMEX)",
    "compute-domain-daemon": "Per-node IMEX daemon of a ComputeDomain",
    "compute-domain-kubelet-plugin": "ComputeDomain DRA kubelet plugin (IMEX channels)",
}
PYTHON = "python3.11"
VENV = "/opt/venv"
APP = "/opt/compute-domain-driver"
#: ENV of the Dockerfile's runtime stage (plus the LANG its python base image sets).
DRIVER_ENV = {
    "PATH": f"{APP}/bin:{VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "PYTHONPATH": APP,
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONUNBUFFERED": "1",
    "LANG": "C.UTF-8",
}
BASE_PATH_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}

#: The run-time closure of ``python3.11`` for the driver (``apt-cache depends`` minus what is
#: only needed by modules the driver never imports: sqlite3, readline, curses, dbm, nis, crypt).
RUNTIME_DEBS = (
    "libc6",
    "libgcc-s1",
    "libstdc++6",
    "zlib1g",
    "libexpat1",
    "libffi8",
    "libssl3",
    "libbz2-1.0",
    "liblzma5",
    "libuuid1",
    "libpython3.11-minimal",
    "libpython3.11-stdlib",
    "python3.11-minimal",
    "netbase",
    "busybox-static",
)
BUSYBOX_DEB = "busybox-static"
#: Documentation and packaging metadata dropped from the base layer.
TRIM = ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/lintian", "usr/share/bug")
#: What the Dockerfile's build context admits from ``pkg/`` and ``cmd/`` (``.dockerignore``).
APP_DIRS = ("pkg", "cmd")
IGNORED_DIRS = {"__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache"}
#: Third-party modules the driver imports at run time (the self-check imports them).
RUNTIME_IMPORTS = (
    "ssl",
    "ctypes",
    "grpc",
    "kubernetes",
    "google.protobuf",
    "prometheus_client",
    "opentelemetry.sdk",
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "cachetools",
    "yaml",
    "pynvml",
)
PASSWD = (
    "root:x:0:0:root:/root:/bin/sh\n"
    "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    "nonroot:x:65532:65532:nonroot:/nonexistent:/usr/sbin/nologin\n"
)
GROUP = "root:x:0:\nnogroup:x:65534:\nnonroot:x:65532:\n"
NSSWITCH = (
    "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\n"
    "protocols: files\nservices: files\nethers: files\nrpc: files\n"
)
BUSYBOX_PASSWD = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/home:/bin/false\n"
BUSYBOX_GROUP = "root:x:0:\nnogroup:x:65534:\n"
#: Manylinux platform tags the wheels may carry (glibc 2.36 = bookworm); pip does not expand a
#: single ``--platform`` to the older ones.
MANYLINUX_GLIBC_MINOR = 36

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


def app_files(repo: Path = REPO) -> list[str]:
    """Repository files that go into the app layer: ``pkg/`` and ``cmd/`` minus caches."""
    files: list[str] = []
    for top in APP_DIRS:
        for dirpath, dirnames, filenames in os.walk(repo / top):
            dirnames[:] = sorted(d for d in dirnames if d not in IGNORED_DIRS)
            rel = Path(dirpath).relative_to(repo)
            files.extend(str(rel / f) for f in sorted(filenames) if not f.endswith(".pyc"))
    return files


def _tree_hash(repo: Path, files: Sequence[str]) -> str:
    h = hashlib.sha256()
    for rel in files:
        p = repo / rel
        st = p.lstat()
        h.update(f"{rel}\0{st.st_mode & 0o111:o}\0".encode())
        h.update(os.readlink(p).encode() if p.is_symlink() else p.read_bytes())
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
    version: str
    app_files: list[str]
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
    versions = debs.resolve(RUNTIME_DEBS, cache / "debs")
    with (repo / "pyproject.toml").open("rb") as f:
        version = str(tomllib.load(f)["project"]["version"])
    files = app_files(repo)
    plan = Plan(
        cache=cache,
        repo=repo,
        arch=arch,
        debs=versions,
        driver_refs=driver_image_refs(repo),
        version=version,
        app_files=files,
        pause_src=pause_source(repo, log),
    )
    k = plan.keys
    k["base"] = _sha(RECIPE, "base", arch, versions, PASSWD, GROUP, NSSWITCH, TRIM)
    requirements = (repo / "hack" / "image-requirements.txt").read_text()
    k["deps"] = _sha(RECIPE, "deps", k["base"], requirements, MANYLINUX_GLIBC_MINOR)
    k["app"] = _sha(RECIPE, "app", k["base"], _tree_hash(repo, files), TARGETS)
    k["compute-domain-driver"] = _sha(
        RECIPE,
        "driver",
        k["base"],
        k["deps"],
        k["app"],
        [driver_config_args(t, plan.driver_refs[t], version) for t in TARGETS],
        RUNTIME_IMPORTS,
    )
    k["pause"] = _sha(
        RECIPE, "pause", arch, plan.pause_src.read_bytes(), _gcc_version(), pause_cflags(repo)
    )
    k["busybox"] = _sha(RECIPE, "busybox", arch, versions[BUSYBOX_DEB], BUSYBOX_PASSWD)
    return plan


def driver_config_args(target: str, ref: str, version: str) -> dict[str, Any]:
    """Config fields of one driver image, mirroring its Dockerfile target."""
    return {
        "entrypoint": [target],
        "env": dict(DRIVER_ENV),
        "user": TARGET_USERS[target],
        "working_dir": APP,
        "labels": {
            "org.opencontainers.image.vendor": "compute-domain-driver",
            "org.opencontainers.image.licenses": "Apache-2.0",
            "org.opencontainers.image.version": version,
            "org.opencontainers.image.base.name": f"debian:bookworm ({PYTHON} packages)",
            "org.opencontainers.image.documentation": "docs/operators.md",
            "org.opencontainers.image.title": target,
            "org.opencontainers.image.description": TARGET_DESCRIPTIONS[target],
        },
    }


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


def _set_mtimes(top: Path) -> None:
    """Give every file under ``top`` the layer mtime, so timestamp-checked .pyc files stay valid."""
    for dirpath, _dirnames, filenames in os.walk(top):
        for name in filenames:
            p = os.path.join(dirpath, name)
            if not os.path.islink(p):
                os.utime(p, (oci.EPOCH, oci.EPOCH))


def _compileall(root: Path, path: str, *exclude: str) -> None:
    _set_mtimes(root / path.lstrip("/"))
    args = ["/usr/bin/" + PYTHON, "-m", "compileall", "-q", "--invalidation-mode", "timestamp"]
    if exclude:
        args += ["-x", "|".join(exclude)]
    chroot(root, [*args, path], what=f"byte-compiling {path}")


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


def build_base(root: Path, deb_files: Mapping[str, Path]) -> None:
    """Fill ``root`` with the base layer: unpacked packages, users, nsswitch, compiled stdlib."""
    for pkg in RUNTIME_DEBS:
        debs.unpack(deb_files[pkg], root)
    for rel in TRIM:
        shutil.rmtree(root / rel, ignore_errors=True)
    _busybox_applets(root)
    _symlink(PYTHON, root / "usr" / "bin" / "python3")
    _base_files(root, PASSWD, GROUP)
    (root / "etc" / "nsswitch.conf").write_text(NSSWITCH)
    # Stdlib .pyc files (Debian's postinst would generate them): start-up cost in every pod.
    _compileall(root, f"/usr/lib/{PYTHON}", r"/(test|tests|idlelib|lib2to3|tkinter|turtledemo)/")
    chroot(root, ["/usr/bin/" + PYTHON, "-c", "import ssl, ctypes, lzma, bz2, zlib, uuid, json"])


def _pip_platforms(arch: str) -> list[str]:
    machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(arch)
    if machine is None:
        raise BuildError(f"no wheel platform known for Debian architecture {arch}")
    flags: list[str] = []
    for minor in range(MANYLINUX_GLIBC_MINOR, 4, -1):
        flags += ["--platform", f"manylinux_2_{minor}_{machine}"]
    if machine == "x86_64":
        for legacy in ("manylinux2014", "manylinux2010", "manylinux1"):
            flags += ["--platform", f"{legacy}_{machine}"]
    else:
        flags += ["--platform", f"manylinux2014_{machine}"]
    return flags


def build_deps(root: Path, requirements: Path, arch: str, log: Log) -> None:
    """Add ``/opt/venv``: the pinned wheels (binary only, no resolver) and a hand-made venv."""
    venv = root / VENV.lstrip("/")
    site = venv / "lib" / PYTHON / "site-packages"
    site.mkdir(parents=True)
    pyver = chroot(
        root, ["/usr/bin/" + PYTHON, "-c", "import platform; print(platform.python_version())"]
    ).stdout.strip()
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "--no-input",
        "--quiet",
        "--no-compile",
        "--no-deps",
        "--only-binary=:all:",
        "--target",
        str(site),
        *_pip_platforms(arch),
        "--python-version",
        pyver,
        "--implementation",
        "cp",
        "--abi",
        "cp" + PYTHON.removeprefix("python").replace(".", ""),
        "--requirement",
        str(requirements),
    ]
    log(f"pip install -r {requirements.name} into {VENV} (binary wheels, python {pyver})")
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise BuildError(
            f"pip install of {requirements} failed (exit {done.returncode}); PyPI must be "
            f"reachable and `{sys.executable} -m pip` must work:\n"
            f"{(done.stdout + done.stderr)[-4000:]}"
        )
    bindir = venv / "bin"
    bindir.mkdir()
    scripts = site / "bin"
    if scripts.is_dir():  # console scripts: pip wrote the build interpreter into the shebang
        for script in sorted(scripts.iterdir()):
            lines = script.read_bytes().split(b"\n", 1)
            if lines[0].startswith(b"#!") and b"python" in lines[0]:
                lines[0] = f"#!{VENV}/bin/python".encode()
            (bindir / script.name).write_bytes(b"\n".join(lines))
            (bindir / script.name).chmod(0o755)
        shutil.rmtree(scripts)
    (bindir / "python").symlink_to(f"/usr/bin/{PYTHON}")
    (bindir / "python3").symlink_to("python")
    (bindir / PYTHON).symlink_to("python")
    (venv / "lib64").symlink_to("lib")
    (venv / "pyvenv.cfg").write_text(
        f"home = /usr/bin\ninclude-system-site-packages = false\nversion = {pyver}\n"
        f"executable = /usr/bin/{PYTHON}\ncommand = /usr/bin/{PYTHON} -m venv {VENV}\n"
    )
    _compileall(root, VENV)


def build_app(root: Path, repo: Path, files: Sequence[str]) -> None:
    """Add ``/opt/compute-domain-driver``: ``pkg/``, ``cmd/``, entry-point wrappers, .pyc files."""
    app = root / APP.lstrip("/")
    for rel in files:
        src, dst = repo / rel, app / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            dst.symlink_to(os.readlink(src))
        else:
            shutil.copyfile(src, dst)
            dst.chmod(0o755 if src.stat().st_mode & 0o111 else 0o644)
    bindir = app / "bin"
    bindir.mkdir()
    for target in TARGETS:
        script = f"{APP}/cmd/{target}/{target.replace('-', '_')}.py"
        wrapper = bindir / target
        wrapper.write_text(f'#!/bin/sh\nexec {VENV}/bin/python {script} "$@"\n')
        wrapper.chmod(0o755)
    _compileall(root, APP)


_IMPORT_CHECK = """
import importlib, pkgutil, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
import pkg
mods = [m.name for m in pkgutil.walk_packages(pkg.__path__, "pkg.")
        if not m.name.startswith("pkg.testing")]
for name in mods:
    importlib.import_module(name)
print(len(mods))
"""


def _elf_files(root: Path, tops: Sequence[str]) -> list[str]:
    found: list[str] = []
    for top in tops:
        base = root / top.lstrip("/")
        candidates = [base] if base.is_file() else sorted(base.rglob("*"))
        for p in candidates:
            if p.is_file() and not p.is_symlink():
                with p.open("rb") as f:
                    if f.read(4) == b"\x7fELF":
                        found.append("/" + str(p.relative_to(root)))
    return found


def self_check_driver(root: Path, refs: Mapping[str, str], log: Log) -> None:
    """Check the assembled driver root filesystem; raise :class:`BuildError` on the first fault.

    1. every ELF object of the venv and the interpreter finds its libraries (``ld.so --list``);
    2. the runtime imports and every ``pkg`` module (except ``pkg.testing``) import;
    3. each entry point prints ``--help`` as its image's user, from the image's WorkingDir;
    4. ``/usr/bin/env python3`` (the fake driver root's simulated IMEX) is the venv's python.
    """
    loaders = sorted(root.glob("lib*/ld-linux*.so*"))
    if not loaders:
        raise BuildError(f"no dynamic loader (lib*/ld-linux*.so*) in {root}")
    loader = "/" + str(loaders[0].relative_to(root))
    elves = _elf_files(root, [f"/usr/bin/{PYTHON}", VENV])
    missing: list[str] = []
    for elf in elves:
        out = chroot(root, [loader, "--list", elf], check=False)
        # A missing library: "=> not found" lines, or exit 127 with the loader's error.
        missing += [f"{elf}: {ln.strip()}" for ln in out.stdout.splitlines() if "not found" in ln]
        if out.returncode != 0:
            missing.append(f"{elf}: exit {out.returncode}: {out.stderr.strip()}")
    if missing:
        raise BuildError(
            "image self-check: shared libraries missing from the base layer (add their Debian "
            "packages to RUNTIME_DEBS in hack/nodeimages/build.py):\n" + "\n".join(missing)
        )
    env = dict(DRIVER_ENV)
    out = chroot(
        root,
        [f"{VENV}/bin/python", "-c", _IMPORT_CHECK, *RUNTIME_IMPORTS],
        env=env,
        cwd=APP,
        what="import check",
    )
    log(f"self-check: {len(elves)} ELF objects resolve; {out.stdout.strip()} pkg modules import")
    for target in TARGETS:
        user = TARGET_USERS[target]
        # Usage text and no traceback is the bar: compute-domain-daemon's --help exits 1.
        out = chroot(root, [target, "--help"], env=env, user=user, cwd=APP, check=False)
        text = out.stdout + out.stderr
        if "usage:" not in text or "Traceback" in text or out.returncode not in (0, 1):
            raise BuildError(
                f"image self-check: `{target} --help` (user {user}, cwd {APP}) exited "
                f"{out.returncode} without a usage text:\n{text[-4000:]}"
            )
    # The fake driver root's simulated nvidia-imex (a zipapp injected by CDI) starts with
    # `#!/usr/bin/env python3`: that must find the venv's interpreter.
    out = chroot(
        root,
        ["/usr/bin/env", "python3", "-c", "import sys; print(sys.prefix)"],
        env=env,
        what="/usr/bin/env python3",
    )
    if out.stdout.strip() != VENV:
        raise BuildError(f"`/usr/bin/env python3` runs {out.stdout.strip()!r}, not {VENV}")
    log(f"self-check: {', '.join(refs.values())} --help ok")


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


def _build_driver(plan: Plan, deb_files: Mapping[str, Path], work: Path, log: Log) -> None:
    root = work / "driver"
    root.mkdir()
    base = _layer(plan, "base", root, lambda: build_base(root, deb_files), log=log)
    requirements = plan.repo / "hack" / "image-requirements.txt"
    deps = _layer(
        plan,
        "deps",
        root,
        lambda: build_deps(root, requirements, plan.arch, log),
        log=log,
        include=[VENV],
    )
    app = _layer(
        plan,
        "app",
        root,
        lambda: build_app(root, plan.repo, plan.app_files),
        log=log,
        include=[APP],
    )
    self_check_driver(root, plan.driver_refs, log)
    layers = [base, deps, app]
    history = [
        f"debian packages: {' '.join(f'{p}={plan.debs[p]}' for p in RUNTIME_DEBS)}",
        f"{VENV}: pip install -r hack/image-requirements.txt",
        f"{APP}: pkg/ cmd/ bin/",
    ]
    images = [
        oci.Image(
            ref,
            oci.image_config(
                layers=layers,
                architecture=plan.oci_arch,
                history=history,
                **driver_config_args(target, ref, plan.version),
            ),
            layers,
        )
        for target, ref in plan.driver_refs.items()
    ]
    _write_archive(plan, "compute-domain-driver", images, log)


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
    current = {plan.layer(k).name for k in ("base", "deps", "app", "pause", "busybox")}
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
    driver references map to one archive holding all three images (shared layers stored once);
    :data:`PAUSE_IMAGE` and :data:`BUSYBOX_IMAGE` have their own.  A warm call (all archives
    cached for the current inputs) only hashes inputs and stats files.  Building needs root
    (``chroot`` self-check), apt/dpkg with current lists, gcc with static libc, go (for the
    kubernetes module's pause.c) and pip; any failure raises :class:`BuildError` (or
    :class:`nodeimages.debs.DebError`) saying what is missing.
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
                if plan.archive("compute-domain-driver") in missing:
                    _build_driver(plan, deb_files, work, log)
                if plan.archive("pause") in missing:
                    _build_pause(plan, work, log)
                if plan.archive("busybox") in missing:
                    _build_busybox(plan, deb_files[BUSYBOX_DEB], work, log)
            _prune(plan)
            log(f"done in {time.monotonic() - t0:.0f}s")
    return outputs
