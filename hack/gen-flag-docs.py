"""Write the flag tables of docs/operators.md from the binaries' flag tables; ``--check`` fails
if they are stale.

Each binary declares its flags once (`pkg.reconcilers.flags.CONTROLLER_FLAGS`,
`pkg.kubeletplugin.options.PLUGIN_FLAGS`, `pkg.daemon.options.DAEMON_FLAGS`); this script puts
each table between its ``<!-- BEGIN FLAGS <binary> -->`` / ``<!-- END FLAGS <binary> -->``
markers (`pkg.runtime.flags.with_doc_table`), so names, env variables, defaults and help in the
docs are the code's.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

from pkg.daemon.options import DAEMON_FLAGS
from pkg.kubeletplugin.options import PLUGIN_FLAGS
from pkg.reconcilers.flags import CONTROLLER_FLAGS
from pkg.runtime.flags import with_doc_table

ROOT = pathlib.Path(__file__).resolve().parent.parent

DOC = ROOT / "docs" / "operators.md"


def rendered(doc: str) -> str:
    """``doc`` with every binary's flag table regenerated."""
    for table in (CONTROLLER_FLAGS, PLUGIN_FLAGS, DAEMON_FLAGS):
        doc = with_doc_table(doc, table)
    return doc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    current = DOC.read_text()
    text = rendered(current)
    if text == current:
        return 0
    if args.check:
        print("stale flag tables in docs/operators.md (run hack/gen-flag-docs.py)", file=sys.stderr)
        return 1
    DOC.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
