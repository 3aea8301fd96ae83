"""Each binary's start path stays within a recorded import budget (issue 32 item 4).

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

# name: (start path, module budget, byte budget). Recorded 2026-11-27 at d0c829d: daemon 264
# modules / 7.85 MB, plugin 399 / 28.3 MB, controller 281 / 7.77 MB; budgets ~6 % above. The
# daemon's first request (its pod label, sent while the rest loads) recorded at 1396f0d+:
# 172 modules / 6.42 MB.
BUDGETS = {
    "daemon first request": (startpaths.DAEMON_FIRST_REQUEST, 182, 6_800_000),
    "daemon": (startpaths.DAEMON, 280, 8_400_000),
    "kubelet plugin": (startpaths.PLUGIN, 425, 30_000_000),
    "controller": (startpaths.CONTROLLER, 300, 8_300_000),
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


def test_bare_interpreter_loads_nothing_extra() -> None:
    assert startpaths.measure(startpaths.BARE).modules == ()
