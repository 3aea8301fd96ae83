"""Every binary says which build it is: ``--version`` and its first log line, through the real
entry points (subprocesses, scrubbed environment, no kubeconfig, run from ``/``)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from pkg.runtime.buildinfo import load_build_info

REPO = Path(__file__).resolve().parents[3]
BINARIES = ("compute-domain-controller", "compute-domain-kubelet-plugin", "compute-domain-daemon")


def entry(binary: str) -> Path:
    return REPO / "cmd" / binary / f"{binary.replace('-', '_')}.py"


def start(
    binary: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(entry(binary)), *args],
        env=env or {},
        cwd="/",
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("binary", BINARIES)
def test_version_prints_one_line_and_exits_zero_without_env_or_cluster(binary: str) -> None:
    out = start(binary, "--version")
    assert (out.returncode, out.stderr) == (0, "")
    info = load_build_info()
    assert out.stdout == info.version_line(binary) + "\n"
    match = re.fullmatch(rf"{binary} version (\S+) \(revision (\S+), built (\S+)\)\n", out.stdout)
    assert match is not None
    assert match.groups() == (info.version, info.revision, info.build_date)


def test_controller_takes_go_style_single_dash_version() -> None:
    out = start("compute-domain-controller", "-version", "--image-name=ignored")
    assert out.returncode == 0 and out.stdout.startswith("compute-domain-controller version ")


def test_daemon_version_needs_no_command_and_help_still_exits_zero() -> None:
    assert start("compute-domain-daemon", "--help").returncode == 0
    bad = start("compute-domain-daemon")
    assert bad.returncode == 1 and "required: command" in bad.stderr


def test_plugin_bad_env_number_is_a_usage_error_not_a_traceback() -> None:
    out = start("compute-domain-kubelet-plugin", "--node-name=n", env={"HEALTHCHECK_PORT": "x"})
    message = '--healthcheck-port (or HEALTHCHECK_PORT): "x" is not an integer'
    assert out.returncode == 2 and message in out.stderr
    assert "Traceback" not in out.stderr


# The first line of stderr of a start that gets as far as the cluster connection (which then
# fails: there is no kubeconfig), in each binary's own log format.
FIRST_LINES = {
    "compute-domain-controller": (
        ["--image-name=img", "--kubeconfig=/nonexistent"],
        {},
        r"I\d{{4}} \S+ +\d+ app\.py:\d+\] starting compute-domain-controller "
        r"version={v} revision={r} buildDate={d}",
    ),
    "compute-domain-kubelet-plugin": (
        ["--node-name=n", "--device-discovery=fake", "--kubeconfig=/nonexistent"],
        {},
        r"I\d{{4}} \S+ +\d+ compute_domain_kubelet_plugin\.py:\d+\] starting "
        r"compute-domain-kubelet-plugin version={v} revision={r} buildDate={d}",
    ),
    "compute-domain-daemon": (
        ["run"],
        {
            "NODE_NAME": "n",
            "POD_NAMESPACE": "drv",
            "COMPUTE_DOMAIN_UUID": "u",
            "COMPUTE_DOMAIN_NAME": "cd",
            "COMPUTE_DOMAIN_NAMESPACE": "ns",
            "KUBECONFIG": "/nonexistent",
        },
        r'I\d{{4}} \S+ +\d+ compute_domain_daemon\.py:\d+\] "starting compute-domain-daemon '
        r'version={v} revision={r} buildDate={d}" cd="ns/cd" cdUID="u" node="n"',
    ),
}


@pytest.mark.parametrize("binary", BINARIES)
def test_first_log_line_names_version_revision_and_build_date(binary: str) -> None:
    args, env, pattern = FIRST_LINES[binary]
    out = start(binary, *args, env=env)
    assert out.returncode != 0  # it got to the (missing) cluster
    info = load_build_info()
    expected = pattern.format(
        v=re.escape(info.version), r=re.escape(info.revision), d=re.escape(info.build_date)
    )
    first = out.stderr.splitlines()[0]
    assert re.fullmatch(expected, first), first
