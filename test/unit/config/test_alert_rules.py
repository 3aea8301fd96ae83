"""config/components/monitoring: every alert fires on the series it is for, and only on those.

The PrometheusRule's groups are rendered into a plain rules file and run through
``promtool test rules`` (promtool from Debian's ``prometheus`` package, cached by
``hack/promtool.sh``) with, per alert, series on which it must fire (labels and annotations
as the rule renders them) and series on which it must not. Series use the label values the
binaries export (``operation="prepare"``, ``status="NotReady"``, ...), so an expression that
names a label value no binary emits fails here. Counters start at 0 in the firing series
where the binaries pre-create them, which also keeps ``increase()`` free of extrapolation.
A missing promtool fails the test (with the command that fetches it); it never skips.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from monitoringconfig import REPO, alert_rules, rule_groups

PROMTOOL_SH = REPO / "hack" / "promtool.sh"


@dataclass(frozen=True)
class Firing:
    """One alert instance expected at a case's ``eval_time``: its series labels (the rule's
    own labels are added) and the ``$value`` its annotations render."""

    labels: dict[str, str]
    value: str = ""


@dataclass(frozen=True)
class Case:
    """Input series (1m interval, promtool's expanding notation) and the alerts expected."""

    alert: str
    name: str
    series: dict[str, str]
    eval_time: str
    fires: list[Firing] = field(default_factory=list)


D = 'driver="compute-domain.nvidia.com"'
CHECKPOINT = f'nvidia_dra_checkpoint_corruptions_total{{{D}, pod="plugin-a"}}'
RESTARTS = 'compute_domain_daemon_imex_restarts_total{namespace="nvidia-dra-driver", pod="cd-a"}'
REQUESTS = "nvidia_dra_requests_total{%s, operation=%s}"
ERRORS = "nvidia_dra_node_prepare_errors_total{%s, error_type=%s}"
WAITING = "nvidia_dra_compute_domain_workload_waiting"
INFO = "nvidia_dra_compute_domain_info{status=%s}"

CASES = [
    Case(
        "ComputeDomainNotReady",
        "fires after 15m with a workload waiting",
        {WAITING: "2x30", INFO % '"NotReady"': "3x30", INFO % '"Ready"': "1x30"},
        "20m",
        [Firing({}, "2")],
    ),
    Case(
        "ComputeDomainNotReady",
        "pending before 15m",
        {WAITING: "0x5 1x30", INFO % '"NotReady"': "0x5 1x30", INFO % '"Ready"': "1x30"},
        "15m",
    ),
    Case(
        "ComputeDomainNotReady",
        "NotReady domains created ahead of their jobs",
        {WAITING: "0x30", INFO % '"NotReady"': "3x30", INFO % '"Ready"': "1x30"},
        "20m",
    ),
    Case(
        "ComputeDomainNotReady",
        "all Ready",
        {WAITING: "0x30", INFO % '"NotReady"': "0x30", INFO % '"Ready"': "3x30"},
        "20m",
    ),
    Case(
        "ComputeDomainPrepareErrors",
        "20% of prepares fail",
        {
            REQUESTS % (D, '"prepare"'): "0+10x40",
            REQUESTS % (D, '"unprepare"'): "0+100x40",
            ERRORS % (D, '"retryable"'): "0+2x40",
            ERRORS % (D, '"permanent"'): "0x40",
        },
        "25m",
        [Firing({"error_type": "retryable"})],
    ),
    Case(
        "ComputeDomainPrepareErrors",
        "5% of prepares fail",
        {
            REQUESTS % (D, '"prepare"'): "0+10x40",
            ERRORS % (D, '"retryable"'): "0+0.5x40",
            ERRORS % (D, '"permanent"'): "0x40",
        },
        "25m",
    ),
    Case(
        "ComputeDomainPrepareErrors",
        "no requests, no errors",
        {
            REQUESTS % (D, '"prepare"'): "0x40",
            ERRORS % (D, '"retryable"'): "0x40",
        },
        "25m",
    ),
    Case(
        "ComputeDomainImexRestarts",
        "4 restarts in 15m",
        {RESTARTS: "0x20 4x20"},
        "25m",
        [Firing({"namespace": "nvidia-dra-driver", "pod": "cd-a"}, "4")],
    ),
    Case("ComputeDomainImexRestarts", "3 restarts in 15m", {RESTARTS: "0x20 3x20"}, "25m"),
    Case("ComputeDomainImexRestarts", "restarts older than 15m", {RESTARTS: "0x20 4x20"}, "40m"),
    Case(
        "ComputeDomainCheckpointCorrupt",
        "series first exported at 1",
        {
            CHECKPOINT: "_x10 1x30",
        },
        "15m",
        [Firing({"driver": "compute-domain.nvidia.com", "pod": "plugin-a"})],
    ),
    Case(
        "ComputeDomainCheckpointCorrupt",
        "counter rises from 0",
        {CHECKPOINT: "0x70 1x30"},
        "80m",
        [Firing({"driver": "compute-domain.nvidia.com", "pod": "plugin-a"})],
    ),
    Case("ComputeDomainCheckpointCorrupt", "no corruption", {CHECKPOINT: "0x100"}, "80m"),
    Case(
        "ComputeDomainCheckpointCorrupt",
        "corruption over an hour ago",
        {
            CHECKPOINT: "_x10 1x100",
        },
        "75m",
    ),
]


def render(template: str, *, value: str, labels: dict[str, str]) -> str:
    """An annotation as Prometheus renders it, for the two template forms the rules use."""
    text = template.replace("{{ $value }}", value)
    return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""), text)


def promtool_test(case: Case) -> dict[str, Any]:
    """One promtool test group: ``case``'s series and its expected alerts."""
    rule = alert_rules()[case.alert]
    exp = []
    for f in case.fires:
        annotations = {
            k: render(v, value=f.value, labels=f.labels)
            for k, v in rule.get("annotations", {}).items()
        }
        exp.append(
            {"exp_labels": {**f.labels, **rule.get("labels", {})}, "exp_annotations": annotations}
        )
    return {
        "interval": "1m",
        "input_series": [{"series": s, "values": v} for s, v in case.series.items()],
        "alert_rule_test": [
            {"eval_time": case.eval_time, "alertname": case.alert, "exp_alerts": exp}
        ],
    }


@pytest.fixture(scope="module")
def promtool() -> str:
    proc = subprocess.run([str(PROMTOOL_SH)], capture_output=True, text=True, check=False)
    if proc.returncode != 0 or not proc.stdout.strip():
        pytest.fail(
            f"promtool is needed: run `{PROMTOOL_SH.relative_to(REPO)}` (fetches Debian's "
            f"prometheus package with apt-get, no install) and fix what it says:\n"
            f"{proc.stderr}"
        )
    return proc.stdout.strip().splitlines()[-1]


@pytest.fixture
def rules_file(tmp_path: Path) -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule_groups()}, sort_keys=False))
    return path


def run(argv: list[str], cwd: Path) -> None:
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"{' '.join(argv)}:\n{proc.stdout}\n{proc.stderr}"


def test_rules_file_is_valid(promtool: str, rules_file: Path) -> None:
    run([promtool, "check", "rules", rules_file.name], rules_file.parent)


def test_every_alert_has_firing_and_quiet_cases() -> None:
    for alert in alert_rules():
        cases = [c for c in CASES if c.alert == alert]
        assert any(c.fires for c in cases), f"{alert}: no case where it fires"
        assert any(not c.fires for c in cases), f"{alert}: no case where it stays quiet"
    assert {c.alert for c in CASES} <= set(alert_rules())


@pytest.mark.parametrize("alert", sorted(alert_rules()))
def test_alert_fires_only_on_its_series(promtool: str, rules_file: Path, alert: str) -> None:
    tests = [promtool_test(c) for c in CASES if c.alert == alert]
    spec = {"rule_files": [rules_file.name], "evaluation_interval": "1m", "tests": tests}
    (rules_file.parent / "tests.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    run([promtool, "test", "rules", "tests.yaml"], rules_file.parent)


def test_render() -> None:
    assert (
        render("{{ $value }} on {{ $labels.pod }}{{ $labels.x }}", value="4", labels={"pod": "p"})
        == "4 on p"
    )
