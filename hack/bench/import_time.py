#!/usr/bin/env python3
"""Start-up import cost of each binary's hot path, side by side with baselines in one run.

For every binary the interpreter is started fresh and imports exactly what that binary's
start path imports before its first API request (the daemon's ``run``, the plugin's and the
controller's ``main``), then exits. Each variant runs ``--runs`` times, interleaved round-robin
so machine noise spreads over all of them; the figures are the p50 wall times and the ratio of
each to the bare interpreter (``python -c pass``) of the same run. The ``eager kubernetes``
variant first imports the official client the ordinary way (``import kubernetes``, which runs
its package ``__init__``: every subpackage, PyYAML, OAuth, pydantic), which is what every
binary paid before `pkg.kube.lazypkg`.

Usage: ``hack/bench/import_time.py [--runs N]``; prints a Markdown table for
``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from pkg.testing import startpaths

REPO = startpaths.REPO
DAEMON, PLUGIN, CONTROLLER = startpaths.DAEMON, startpaths.PLUGIN, startpaths.CONTROLLER
EAGER = "import kubernetes\n"

VARIANTS: dict[str, str] = {
    "python -c pass": startpaths.BARE,
    "daemon first request (pod label)": startpaths.DAEMON_FIRST_REQUEST,
    "daemon run path": DAEMON,
    "daemon run path, eager kubernetes": EAGER + DAEMON,
    "kubelet plugin main": PLUGIN,
    "controller main": CONTROLLER,
}


def once(code: str) -> float:
    """Wall seconds of one fresh interpreter running ``code`` from the checkout."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)
    return time.perf_counter() - start


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args(argv)
    samples: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(args.runs):
        for name, code in VARIANTS.items():
            samples[name].append(once(code))
    base = statistics.median(samples["python -c pass"])
    print(f"| variant | p50 (s) | min (s) | ratio to `python -c pass` | runs: {args.runs} |")
    print("|---|---|---|---|---|")
    for name, values in samples.items():
        p50 = statistics.median(values)
        print(f"| {name} | {p50:.3f} | {min(values):.3f} | {p50 / base:.1f}x | |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
