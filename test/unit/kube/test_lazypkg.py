"""Deferred package initialisation: a submodule loads alone, the package's own names still
appear on first use, and the daemon's start never loads the kubeconfig parser's stacks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pkg.kube.lazypkg import defer_package_init

REPO = Path(__file__).resolve().parents[3]


def run(code: str, path: Path | None = None) -> str:
    """``code`` in a child interpreter, with ``path`` first on its import path."""
    env = {**os.environ, "PYTHONPATH": str(path)} if path is not None else None
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_submodule_loads_without_the_package_init(tmp_path: Path) -> None:
    pkg = tmp_path / "heavy"
    (pkg / "light").mkdir(parents=True)
    (pkg / "__init__.py").write_text("import json\nLOADED = True\nfrom . import light\n")
    (pkg / "light" / "__init__.py").write_text("VALUE = 1\n")
    out = run(
        "from pkg.kube.lazypkg import defer_package_init, is_deferred\n"
        "assert defer_package_init('heavy') and not defer_package_init('heavy')\n"
        "from heavy import light\n"
        "import heavy\n"
        "print(light.VALUE, is_deferred(heavy), 'LOADED' in vars(heavy))\n"
        "print(heavy.LOADED, is_deferred(heavy))\n"
        "try:\n    heavy.missing\nexcept AttributeError as e:\n    print('AttributeError', e)\n",
        tmp_path,
    )
    assert out.splitlines() == [
        "1 True False",
        "True False",
        "AttributeError module 'heavy' has no attribute 'missing'",
    ]


def test_unknown_package_is_an_import_error() -> None:
    with pytest.raises(ImportError, match="not an installed package"):
        defer_package_init("no_such_package_here")


HEAVY = ("pydantic", "yaml", "requests_oauthlib", "oauthlib", "requests", "google")


def test_daemon_start_imports_no_kubeconfig_stack_and_no_tracing_sdk() -> None:
    """The daemon's run path (REST client, watch, in-cluster config, tracing off) with the
    official client: none of the kubeconfig parser's dependencies is loaded, nor the
    OpenTelemetry SDK (only its light API)."""
    out = run(
        "import sys\n"
        "from pkg.daemon.daemon import Daemon\n"
        "from pkg.kube.config import load_api_client\n"
        "from pkg.runtime.tracing import setup_tracing\n"
        "setup_tracing('compute-domain-daemon', env={})\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry.sdk')))\n"
    )
    assert out.splitlines() == ["[]", "[]"]


def test_the_package_the_ordinary_way_still_works() -> None:
    out = run(
        "import pkg.kube\n"
        "from kubernetes import config, client\n"
        "import kubernetes\n"
        "print(callable(config.load_kube_config), callable(config.list_kube_config_contexts),"
        " kubernetes.__version__ != '', client.ApiClient is not None)\n"
    )
    assert out == "True True True True"
