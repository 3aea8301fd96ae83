"""What one chaos lifecycle recorded, and the figures of many (both chaos suites).

Owns the record of a lifecycle (:class:`Lifecycle`: its target, phase, what was hit, the
recovery time, stuck pods, leaks, crashes, cache comparisons and problems) and the Markdown
report ``docs/reliability.md`` holds (:func:`report`, written between a suite's markers by
:func:`write_report`). The simulated-node suite (``hack/testsupport/chaos.py``, ``make chaos``)
and the real-node suite (``hack/testsupport/chaosreal.py``, ``make chaos-real``) inject
different faults; each passes its own targets and phases.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Lifecycle:
    """What happened in one lifecycle (``problems`` empty = it behaved)."""

    index: int
    target: str
    phase: str
    fault: str = ""  # what was hit ("" = no such process existed at that moment)
    recovery: float | None = None  # fault (or its end) -> the phase's goal reached
    stuck_pods: list[str] = field(default_factory=list)
    leaks: dict[str, object] = field(default_factory=dict)
    crashes: list[str] = field(default_factory=list)
    caches_checked: bool = False  # the caches were compared with a LIST after the fault
    cache_diffs: dict[str, list[str]] = field(default_factory=dict)  # process -> differences
    cache_seconds: float = 0.0  # how long the check took (until every cache was equal)
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def line(self) -> str:
        """One progress line (what the suites print per lifecycle)."""
        rec = f"{self.recovery:.1f}s" if self.recovery is not None else "-"
        return (
            f"#{self.index}: {self.target}@{self.phase} hit={self.fault or '(none found)'} "
            f"recovery={rec} caches={self.cache_seconds:.1f}s took={self.seconds:.0f}s "
            f"problems={self.problems}"
        )


def pct(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank; ``values`` not empty)."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def report(
    results: Sequence[Lifecycle],
    *,
    targets: Sequence[str],
    phases: Sequence[str],
    seed: int,
    command: str,
    wall: float,
    missed_note: str = "e.g. no `nvidia-imex` yet",
) -> str:
    """The figures of a chaos run as Markdown: counts, faults by target and phase, recovery
    p50/p99/max per target, and every problem."""
    by = Counter((r.target, r.phase) for r in results)
    missed = sum(1 for r in results if not r.fault)
    checked = [r for r in results if r.caches_checked]
    equal = sum(1 for r in checked if not r.cache_diffs)
    waits = [r.cache_seconds for r in checked]
    took = (
        f"the check took p50 {pct(waits, 0.5):.1f} s, max {max(waits):.1f} s"
        if waits
        else "none checked"
    )
    lines = [
        f"- command: `{command}`",
        f"- seed: {seed}",
        f"- lifecycles: {len(results)} (wall time {wall / 60:.1f} min)",
        f"- faults injected: {len(results) - missed} ({missed} found no such process at that "
        f"moment, {missed_note})",
        f"- lifecycles with a problem: {sum(1 for r in results if r.problems)}",
        f"- stuck pods: {sum(len(r.stuck_pods) for r in results)}",
        f"- leaks: {sum(1 for r in results if r.leaks)}",
        f"- crashes (unexpected exits): {sum(len(r.crashes) for r in results)}",
        f"- caches equal to a fresh LIST after each fault: {equal}/{len(checked)} (controller and "
        f"every kubelet plugin, each informer's keys and resourceVersions; {took})",
        "",
        "Faults by target and phase:",
        "",
        "| target | " + " | ".join(phases) + " | total |",
        "|---|" + "---|" * (len(phases) + 1),
    ]
    for t in targets:
        row = [by[(t, p)] for p in phases]
        lines.append(f"| {t} | " + " | ".join(map(str, row)) + f" | {sum(row)} |")
    lines += [
        "",
        "Recovery (s) from the fault (a fault that lasts: from its end) to the phase's "
        "goal (Ready; pods and daemons gone; domain gone and nothing left):",
        "",
        "| target | n | p50 | p99 | max |",
        "|---|---|---|---|---|",
    ]
    for t in targets:
        rec = [r.recovery for r in results if r.target == t and r.recovery is not None]
        if rec:
            lines.append(
                f"| {t} | {len(rec)} | {pct(rec, 0.5):.1f} | {pct(rec, 0.99):.1f} | "
                f"{max(rec):.1f} |"
            )
    bad = [r for r in results if r.problems]
    if bad:
        lines += ["", "Problems:", ""]
        lines += [
            f"- #{r.index} {r.target}@{r.phase} ({r.fault}): {'; '.join(r.problems)}" for r in bad
        ]
    return "\n".join(lines) + "\n"


def write_report(path: Path, figures: str, *, marker: str = "chaos figures") -> None:
    """Replace what stands between ``<!-- {marker}: begin -->`` and ``... end -->`` in ``path``
    with ``figures`` (the block is appended when the markers are missing; the file created)."""
    begin, end = f"<!-- {marker}: begin -->", f"<!-- {marker}: end -->"
    block = f"{begin}\n{figures}{end}"
    text = path.read_text() if path.exists() else f"# Reliability\n\n{begin}\n{end}\n"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text)
