#!/usr/bin/env python3
"""Build the real-node e2e images without Docker (see hack/nodeimages and docs/e2e-build.md).

    hack/build-node-images.py                  build what is missing; prints "<ref> <archive>"
    hack/build-node-images.py --check          exit 0 iff every archive is cached and current
    hack/build-node-images.py --import --ctr BIN --address SOCK
                                               ... and import them into that containerd

Archives go to ${CD_E2E_CACHE:-~/.cache/compute-domain-e2e}/images/oci/ (``--cache-dir`` sets
the cache root).  Progress goes to stderr; stdout carries only the reference/archive lines.
Building needs root (chroot self-check), apt/dpkg, gcc, go and pip.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

HACK = Path(__file__).resolve().parent
VENV_PY = HACK.parent / ".venv" / "bin" / "python"
if VENV_PY.exists() and Path(sys.prefix).resolve() != VENV_PY.parent.parent.resolve():
    os.execv(str(VENV_PY), [str(VENV_PY), __file__, *sys.argv[1:]])

from nodeimages import (  # noqa: E402  (after the re-exec under the venv)
    BuildError,
    DebError,
    build_all,
    import_images,
    is_fresh,
)


def main(argv: list[str]) -> int:
    """CLI entry point; returns the exit code."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--cache-dir", type=Path, default=None, help="e2e cache root")
    p.add_argument("--check", action="store_true", help="exit 0 iff nothing needs building")
    p.add_argument("--import", dest="do_import", action="store_true", help="import with ctr")
    p.add_argument("--ctr", type=Path, help="ctr binary (with --import)")
    p.add_argument("--address", help="containerd socket (with --import)")
    args = p.parse_args(argv)
    try:
        if args.check:
            return 0 if is_fresh(args.cache_dir) else 1
        archives = build_all(args.cache_dir)
        for ref, path in archives.items():
            print(f"{ref} {path}")
        if args.do_import:
            if args.ctr is None or args.address is None:
                p.error("--import needs --ctr and --address")
            import_images(args.ctr, args.address, archives.values())
    except (BuildError, DebError, RuntimeError) as e:
        print(f"build-node-images: ERROR: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
