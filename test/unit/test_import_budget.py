"""Each binary's start path stays within a recorded import budget.

The budget is what the start path loads beyond a bare interpreter (``python -c pass``, whose
own start-up modules are subtracted): the number of modules and the size of their files. Both
are deterministic for a given lock file, so the check cannot flake with the machine's load the
way a timed ratio would (the project's tests never assert on wall time; the timed side-by-side
figures are `hack/bench/import_time.py`'s, in docs/benchmarks.md). What it catches is what
made start-up slow before: `import kubernetes` run eagerly (589 modules, 25.8 MB), the
OpenTelemetry SDK without an exporter (+28 modules), PyYAML (+2.9 MB). When a start path
legitimately grows, raise its budget here in the same change and say why in the commit.
"""

from __future__ import annotations

import pytest

from pkg.testing import startpaths

# name: (start path, module budget, byte budget), budgets ~6 % above what was recorded. Each
# path includes building the API client (`startpaths.CLIENT`). Recorded 2026-11-27 after the
# official ApiClient was replaced by `pkg.kube.config.Connection`: daemon first request (its pod
# label, sent while the rest loads) 186 modules / 7.16 MB, daemon 276 / 8.39 MB, plugin 410 /
# 28.2 MB, controller 295 / 8.31 MB (with the ApiClient: daemon 385 / 20.9 MB).
BUDGETS = {
    "daemon first request": (startpaths.DAEMON_FIRST_REQUEST, 197, 7_600_000),
    "daemon": (startpaths.DAEMON, 292, 8_900_000),
    "kubelet plugin": (startpaths.PLUGIN, 435, 30_000_000),
    "controller": (startpaths.CONTROLLER, 313, 8_800_000),
}


@pytest.mark.parametrize("name", sorted(BUDGETS))
def test_start_path_within_its_import_budget(name: str) -> None:
    code, max_modules, max_bytes = BUDGETS[name]
    cost = startpaths.measure(code)
    top = ", ".join(f"{pkg} {n}" for pkg, n in list(cost.packages().items())[:8])
    assert len(cost.modules) <= max_modules, (
        f"{name} start path loads {len(cost.modules)} modules (budget {max_modules}): {top}"
    )
    assert cost.source_bytes <= max_bytes, (
        f"{name} start path loads {cost.source_bytes} bytes of modules (budget {max_bytes}): {top}"
    )


def test_the_budget_catches_an_eager_official_client() -> None:
    """The check can fail: the daemon's path with ``import kubernetes`` in front is over."""
    code, max_modules, _ = BUDGETS["daemon"]
    cost = startpaths.measure("import kubernetes\n" + code)
    assert len(cost.modules) > max_modules


def test_the_budget_catches_the_official_api_client() -> None:
    """The check can fail: building the official ``ApiClient`` (every generated model,
    pydantic) instead of `pkg.kube.config.Connection` puts the daemon's first request over."""
    code, max_modules, max_bytes = BUDGETS["daemon first request"]
    official = "from kubernetes import client as k\nk.ApiClient(k.Configuration())\n"
    cost = startpaths.measure(code + official)
    assert len(cost.modules) > max_modules
    assert cost.source_bytes > max_bytes


def test_bare_interpreter_loads_nothing_extra() -> None:
    assert startpaths.measure(startpaths.BARE).modules == ()
