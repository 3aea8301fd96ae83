"""The pipeline that builds the ``Dockerfile``'s images for CI (``hack/nodeimages/driver.py``).

Its pure parts: the build context against ``.dockerignore``, the cache key, the archive's image
names, the host CA hand-over, the qemu handler's no-op and refusal paths.  The ``Dockerfile``
itself is pinned by ``test/unit/config/test_deploy_tooling.py``; building the images needs root,
buildah and minutes, which the real-node lane does (``make test``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hostsys import binfmt
from nodeimages import driver

REPO = Path(__file__).resolve().parents[3]


def test_context_is_what_dockerignore_admits(tmp_path: Path) -> None:
    admitted = [
        ln[1:].rstrip("/")
        for ln in (REPO / ".dockerignore").read_text().splitlines()
        if ln.startswith("!")
    ]
    # .dockerignore itself is hashed (it shapes the context) but not copied.
    context = [p for p in (*driver.CONTEXT, *driver.CONTEXT_DIRS) if p != ".dockerignore"]
    assert sorted(admitted) == sorted(context)
    for rel in ("pkg/a.py", "pkg/__pycache__/a.cpython-311.pyc", "pkg/b.pyc", "cmd/x/x.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    (tmp_path / "pkg" / ".mypy_cache").mkdir()
    (tmp_path / "pkg" / ".mypy_cache" / "c.json").write_text("{}")
    (tmp_path / "Dockerfile").write_text("FROM x\n")
    assert driver.context_files(tmp_path) == ["Dockerfile", "pkg/a.py", "cmd/x/x.py"]


def test_key_follows_the_context_only(tmp_path: Path) -> None:
    for rel in (*driver.CONTEXT, "pkg/a.py", "cmd/x/x.py", "docs/notes.md"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(rel)
    key = driver.driver_key(tmp_path)
    (tmp_path / "docs" / "notes.md").write_text("changed")
    assert driver.driver_key(tmp_path) == key
    (tmp_path / "pkg" / "a.py").write_text("changed")
    assert driver.driver_key(tmp_path) != key
    key = driver.driver_key(tmp_path)
    (tmp_path / "cmd" / "x" / "x.py").chmod(0o755)
    assert driver.driver_key(tmp_path) != key


def test_archive_names_each_index_by_its_reference() -> None:
    refs = {t: f"localhost/{t}:0.1.0" for t in driver.TARGETS}
    manifests: list[dict[str, Any]] = [
        {"digest": f"sha256:{i}", "annotations": {"org.opencontainers.image.ref.name": t}}
        for i, t in enumerate(driver.TARGETS)
    ]
    index: dict[str, Any] = {"schemaVersion": 2, "manifests": manifests}
    named = driver.name_images(index, refs)
    for desc, target in zip(named["manifests"], driver.TARGETS, strict=True):
        assert desc["annotations"] == {
            "org.opencontainers.image.ref.name": "0.1.0",
            "io.containerd.image.name": refs[target],
        }
    assert manifests[0]["annotations"] == {"org.opencontainers.image.ref.name": driver.TARGETS[0]}
    with pytest.raises(driver.ImageError, match="lacks"):
        driver.name_images({"manifests": manifests[:1]}, refs)
    with pytest.raises(driver.ImageError, match="none of"):
        driver.name_images(index, {driver.TARGETS[0]: refs[driver.TARGETS[0]]})


def test_pip_trust_passes_the_host_ca_without_a_layer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    conf = tmp_path / "pip.conf"
    conf.write_text(f"[global]\ncert = {ca}\n")
    monkeypatch.delenv("PIP_CERT", raising=False)
    monkeypatch.setattr(driver, "HOST_PIP_CONF", conf)
    args = driver._pip_trust(tmp_path)
    assert args == [
        "--volume",
        f"{tmp_path / 'build-tmp'}:/tmp:rw",
        "--build-arg",
        "PIP_CERT=/tmp/host-ca.crt",
    ]
    assert (tmp_path / "build-tmp" / "host-ca.crt").read_text() == ca.read_text()
    monkeypatch.setattr(driver, "HOST_PIP_CONF", tmp_path / "absent.conf")
    assert driver._pip_trust(tmp_path) == []
    text = (REPO / "Dockerfile").read_text()
    assert "ARG PIP_CERT\n" in text  # declared without a value: unset unless passed


def test_native_architecture_needs_no_handler(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_a: object, **_k: object) -> None:
        raise AssertionError("nothing may be mounted or registered for the native architecture")

    monkeypatch.setattr("hostsys.binfmt.subprocess.run", refuse)
    monkeypatch.setattr("hostsys.binfmt.os.open", refuse)
    with binfmt.foreign_arch(binfmt.native_arch()):
        pass


def test_missing_qemu_is_an_actionable_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(binfmt, "BINFMT_D", tmp_path)
    foreign = "arm64" if binfmt.native_arch() != "arm64" else "amd64"
    with (
        pytest.raises(binfmt.BinfmtError, match="apt-get install qemu-user-static"),
        binfmt.foreign_arch(foreign),
    ):
        pass


def test_handler_names_follow_qemu() -> None:
    assert binfmt.handler_name("arm64") == "qemu-aarch64"
    assert binfmt.handler_name("amd64") == "qemu-x86_64"
