"""Node images end to end: build them, import them into a throwaway containerd, run them.

The containerd (v2.4, built by ``hack/build-control-plane.sh``) has its own root, state, socket
and opt dir in a temp dir, the CRI and NRI plugins disabled (no ports, no host sockets), and is
stopped afterwards; everything mounted under the temp dir is unmounted.  Containers run with
Debian's ``runc`` in a one-level cgroup of their own that runc removes on delete.

Missing prerequisites (containerd binaries, runc, root) FAIL with the command that provides
them; ``SKIP_E2E=1`` skips, as for the rest of ``test/e2e``.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from localcluster import bin_dir
from nodeimages import (
    BUSYBOX_IMAGE,
    CRI_LABELS,
    CRI_PINNED,
    PAUSE_IMAGE,
    archive_platforms,
    archive_refs,
    build_all,
    driver_image_refs,
    import_images,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]
CONTAINERD_BINS = ("containerd", "containerd-shim-runc-v2", "ctr")
NAMESPACE = "k8s.io"


def _require_e2e() -> None:
    if os.environ.get("SKIP_E2E") == "1":
        pytest.skip("SKIP_E2E=1")
    if os.geteuid() != 0:
        pytest.fail("node images: building and running containers needs root", pytrace=False)


@pytest.fixture(scope="module")
def archives() -> dict[str, Path]:
    _require_e2e()
    return build_all()


@dataclass
class Containerd:
    """A running throwaway containerd."""

    bins: Path
    dir: Path
    address: str
    proc: subprocess.Popen[bytes]

    def ctr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.bins / "ctr"), "--address", self.address, "-n", NAMESPACE, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def run(self, image: str, *args: str) -> subprocess.CompletedProcess[str]:
        """``ctr run --rm`` in a cgroup of its own; ``args`` replace entrypoint and cmd."""
        cid = "nodeimages-" + secrets.token_hex(4)
        return self.ctr(
            "run",
            "--rm",
            "--fifo-dir",
            str(self.dir / "fifo"),
            "--cgroup",
            f"/cd-e2e-{cid}",
            image,
            cid,
            *args,
        )

    def log_tail(self) -> str:
        text = (self.dir / "containerd.log").read_text(errors="replace")
        return text[-3000:]


def _mounts_under(path: Path) -> list[str]:
    found: list[str] = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mnt = line.split()[4].replace("\\040", " ")
            if mnt == str(path) or mnt.startswith(str(path) + "/"):
                found.append(mnt)
    return sorted(found, key=len, reverse=True)


def _own_processes(marker: str) -> list[int]:
    """Pids whose command line mentions ``marker`` (our unique temp dir): leftover shims."""
    pids: list[int] = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if marker in cmdline:
                pids.append(int(entry.name))
    return pids


@pytest.fixture(scope="module")
def containerd() -> Iterator[Containerd]:
    _require_e2e()
    bins = bin_dir()
    missing = [b for b in CONTAINERD_BINS if not (bins / b).is_file()]
    if missing:
        pytest.fail(
            f"node images: {', '.join(missing)} missing in {bins}. Build them with "
            "`hack/build-control-plane.sh`; set SKIP_E2E=1 to skip the e2e suite.",
            pytrace=False,
        )
    if shutil.which("runc", path="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin") is None:
        pytest.fail("node images: runc not found: `apt-get install runc`", pytrace=False)
    # Shims and runc put sockets and state under /run/containerd whatever our state dir is.
    host_dirs = [Path("/run/containerd/runc", NAMESPACE), Path("/run/containerd/runc")]
    host_dirs += [Path("/run/containerd/s"), Path("/run/containerd")]
    created_by_us = [d for d in host_dirs if not d.exists()]
    tmp = Path(tempfile.mkdtemp(prefix="cd-e2e-ctrd-"))
    address = str(tmp / "containerd.sock")
    (tmp / "fifo").mkdir()
    config = tmp / "config.toml"
    config.write_text(
        "version = 3\n"
        f'root = "{tmp}/root"\n'
        f'state = "{tmp}/state"\n'
        "disabled_plugins = ['io.containerd.grpc.v1.cri', 'io.containerd.cri.v1.images', "
        "'io.containerd.cri.v1.runtime', 'io.containerd.nri.v1.nri']\n"
        f"[grpc]\n  address = '{address}'\n"
        f"[ttrpc]\n  address = '{address}.ttrpc'\n"
        f"[plugins.'io.containerd.internal.v1.opt']\n  path = '{tmp}/opt'\n"
    )
    env = {**os.environ, "PATH": f"{bins}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"}
    with (tmp / "containerd.log").open("wb") as log:
        proc = subprocess.Popen(
            [str(bins / "containerd"), "--config", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    ctrd = Containerd(bins, tmp, address, proc)
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                pytest.fail(f"containerd exited {proc.returncode}:\n{ctrd.log_tail()}")
            if Path(address).exists() and ctrd.ctr("version", timeout=10).returncode == 0:
                break
            if time.monotonic() > deadline:
                pytest.fail(f"containerd did not serve {address} in 30s:\n{ctrd.log_tail()}")
            time.sleep(0.2)
        yield ctrd
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        for pid in _own_processes(str(tmp)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for mnt in _mounts_under(tmp):
            if subprocess.run(["umount", mnt], check=False).returncode != 0:
                subprocess.run(["umount", "-l", mnt], check=False)
        shutil.rmtree(tmp, ignore_errors=True)
        for d in created_by_us:  # only while empty: another containerd may use them meanwhile
            with contextlib.suppress(OSError):
                d.rmdir()
        assert not _mounts_under(tmp)


@pytest.fixture(scope="module")
def imported(containerd: Containerd, archives: dict[str, Path]) -> Containerd:
    t0 = time.monotonic()
    import_images(containerd.bins / "ctr", containerd.address, archives.values())
    print(f"imported {len(set(archives.values()))} archives in {time.monotonic() - t0:.1f}s")
    return containerd


def test_archives_name_every_image(archives: dict[str, Path]) -> None:
    assert PAUSE_IMAGE in archives and BUSYBOX_IMAGE in archives
    assert len(archives) == 5
    named = {ref for path in set(archives.values()) for ref in archive_refs(path)}
    assert named == set(archives)


def test_driver_images_are_one_index_of_both_architectures(archives: dict[str, Path]) -> None:
    """Each driver image is an OCI index of linux/amd64 and linux/arm64 images of one build."""
    for target, ref in driver_image_refs().items():
        configs = archive_platforms(archives[ref], ref)
        assert set(configs) == {"linux/amd64", "linux/arm64"}, (ref, sorted(configs))
        # The base differs by architecture (its name too, here); every other label is the build's.
        base = "org.opencontainers.image.base.name"
        labels = [
            {k: v for k, v in c["config"]["Labels"].items() if k != base} for c in configs.values()
        ]
        assert labels[0] == labels[1], ref
        assert labels[0]["org.opencontainers.image.title"] == target
        assert configs["linux/arm64"]["config"]["Entrypoint"] == [target]


def test_import_lists_all_images_pinned(imported: Containerd, archives: dict[str, Path]) -> None:
    out = imported.ctr("images", "ls", "-q")
    assert out.returncode == 0, out.stderr
    assert set(archives) <= set(out.stdout.split())
    rows = imported.ctr("images", "ls").stdout.splitlines()
    for ref in archives:
        row = next(r for r in rows if r.split()[0] == ref)
        assert CRI_PINNED in row and all(label in row for label in CRI_LABELS), row
    check = imported.ctr("images", "check")
    assert check.stdout.count("complete") >= len(archives), check.stdout


def test_busybox_runs_shell_and_applets(imported: Containerd) -> None:
    out = imported.run(BUSYBOX_IMAGE, "sh", "-c", "echo ok; ls -l / >/dev/null && test -d /tmp")
    assert (out.returncode, out.stdout.strip()) == (0, "ok"), out.stderr + imported.log_tail()


def test_controller_image_prints_help_as_nonroot(
    imported: Containerd, archives: dict[str, Path]
) -> None:
    ref = next(r for r in archives if r.rsplit("/", 1)[-1].startswith("compute-domain-controller"))
    out = imported.run(ref, "compute-domain-controller", "--help")  # ctr: args replace all
    assert out.returncode == 0, out.stdout + out.stderr + imported.log_tail()
    assert "usage: compute-domain-controller" in out.stdout
    cid = "nodeimages-spec-" + secrets.token_hex(4)
    created = imported.ctr("containers", "create", ref, cid)
    assert created.returncode == 0, created.stderr
    try:
        info = json.loads(imported.ctr("containers", "info", cid).stdout)
    finally:
        imported.ctr("containers", "rm", cid)
    process = info["Spec"]["process"]
    assert (process["user"]["uid"], process["user"]["gid"]) == (65532, 65532)
    assert process["cwd"] == "/opt/compute-domain-driver"
    assert process["args"] == ["compute-domain-controller"]


def test_pause_image_reports_its_version(imported: Containerd) -> None:
    out = imported.run(PAUSE_IMAGE, "/pause", "-v")
    assert out.returncode == 0, out.stdout + out.stderr + imported.log_tail()
    assert PAUSE_IMAGE.rsplit(":", 1)[1] in out.stdout
