#!/usr/bin/env python3
"""Switch a running ComputeDomain workload from upstream's Go driver to ours and back, on real
nodes, and time formation side by side.

    .venv/bin/python hack/switch-drivers.py <upstream checkout> --k8s-test-infra <checkout> \\
        [--ref main --ref v0.4.1 --ref v25.12.0] [--repeat 2] [--out /tmp/switch-results.json]

For each ``--ref`` (default: ``main``): build upstream's three compute-domain binaries, image
and chart from the checkout into ``~/.cache/compute-domain-e2e/upstream/<commit>/`` (cached by
commit; ``hack/switch/upstream.py``) and NVIDIA's mock NVML from the k8s-test-infra checkout.
Then, holding ``/tmp/realnode-session.lock`` (the lock ``flock(1)`` takes, for the time the
nodes exist only), one session on the real-node lane's 2 nodes (``hack/localcluster``:
kubelet + containerd in their own namespaces):

1. ``helm install`` upstream's chart (local image, fake driver root with the mock NVML);
   workload A forms (ComputeDomain + one pod per node holding its channel): timed;
2. switch to ours as ``docs/migration.md`` says: ``helm uninstall`` (CRDs stay), upstream's
   leftover per-domain DaemonSets and daemon claim templates released (finalizers stripped,
   deleted: ``switch.drivers.release_leftovers``; ``--keep-leftovers`` skips it and shows the
   domain deletion that then hangs), ``kubectl apply --server-side -k
   config/overlays/e2e-real-nodes`` (``--force-conflicts`` when Helm's CRD fields conflict,
   noted in the summary); A still runs with its channel; deleting A unprepares cleanly
   (checkpoint entries and CDI specs gone from both nodes); workload B forms under ours: timed;
3. switch back: ``CHECKPOINT_COMPATIBILITY`` set to the target's level on our plugin
   (``--level-at-install``: already right after ours was installed, before B formed), ``kubectl
   delete -k config/overlays/without-crds``, ``helm install`` upstream; B still runs; deleting B
   is clean; workload C forms under upstream: timed;
4. ``--repeat`` more formations each (upstream, then ours after one more switch) for the
   side-by-side numbers, each deleted before the next.

A domain that is not deleted within a minute is a soft failure: the reason (the controller's
last error) is recorded, its DaemonSets' and claim templates' finalizers are stripped as admin,
and the run goes on if that frees it. Prints a summary per ref (versions, any upstream tree
patches, steps, timings, failures) and writes all of it as JSON to ``--out``. The host is
left as found (``RealNodes.stop`` sweeps it; leftovers are reported). Needs root and what the
real-node lane needs (``hack/node-deps.sh``).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

from localcluster import Cluster, bin_dir
from localcluster.hostnet import HOST_IP
from localcluster.realnode import RealNodes
from nodeimages import PAUSE_IMAGE, build_all
from switch import drivers, upstream, workload
from switch.drivers import UPSTREAM_NAMESPACE, Step
from switch.nodeprep import prepare_node_for_both
from testsupport.realsupport import DRIVER_NAMESPACE, GPU_NODE_LABELS, REAL_NODES, Kubectl

REPO = Path(__file__).resolve().parents[1]

LOCK = Path("/tmp/realnode-session.lock")
# The checkpoint level our plugin writes before handing a node to each upstream version
# (docs/migration.md, "Rolling a node back"); refs not listed get the default level.
LEVELS = {"v25.12.0": "v25.12.0", "v0.4.0": "v0.4.0"}
DEFAULT_LEVEL = "v0.4.1"
DOMAIN_GONE_S = 60.0


def log(msg: str) -> None:
    """Progress line on stderr."""
    print(f"[{time.strftime('%H:%M:%S')}] switch-drivers: {msg}", file=sys.stderr, flush=True)


@dataclass
class Run:
    """Everything one ref's session did."""

    ref: str
    upstream: str = ""
    commit: str = ""
    ours: str = ""
    steps: list[Step] = field(default_factory=list)
    formation: dict[str, list[float]] = field(default_factory=lambda: {"upstream": [], "ours": []})
    failed: str = ""
    soft_failures: list[str] = field(default_factory=list)
    patched: list[str] = field(default_factory=list)
    leftovers: list[str] = field(default_factory=list)
    diagnostics: str = ""

    def ratio(self) -> float | None:
        """median(upstream) / median(ours) formation time."""
        up, ours = self.formation["upstream"], self.formation["ours"]
        if not up or not ours:
            return None
        return statistics.median(up) / statistics.median(ours)


@contextlib.contextmanager
def realnode_lock() -> Iterator[None]:
    """``flock /tmp/realnode-session.lock`` for the with-block (the same flock(2) lock)."""
    with LOCK.open("a") as f:
        t0 = time.monotonic()
        fcntl.flock(f, fcntl.LOCK_EX)
        log(f"holding {LOCK} (waited {time.monotonic() - t0:.0f}s)")
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class Session:
    """One ref's steps on running nodes; each step appends to ``run.steps``."""

    def __init__(
        self,
        run: Run,
        kubectl: Kubectl,
        nodes: RealNodes,
        up: upstream.Upstream,
        *,
        release: bool,
        level_at_install: bool,
    ):
        self.release = release
        self.level_at_install = level_at_install
        self.run = run
        self.kubectl = kubectl
        self.nodes = nodes
        self.up = up

    def step(self, name: str, fn: Callable[[], list[str] | None]) -> None:
        """Run ``fn`` as a step: its returned problems (if any) fail the step and the run."""
        t0 = time.monotonic()
        log(name)
        problems = fn() or []
        step = Step(name, time.monotonic() - t0, not problems, list(problems))
        self.run.steps.append(step)
        log(step.line())
        if problems:
            raise AssertionError(f"{name}: {'; '.join(problems)}")

    def add(self, step: Step) -> None:
        """Record a step a ``drivers`` function timed itself."""
        self.run.steps.append(step)
        log(step.line())

    def form(self, who: str, wl: workload.Workload) -> None:
        """Form ``wl`` under ``who`` (upstream/ours) and record its time."""
        t0 = time.monotonic()
        log(f"workload {wl.ns}/{wl.name} forms under {who}")
        seconds = workload.form(self.kubectl, wl)
        self.run.formation[who].append(round(seconds, 2))
        notes = [f"channels {wl.channels}", f"load avg {os.getloadavg()[0]:.1f}"]
        self.run.steps.append(
            Step(f"{wl.name} forms under {who}: {seconds:.2f}s", time.monotonic() - t0, True, notes)
        )
        log(self.run.steps[-1].line())

    def node_state(self, label: str) -> None:
        """Note each node's checkpoint entries and CDI spec files, and the driver namespaces
        that still exist (for the summary)."""
        state = {n: workload.checkpoint_claims(self.nodes, n) for n in REAL_NODES}
        cdi = {n: workload.cdi_specs(self.nodes, n) for n in REAL_NODES}
        namespaces = [
            ns for ns in (UPSTREAM_NAMESPACE, DRIVER_NAMESPACE) if _exists(self.kubectl, ns)
        ]
        notes = [f"checkpoints {json.dumps(state)}", f"CDI {json.dumps(cdi)}"]
        notes.append(f"driver namespaces {namespaces}")
        self.run.steps.append(Step(f"node state {label}", 0.0, True, notes))

    def survived_and_deleted(self, wl: workload.Workload, who: str) -> None:
        """After a switch: ``wl`` still runs with its channel; deleting it is clean."""
        self.step(f"{wl.name} still has its channel under {who}", lambda: check(self, wl))
        self.delete(wl, who)

    def delete(self, wl: workload.Workload, who: str) -> None:
        """Delete ``wl``: its pods' claims must be unprepared cleanly (hard), its domain must go
        within :data:`DOMAIN_GONE_S` (soft: if not, record why, strip the finalizers of the
        domain's DaemonSets and claim templates as admin, and go on if that frees it)."""
        uid = self.kubectl.json("-n", wl.ns, "get", "computedomain", wl.name)["metadata"]["uid"]
        self.step(
            f"{wl.name} pods deleted under {who}: Unprepare clean (checkpoint, CDI)",
            lambda: workload.delete(self.kubectl, self.nodes, wl),
        )
        t0 = time.monotonic()
        name = f"{wl.name} ComputeDomain deleted under {who}"
        if workload.domain_gone(self.kubectl, wl, DOMAIN_GONE_S):
            self.add(Step(name, time.monotonic() - t0))
            return
        notes = [f"still there after {DOMAIN_GONE_S:.0f}s"]
        if err := drivers.last_error(self.kubectl, wl.name):
            notes.append(f"controller: {err}")
        try:
            stripped = drivers.strip_finalizers(self.kubectl, uid)
            notes.append(f"workaround, finalizers stripped as admin: {stripped}")
        except AssertionError as e:
            notes.append(f"workaround refused: {e}")
        gone = workload.domain_gone(self.kubectl, wl, DOMAIN_GONE_S)
        notes.append("then deleted" if gone else "still not deleted")
        self.add(Step(name, time.monotonic() - t0, False, notes))
        self.run.soft_failures.append(name)
        if not gone:
            raise AssertionError(f"{name}: {'; '.join(notes)}")

    def to_ours(self) -> None:
        """Upstream -> ours, by the runbook."""
        self.add(drivers.uninstall_upstream(self.kubectl))
        self.node_state("after upstream removed")
        if self.release:
            self.add(drivers.release_leftovers(self.kubectl, UPSTREAM_NAMESPACE))
        self.add(drivers.install_ours(self.kubectl))
        if self.level_at_install:
            level = LEVELS.get(self.up.ref, DEFAULT_LEVEL)
            self.add(drivers.set_checkpoint_level(self.kubectl, level))

    def to_upstream(self) -> None:
        """Ours -> upstream, by the runbook (checkpoint level first)."""
        level = LEVELS.get(self.up.ref, DEFAULT_LEVEL)
        self.add(drivers.set_checkpoint_level(self.kubectl, level))
        self.add(drivers.uninstall_ours(self.kubectl))
        self.node_state(f"after ours removed (level {level})")
        if self.release:
            self.add(drivers.release_leftovers(self.kubectl, DRIVER_NAMESPACE))
        self.add(drivers.install_upstream(self.kubectl, self.up))

    def main(self, repeat: int) -> None:
        """The steps of the module docstring."""
        k = self.kubectl
        self.add(drivers.install_upstream(k, self.up))
        a = workload.Workload("switch-a", "wl-a")
        self.form("upstream", a)
        self.to_ours()
        self.survived_and_deleted(a, "ours")
        b = workload.Workload("switch-b", "wl-b")
        self.form("ours", b)
        self.to_upstream()
        self.survived_and_deleted(b, "upstream")
        c = workload.Workload("switch-c", "wl-c")
        self.form("upstream", c)
        self.delete(c, "upstream")
        for i in range(repeat):
            w = workload.Workload(f"switch-u{i}", f"wl-u{i}")
            self.form("upstream", w)
            self.delete(w, "upstream")
        self.to_ours()
        for i in range(repeat):
            w = workload.Workload(f"switch-o{i}", f"wl-o{i}")
            self.form("ours", w)
            self.delete(w, "ours")
        self.node_state("at the end")


def check(session: Session, wl: workload.Workload) -> list[str]:
    """``workload.check_channels`` (a function so the step's lambda stays one line)."""
    return workload.check_channels(session.kubectl, wl)


def diagnostics(kubectl: Kubectl) -> str:
    """Pods of every namespace and the last lines of every driver pod's log."""
    out = [kubectl("get", "pods", "-A", "-o", "wide", check=False)]
    for ns in (UPSTREAM_NAMESPACE, DRIVER_NAMESPACE):
        for pod in kubectl.items("pods", "-n", ns) if _exists(kubectl, ns) else []:
            name = pod["metadata"]["name"]
            logs = kubectl("-n", ns, "logs", name, "--all-containers", "--tail=25", check=False)
            out.append(f"--- {ns}/{name} ---\n{logs}")
    return "\n".join(out)


def _exists(kubectl: Kubectl, ns: str) -> bool:
    return not drivers.namespace_gone(kubectl, ns)


def session(
    up: upstream.Upstream,
    mock: upstream.MockNvml,
    images: dict[str, Path],
    workdir: Path,
    repeat: int,
    *,
    release: bool,
    level_at_install: bool,
) -> Run:
    """One ref's session on fresh nodes (see the module docstring); always tears down."""
    run = Run(up.ref, upstream=up.describe, commit=up.commit, patched=list(up.patched))
    run.ours = ", ".join(r for r in images if "compute-domain" in r)
    shutil.rmtree(workdir, ignore_errors=True)
    cluster = Cluster.start(bin_dir(), workdir, node_names=REAL_NODES, advertise_address=HOST_IP)
    fleet: RealNodes | None = None
    kubectl = Kubectl(cluster.kubeconfig("admin"))
    try:
        t0 = time.monotonic()
        fleet = RealNodes.start(
            cluster,
            workdir / "nodes",
            REAL_NODES,
            images=sorted({*images.values(), up.archive}),
            pause_image=PAUSE_IMAGE,
            prepare=partial(prepare_node_for_both, library=mock.library, profile=mock.profile),
            labels=GPU_NODE_LABELS,
        )
        run.steps.append(Step("2 real nodes up (images imported)", time.monotonic() - t0))
        Session(run, kubectl, fleet, up, release=release, level_at_install=level_at_install).main(
            repeat
        )
    except Exception as e:
        run.failed = f"{type(e).__name__}: {e}"
        log(f"FAILED: {run.failed}\n{traceback.format_exc()}")
        with contextlib.suppress(Exception):
            run.diagnostics = diagnostics(kubectl)
    finally:
        if fleet is not None:
            run.leftovers = fleet.stop()
        cluster.stop()
        shutil.rmtree(workdir / "nodes", ignore_errors=True)
    return run


def summary(run: Run) -> str:
    """Human-readable summary of one run."""
    lines = [
        f"== upstream {run.ref} ({run.upstream}, {run.commit[:12]}) <-> ours ({run.ours})",
        *(f"  upstream tree patched: {p}" for p in run.patched),
        *(f"  {s.line()}" for s in run.steps),
    ]
    up, ours = run.formation["upstream"], run.formation["ours"]
    lines.append(f"  formation upstream: {up} s; ours: {ours} s")
    if (ratio := run.ratio()) is not None:
        lines.append(
            f"  median upstream {statistics.median(up):.2f}s / ours "
            f"{statistics.median(ours):.2f}s = {ratio:.2f}"
        )
    result = f"FAILED: {run.failed}" if run.failed else "all steps ok"
    if run.soft_failures and not run.failed:
        result = f"done, with soft failures: {run.soft_failures}"
    lines.append(f"  result: {result}")
    lines.append(f"  host as found: {'yes' if not run.leftovers else run.leftovers}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkout", type=Path, help="upstream git checkout (or git dir)")
    ap.add_argument("--ref", action="append", help="upstream ref (repeatable; default main)")
    ap.add_argument("--k8s-test-infra", type=Path, required=True, help="NVIDIA/k8s-test-infra")
    ap.add_argument("--repeat", type=int, default=2, help="extra formations per driver")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/switch-drivers"))
    ap.add_argument("--out", type=Path, default=Path("/tmp/switch-results.json"))
    ap.add_argument(
        "--keep-leftovers",
        action="store_true",
        help="do not release the removed driver's daemon DaemonSets/claim templates (shows "
        "the hang: the next driver cannot delete a domain the other one formed)",
    )
    ap.add_argument(
        "--level-at-install",
        action="store_true",
        help="set our plugin's CHECKPOINT_COMPATIBILITY to the ref's level right after "
        "installing ours, before any workload forms under it (not only before switching back)",
    )
    ap.add_argument("--build-only", action="store_true", help="build and cache, start no nodes")
    args = ap.parse_args()
    refs = args.ref or ["main"]
    t0 = time.monotonic()
    mock = upstream.build_mock_nvml(args.k8s_test_infra, log=log)
    ups = [upstream.prepare(args.checkout, ref, log=log) for ref in refs]
    images = build_all(log=log)
    log(f"builds ready in {time.monotonic() - t0:.0f}s")
    if args.build_only:
        return 0
    runs = []
    for up in ups:
        with realnode_lock():
            runs.append(
                session(
                    up,
                    mock,
                    images,
                    args.workdir / up.ref,
                    args.repeat,
                    release=not args.keep_leftovers,
                    level_at_install=args.level_at_install,
                )
            )
        print(summary(runs[-1]), flush=True)
        doc = [{**asdict(r), "ratio": r.ratio()} for r in runs]
        args.out.write_text(json.dumps({"mock_nvml": mock.commit, "runs": doc}, indent=1))
    return 1 if any(r.failed or r.leftovers for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
