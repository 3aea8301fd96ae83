"""Bad-input suites: per-outcome counts and the "Bad input" section of docs/reliability.md.

The property-based suites (``test/unit/kubeletplugin/test_bad_input.py``,
``test/e2e/test_bad_compute_domains.py``) feed generated input (opaque configs, claims,
checkpoint files, gRPC requests, ComputeDomain specs) to the driver and classify where each case
ended (accepted, 422, per-claim error, condition, ...). Each suite counts its outcomes in a `Tally`;
with ``BADINPUT_COUNTS=<file.json>`` set, the tally is merged into that file when the suite
passes. ``python hack/badinput.py <file.json> docs/reliability.md`` then replaces the figures
between the ``bad input`` markers of the document (``make badinput`` does both).

Every suite draws its examples from hypothesis with the fixed `SEED` and no example database,
so the same code and hypothesis version generate the same cases and the same counts.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from chaosreport import write_report

SEED: Final = 20261123
"""hypothesis seed of every bad-input suite (``@hypothesis.seed(SEED)``)."""

ENV: Final = "BADINPUT_COUNTS"
SCALE_ENV: Final = "BADINPUT_SCALE"
MARKER: Final = "bad input figures"  # <!-- bad input figures: begin/end --> in the doc
COMMAND: Final = "make badinput"


def scale() -> int:
    """``$BADINPUT_SCALE`` (default 1; ``make badinput``: 5)."""
    return max(int(os.environ.get(SCALE_ENV) or 1), 1)


def examples(n: int) -> int:
    """``n`` hypothesis examples, times `scale`."""
    return n * scale()


@dataclass
class Tally:
    """Outcome counts of one suite; ``cases`` counts generated inputs, outcomes may be finer."""

    suite: str
    what: str
    where: str
    cases: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)

    def case(self) -> None:
        """Count one generated input."""
        self.cases += 1

    def count(self, outcome: str, n: int = 1) -> None:
        """Count ``n`` results classified as ``outcome``."""
        self.outcomes[outcome] += n

    def save(self, path: Path | None = None) -> None:
        """Merge this tally into ``path`` (default: ``$BADINPUT_COUNTS``; nothing if unset)."""
        target = path or (Path(os.environ[ENV]) if os.environ.get(ENV) else None)
        if target is None:
            return
        data: dict[str, Any] = json.loads(target.read_text()) if target.exists() else {}
        data[self.suite] = {
            "what": self.what,
            "where": self.where,
            "cases": self.cases,
            "scale": scale(),
            "outcomes": dict(sorted(self.outcomes.items())),
        }
        target.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def render(data: dict[str, Any], *, hypothesis_version: str = "") -> str:
    """The markdown figures for the counts file ``data`` (suite name -> saved tally)."""
    scales = sorted({int(s.get("scale", 1)) for s in data.values()})
    command = f"{COMMAND} BADINPUT_SCALE={','.join(map(str, scales))}"
    lines = [
        f"- command: `{command}` (hypothesis seed {SEED}"
        + (f", hypothesis {hypothesis_version}" if hypothesis_version else "")
        + ", no example database: the same cases on every run)",
        f"- suites: {len(data)}, generated cases: {sum(int(s['cases']) for s in data.values())}; "
        "unexpected exceptions, crashes, lost or leaked node state: 0 (any one fails its suite)",
    ]
    for name in sorted(data):
        s = data[name]
        lines += [
            "",
            f"**{name}** ({s['cases']} cases): {s['what']}. Errors show in: {s['where']}.",
            "",
            "| outcome | count |",
            "|---|---|",
            *(f"| {k} | {v} |" for k, v in sorted(s["outcomes"].items())),
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: badinput.py <counts.json> <doc.md>", file=sys.stderr)
        return 2
    counts, doc = Path(argv[0]), Path(argv[1])
    data = json.loads(counts.read_text())
    try:
        import hypothesis  # noqa: PLC0415 - only for the version line

        version = str(hypothesis.__version__)
    except ImportError:
        version = ""
    figures = render(data, hypothesis_version=version)
    write_report(doc, figures, marker=MARKER)
    print(figures, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
