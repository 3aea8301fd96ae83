"""No usable cluster configuration is one `KubeConfigError` naming what was tried, which every
binary prints as its ``cannot start:`` line (never a traceback)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from pkg.kube.config import KubeConfigError, load_api_client
from pkg.reconcilers.app import run
from pkg.reconcilers.flags import parse_options


@pytest.fixture
def nowhere(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Neither in a pod nor with a kubeconfig."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    monkeypatch.setenv("HOME", str(tmp_path))


@pytest.mark.usefixtures("nowhere")
def test_no_configuration_at_all_names_both_sources() -> None:
    with pytest.raises(KubeConfigError, match=r"^no cluster configuration: not in a pod \("):
        load_api_client()


def test_an_unreadable_kubeconfig_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "config"
    bad.write_text("clusters: [\n")
    with pytest.raises(KubeConfigError, match=rf"^cannot load kubeconfig {bad}: "):
        load_api_client(str(bad))


@pytest.mark.usefixtures("nowhere")
def test_the_controller_says_cannot_start_and_exits_1(caplog: pytest.LogCaptureFixture) -> None:
    options = parse_options(["--image-name=x", "--http-endpoint="], {})
    with caplog.at_level(logging.ERROR):
        assert run(options, stop=threading.Event(), env={}) == 1
    [record] = [r for r in caplog.records if r.getMessage().startswith("cannot start: ")]
    assert "no cluster configuration" in record.getMessage()
