"""``hack/local-cluster``: bring the local control plane up (detached), print its env, tear it down.

    hack/local-cluster up   [--dir D] [--bin-dir B] [--nodes N] [--driver-namespace NS] [--build]
    hack/local-cluster env  [--dir D]        # eval "$(hack/local-cluster env)"
    hack/local-cluster down [--dir D] [--purge]

``up`` starts the components in their own sessions (they outlive this command) and records
them in ``<dir>/cluster.json``; ``down`` re-attaches through that file and stops them.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
from pathlib import Path

from . import DEFAULT_DRIVER_NAMESPACE, Cluster, ClusterError, bin_dir

DEFAULT_DIR = os.environ.get("CD_E2E_CLUSTER_DIR", "/tmp/compute-domain-local-cluster")


def _env(c: Cluster) -> str:
    pairs = {
        "KUBECONFIG": str(c.kubeconfig("admin")),
        "CD_E2E_CLUSTER_DIR": str(c.workdir),
        "CD_E2E_SERVER": c.server,
        "CD_E2E_CA_FILE": str(c.ca_file),
    }
    return "\n".join(f"export {k}={shlex.quote(v)}" for k, v in pairs.items())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="local-cluster",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start a fresh cluster (detached)")
    env = sub.add_parser("env", help="print shell exports for a running cluster")
    down = sub.add_parser("down", help="stop the cluster")
    for p in (up, env, down):
        p.add_argument("--dir", default=DEFAULT_DIR, help=f"cluster dir (default {DEFAULT_DIR})")
    up.add_argument("--bin-dir", help="control-plane binaries (default: build script's bin dir)")
    up.add_argument("--build", action="store_true", help="run hack/build-control-plane.sh first")
    up.add_argument("--nodes", type=int, default=64, help="pre-generated node identities")
    up.add_argument("--driver-namespace", default=DEFAULT_DRIVER_NAMESPACE)
    up.add_argument("--timeout", type=float, default=90.0)
    down.add_argument("--purge", action="store_true", help="also delete the cluster dir")
    args = ap.parse_args(argv)

    try:
        if args.cmd == "up":
            bins = Path(args.bin_dir) if args.bin_dir else bin_dir(build=args.build)
            c = Cluster.start(
                bins,
                args.dir,
                node_count=args.nodes,
                driver_namespace=args.driver_namespace,
                die_with_parent=False,
                timeout=args.timeout,
            )
            print(c.describe(), file=sys.stderr)
            print(_env(c))
        elif args.cmd == "env":
            c = Cluster.attach(args.dir)
            if not c.apiserver_ready():
                print(f"warning: apiserver at {c.server} is not ready", file=sys.stderr)
            print(_env(c))
        else:
            if (Path(args.dir) / "cluster.json").exists():
                Cluster.attach(args.dir).stop()
                print(f"stopped cluster in {args.dir}", file=sys.stderr)
            else:
                print(f"no cluster in {args.dir}", file=sys.stderr)
            if args.purge:
                shutil.rmtree(args.dir, ignore_errors=True)
    except (ClusterError, FileNotFoundError) as e:
        print(f"local-cluster: {e}", file=sys.stderr)
        return 1
    return 0
