"""Upstream's Go driver and NVIDIA's mock NVML, built offline from checkouts into the e2e cache.

Per upstream commit (``<cache>/upstream/<commit>/``, cache root as ``nodeimages.cache_root``):

* ``bin/compute-domain-{kubelet-plugin,controller,daemon}``: built from a ``git archive`` of the
  commit with ``go build -mod=vendor`` (offline), ``CGO_ENABLED=1`` (go-nvml dlopens
  ``libnvidia-ml.so.1``), one package at a time (``-p 1``, ``GOMAXPROCS=1``) and the
  ``internal/info`` version flags of upstream's Makefile;
* ``chart/``: the tree's Helm chart (``deployments/helm/<name>``), installed as it is;
* ``image.tar``: an OCI archive of ``localhost/upstream-dra-driver-nvidia-gpu:<commit[:12]>``
  (linux/amd64). Upstream's own base images (CUDA, distroless) are not reachable here, so its
  base is the Debian bookworm and python3 layers of our own driver image (``hack/nodeimages``,
  the first two layers of its amd64 manifest): bash, coreutils and mount for upstream's scripts,
  and python3 for the IMEX simulator of the fake driver root, which the Go daemon runs as
  ``nvidia-imex`` through the plugin's CDI spec. On top, one layer with upstream's three
  binaries in ``/usr/bin``, ``hack/kubelet-plugin-prestart.sh`` and ``templates/`` (the
  controller reads its DaemonSet and claim templates from ``/templates``). ``PATH`` leaves out
  our entry points (``/opt/compute-domain-driver/bin``), which the base layers do not hold
  anyway.

Versions whose chart has no ``altProcDevices`` (v25.12.0) read ``/proc/devices``,
``/proc/driver/nvidia`` (to unmount what is mounted below it) and the ``fabric-imex-mgmt``
capability at fixed procfs paths; their extracted tree gets those three constants pointed
into the driver root (:data:`PROC_PATCHES`, recorded in
:attr:`Upstream.patched` and the summary), in ``<cache>/upstream/<commit>-procpatch/``.

Per k8s-test-infra commit (``<cache>/mocknvml/<commit>/``): ``libnvidia-ml.so.<version>`` built
with ``make NO_PADDING=1`` in ``pkg/gpu/mocknvml`` of a ``git archive`` (the checkout is never
written to) and the GB200 profile ``mock-nvml-config-gb200.yaml``.

Nothing here writes into a checkout, and nothing of upstream enters this repository.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodeimages import build_all, cache_root, oci

Log = Callable[[str], None]
BINARIES = ("compute-domain-kubelet-plugin", "compute-domain-controller", "compute-domain-daemon")
IMAGE_NAME = "localhost/upstream-dra-driver-nvidia-gpu"
# Our driver image's amd64 layers kept as upstream's base: Debian bookworm minbase, python3.
BASE_LAYER_COUNT = 2
RECIPE = 2  # bump when the build or image recipe changes
MOCK_NVML_VERSION = "550.163.01"  # the Makefile's LIB_VERSION default
MOCK_PROFILE = "mock-nvml-config-gb200.yaml"


# Versions before the chart's ``altProcDevices`` (v25.12.0) read the kernel's procfs at fixed
# paths, which no NVIDIA module fills here. Their extracted tree (never the checkout) gets
# these constants pointed into the driver root the plugin mounts at ``/driver-root``
# (``nodeprep`` puts the fake ``proc-devices`` there): (file, constant, new value).
PROC_PATCHES = (
    ("internal/common/nvcaps.go", "procDevicesPath", "/driver-root/proc/devices"),
    (
        "cmd/compute-domain-kubelet-plugin/nvlib.go",
        "procDriverNvidiaPath",
        "/driver-root/proc/driver/nvidia",
    ),
    (
        "cmd/compute-domain-kubelet-plugin/nvlib.go",
        "nvidiaCapFabricImexMgmtPath",
        "/driver-root/proc/driver/nvidia/capabilities/fabric-imex-mgmt",
    ),
)


class UpstreamError(RuntimeError):
    """An upstream build step failed; the message names it and carries its output."""


@dataclass(frozen=True)
class Upstream:
    """One built upstream ref."""

    ref: str
    commit: str
    describe: str  # ``git describe --tags`` of the commit
    image_ref: str
    archive: Path
    chart: Path
    build_s: float  # seconds spent building now (0: everything came from the cache)
    patched: tuple[str, ...] = ()  # PROC_PATCHES applied (``file: constant = value``)


@dataclass(frozen=True)
class MockNvml:
    """NVIDIA's mock NVML library and its GB200 profile."""

    commit: str
    library: Path
    profile: Path


def git_dir(checkout: Path) -> Path:
    """The git directory of a checkout (``<checkout>/.git``) or of a bare/mirror repository."""
    return checkout / ".git" if (checkout / ".git").exists() else checkout


def _git(checkout: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", f"--git-dir={git_dir(checkout)}", *args],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise UpstreamError(f"git {' '.join(args)} in {checkout}: {done.stderr.strip()}")
    return done.stdout.strip()


def resolve(checkout: Path, ref: str) -> str:
    """The full commit id ``ref`` names in ``checkout``."""
    return _git(checkout, "rev-parse", "--verify", f"{ref}^{{commit}}")


def extract(checkout: Path, commit: str, dest: Path) -> None:
    """``git archive`` of ``commit`` unpacked into ``dest`` (created)."""
    dest.mkdir(parents=True)
    archive = subprocess.run(
        ["git", f"--git-dir={git_dir(checkout)}", "archive", commit],
        check=True,
        stdout=subprocess.PIPE,
    )
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)


def _go() -> str:
    go = shutil.which("go") or "/usr/local/go/bin/go"
    if not Path(go).exists():
        raise UpstreamError("`go` not found (Go 1.26 at /usr/local/go/bin)")
    return go


def _go_env() -> dict[str, str]:
    return {
        **os.environ,
        "GOTOOLCHAIN": "local",
        "GOFLAGS": "-mod=vendor",
        "GOMAXPROCS": "1",
        "CGO_ENABLED": "1",
        "PATH": f"{Path(_go()).parent}:{os.environ.get('PATH', '')}",
    }


def _run(argv: list[str], *, cwd: Path, env: dict[str, str], what: str) -> None:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).splitlines()[-30:])
        raise UpstreamError(f"{what} exited {done.returncode}:\n{tail}")


def go_module(tree: Path) -> str:
    """The module path of the tree's ``go.mod`` (it changed with the move to kubernetes-sigs)."""
    for line in (tree / "go.mod").read_text().splitlines():
        if line.startswith("module "):
            return line.split()[1]
    raise UpstreamError(f"{tree}/go.mod names no module")


def build_binaries(tree: Path, out: Path, *, commit: str, version: str, log: Log) -> None:
    """The three compute-domain binaries of ``tree`` into ``out`` (offline, cgo, ``-p 1``)."""
    info = f"{go_module(tree)}/internal/info"
    ldflags = f"-s -w -X {info}.gitCommit={commit} -X {info}.version={version}"
    env = {**_go_env(), "CGO_LDFLAGS_ALLOW": "-Wl,--unresolved-symbols=ignore-in-object-files"}
    out.mkdir(parents=True, exist_ok=True)
    for name in BINARIES:
        t0 = time.monotonic()
        argv = [_go(), "build", "-p", "1", "-trimpath", "-ldflags", ldflags]
        _run([*argv, "-o", str(out / name), f"./cmd/{name}"], cwd=tree, env=env, what=name)
        log(f"  {name}: built in {time.monotonic() - t0:.0f}s")


def _blob_json(tar: tarfile.TarFile, digest: str) -> dict[str, Any]:
    """A JSON blob of an OCI layout tar by digest (or ``index.json`` by that name)."""
    name = digest if digest == "index.json" else "blobs/" + digest.replace(":", "/", 1)
    member = tar.extractfile(name)
    if member is None:
        raise UpstreamError(f"blob {digest} missing")
    data: dict[str, Any] = json.load(member)
    return data


def base_layers(cache: Path, log: Log) -> list[oci.Blob]:
    """The first :data:`BASE_LAYER_COUNT` amd64 layers of our daemon image, uncompressed.

    Taken from the archive ``nodeimages.build_all`` returns (built if missing) and kept in
    ``<cache>/base-layers/<diff id>.tar``."""
    archives = build_all(log=log)
    ref, archive = next((r, a) for r, a in archives.items() if "compute-domain-daemon" in r)
    layers: list[oci.Blob] = []
    with tarfile.open(archive) as tar:
        top = _blob_json(tar, "index.json")
        entry = next(
            m for m in top["manifests"] if m["annotations"]["io.containerd.image.name"] == ref
        )
        sub = _blob_json(tar, entry["digest"])
        amd64 = next(m for m in sub["manifests"] if m["platform"]["architecture"] == "amd64")
        manifest = _blob_json(tar, amd64["digest"])
        config = _blob_json(tar, manifest["config"]["digest"])
        for layer, diff_id in list(
            zip(manifest["layers"], config["rootfs"]["diff_ids"], strict=True)
        )[:BASE_LAYER_COUNT]:
            out = cache / "base-layers" / f"{diff_id.removeprefix('sha256:')}.tar"
            if not out.is_file():
                out.parent.mkdir(parents=True, exist_ok=True)
                member = tar.extractfile("blobs/" + layer["digest"].replace(":", "/", 1))
                assert member is not None
                tmp = out.with_suffix(".tmp")
                gz = layer["mediaType"].endswith("+gzip")
                with tmp.open("wb") as f, gzip.open(member) if gz else member as src:
                    shutil.copyfileobj(src, f, 1 << 20)
                if oci.sha256_file(tmp) != diff_id:
                    raise UpstreamError(f"base layer {diff_id}: content does not match")
                tmp.replace(out)
            layers.append(oci.Blob(out, diff_id, out.stat().st_size))
    log(f"  base: {len(layers)} layers of {ref} (Debian bookworm, python3)")
    return layers


def build_image(tree: Path, bins: Path, out: Path, *, ref: str, commit: str, log: Log) -> None:
    """OCI archive ``out`` holding ``ref``: base layers + upstream's binaries and templates."""
    cache = out.parent.parent
    base = base_layers(cache, log)
    with tempfile.TemporaryDirectory(prefix="upstream-image-") as scratch:
        root = Path(scratch) / "root"
        (root / "usr" / "bin").mkdir(parents=True)
        for name in BINARIES:
            shutil.copy2(bins / name, root / "usr" / "bin" / name)
        prestart = tree / "hack" / "kubelet-plugin-prestart.sh"
        if prestart.is_file():
            shutil.copy2(prestart, root / "usr" / "bin" / prestart.name)
        shutil.copytree(tree / "templates", root / "templates")
        layer = oci.write_layer(root, out.parent / "upstream-layer.tar")
    layers = [*base, layer]
    config = oci.image_config(
        layers=layers,
        architecture="amd64",
        env={
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "NVIDIA_DISABLE_REQUIRE": "true",
            "NVIDIA_VISIBLE_DEVICES": "all",
            "NVIDIA_DRIVER_CAPABILITIES": "utility",
        },
        labels={"com.nvidia.git-commit": commit},
        history=["debian bookworm (ours)", "python3 (ours)", "upstream binaries + templates"],
    )
    oci.write_archive(out, [oci.Image(ref, config, layers)])


def needs_proc_patches(checkout: Path, commit: str) -> bool:
    """True if the commit's chart has no ``altProcDevices`` value (see :data:`PROC_PATCHES`)."""
    done = subprocess.run(
        [
            "git",
            f"--git-dir={git_dir(checkout)}",
            "grep",
            "-q",
            "altProcDevices",
            commit,
            "--",
            "deployments/helm",
        ],
        check=False,
    )
    return done.returncode != 0


def apply_proc_patches(tree: Path) -> tuple[str, ...]:
    """Point :data:`PROC_PATCHES`' constants of the extracted ``tree`` into the driver root."""
    applied = []
    for rel, const, value in PROC_PATCHES:
        path = tree / rel
        text = path.read_text()
        new, count = re.subn(rf'(\b{const}\s*=\s*)"[^"]*"', rf'\g<1>"{value}"', text)
        if count != 1:
            raise UpstreamError(f"{rel}: expected one `{const} = ...`, found {count}")
        path.write_text(new)
        applied.append(f"{rel}: {const} = {value}")
    return tuple(applied)


def chart_dir(tree: Path) -> Path:
    """The tree's Helm chart directory (its name changed with the move to kubernetes-sigs)."""
    charts = sorted((tree / "deployments" / "helm").glob("*/Chart.yaml"))
    if len(charts) != 1:
        raise UpstreamError(f"{tree}: expected one chart under deployments/helm, got {charts}")
    return charts[0].parent


def prepare(checkout: Path, ref: str, *, log: Log, cache: Path | None = None) -> Upstream:
    """Build (or take from the cache) upstream's binaries, image and chart for ``ref``."""
    commit = resolve(checkout, ref)
    describe = _git(checkout, "describe", "--tags", "--always", commit)
    root = (cache or cache_root()) / "upstream"
    patch = needs_proc_patches(checkout, commit)
    work = root / (commit + ("-procpatch" if patch else ""))
    done_file = work / f"done-{RECIPE}"
    image_ref = f"{IMAGE_NAME}:{commit[:12]}{'-procpatch' if patch else ''}"
    archive = work / "image.tar"
    t0 = time.monotonic()
    built = not done_file.is_file()
    if built:
        log(f"upstream {ref} ({describe}, {commit[:12]}): building into {work}")
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        tree = work / "src"
        extract(checkout, commit, tree)
        if patch:
            (work / "patched.json").write_text(json.dumps(apply_proc_patches(tree)))
        build_binaries(tree, work / "bin", commit=commit[:12], version=describe, log=log)
        shutil.copytree(chart_dir(tree), work / "chart")
        build_image(tree, work / "bin", archive, ref=image_ref, commit=commit, log=log)
        shutil.rmtree(tree)
        done_file.write_text(json.dumps({"ref": ref, "describe": describe}))
        log(f"upstream {ref}: image {image_ref} in {archive} ({time.monotonic() - t0:.0f}s)")
    build_s = time.monotonic() - t0 if built else 0.0
    patched = tuple(json.loads((work / "patched.json").read_text())) if patch else ()
    chart = work / "chart"
    return Upstream(ref, commit, describe, image_ref, archive, chart, round(build_s, 1), patched)


def build_mock_nvml(checkout: Path, *, log: Log, cache: Path | None = None) -> MockNvml:
    """NVIDIA's mock NVML (``pkg/gpu/mocknvml``) of the k8s-test-infra ``checkout``'s HEAD."""
    commit = resolve(checkout, "HEAD")
    work = (cache or cache_root()) / "mocknvml" / commit
    lib = work / f"libnvidia-ml.so.{MOCK_NVML_VERSION}"
    profile = work / MOCK_PROFILE
    if not (lib.is_file() and profile.is_file()):
        t0 = time.monotonic()
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        with tempfile.TemporaryDirectory(prefix="k8s-test-infra-") as scratch:
            tree = Path(scratch) / "src"
            extract(checkout, commit, tree)
            mock = tree / "pkg" / "gpu" / "mocknvml"
            env = {**_go_env(), "GOFLAGS": "-mod=vendor -p=1"}
            _run(["make", "NO_PADDING=1"], cwd=mock, env=env, what="make (mocknvml)")
            shutil.copy2(mock / lib.name, lib)
            shutil.copy2(mock / "configs" / MOCK_PROFILE, profile)
        log(f"mock NVML {commit[:12]}: built in {time.monotonic() - t0:.0f}s")
    return MockNvml(commit, lib, profile)
