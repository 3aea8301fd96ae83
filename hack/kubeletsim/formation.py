"""One ComputeDomain formation split into stages, each owned by the driver, Kubernetes or the sim.

Owns turning three recordings of one formation into per-node milestones and stage latencies:

* pod observations (:class:`PodTimes`): wall-clock times at which an admin watch saw each pod
  first, bound (``spec.nodeName``), with a ``podIP``, ``Running`` and ``Ready`` (millisecond
  precision; object timestamps have only whole seconds). The controller writes a daemon's
  clique entry once the kubelet has reported the daemon pod's IP, so the join is split there:
  the wait for that status write is the kubelet's (here its stand-in's), the rest the
  driver's;
* the kubelet stand-in's own records: when it called ``NodePrepareResources`` and when the call
  returned, when it started the daemon's process, and when the simulated IMEX began listening
  (its log line);
* the formation trace (``OTEL_TRACES_EXPORTER=file`` JSON lines, see docs/operators.md
  "Tracing"): per node the plugin's ``label node`` and the daemon's ``IMEX daemon`` span (it
  starts when the daemon's loop starts) with ``join``, ``start IMEX``, ``IMEX ready on the
  node`` (the node-local readiness record the plugin also accepts) and ``IMEX ready`` (the
  entry says Ready); the daemon has signalled Ready at the earlier of the two.

Per node the milestones follow one another; :data:`STAGES` names each interval and who owns
it. ``driver`` = code of this repository (controller, kubelet plugin, IMEX daemon);
``kubernetes`` = kube-controller-manager (DaemonSet, ResourceClaim controllers) and the
scheduler (DRA allocation, binding); ``simulation`` = the kubelet stand-in (noticing a pod,
calling the plugin, Prepare retries, CDI resolution, starting a process, status writes) and the
simulated IMEX. A stage whose end comes before its start (the channel Prepare attempt is
already waiting when the daemon turns Ready) counts as zero.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

Span = dict[str, Any]


@dataclass
class PodTimes:
    """Wall-clock (epoch seconds) observations of one pod by a watch."""

    namespace: str
    name: str
    node: str = ""
    seen: float | None = None
    bound: float | None = None
    ip: float | None = None  # first seen with ``status.podIP`` (the kubelet's status write)
    running: float | None = None
    ready: float | None = None


# (stage, owner, start milestone, end milestone)
STAGES: tuple[tuple[str, str, str, str], ...] = (
    (
        "workload pod bound -> kubelet calls Prepare (only if the plugin labelled the node)",
        "simulation",
        "bound",
        "label_start",
    ),
    ("-> node labelled, DaemonSet present", "driver", "label_start", "labelled"),
    ("node labelled -> daemon pod created", "kubernetes", "labelled", "daemon_created"),
    (
        "daemon pod created -> bound (claim allocated)",
        "kubernetes",
        "daemon_created",
        "daemon_bound",
    ),
    (
        "daemon pod bound -> kubelet calls Prepare",
        "simulation",
        "daemon_bound",
        "daemon_prepare_start",
    ),
    ("daemon claim Prepare (gRPC call)", "driver", "daemon_prepare_start", "daemon_prepare_end"),
    (
        "daemon claim prepared -> daemon process started",
        "simulation",
        "daemon_prepare_end",
        "daemon_process",
    ),
    ("daemon process -> daemon loop running", "driver", "daemon_process", "daemon_start"),
    (
        "daemon loop -> kubelet reported the daemon pod's IP",
        "simulation",
        "daemon_start",
        "daemon_ip",
    ),
    ("pod IP reported -> joined the clique", "driver", "daemon_ip", "joined"),
    ("joined -> IMEX started", "driver", "joined", "imex_started"),
    ("IMEX started -> simulated IMEX listening", "simulation", "imex_started", "imex_listening"),
    ("IMEX listening -> daemon signals Ready", "driver", "imex_listening", "imex_ready"),
    (
        "Ready signalled -> kubelet's final Prepare call",
        "simulation",
        "imex_ready",
        "final_attempt_start",
    ),
    ("final channel Prepare call -> returns", "driver", "final_attempt_start", "prepare_end"),
    ("Prepare returned -> workload pod Ready", "simulation", "prepare_end", "pod_ready"),
)
UNATTRIBUTED = "unattributed (a milestone is missing)"
OWNERS = ("driver", "kubernetes", "simulation", "unattributed")


@dataclass
class NodeFormation:
    node: str
    milestones: dict[str, float] = field(default_factory=dict)

    def stage_seconds(self) -> dict[str, float]:
        """Duration of each stage (0 when it overlapped the previous one; absent when unknown).

        Each stage starts at the later of its own start milestone and the previous stage's end,
        so the stages of one node add up to its bound -> Ready time. A stage whose start
        milestone is missing runs from the previous end under the key :data:`UNATTRIBUTED`."""
        out: dict[str, float] = {}
        cursor = self.milestones.get("bound")
        for name, _owner, start, end in STAGES:
            a, b = self.milestones.get(start), self.milestones.get(end)
            if b is None or cursor is None:
                continue
            if a is None:
                out[UNATTRIBUTED] = out.get(UNATTRIBUTED, 0.0) + max(0.0, b - cursor)
            else:
                out[name] = max(0.0, b - max(a, cursor))
            cursor = max(cursor, b)
        return out

    def total(self) -> float | None:
        b, r = self.milestones.get("bound"), self.milestones.get("pod_ready")
        return None if b is None or r is None else r - b


def span_time(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def read_spans(path: Path, trace_id: int | None = None) -> list[Span]:
    """The spans in a ``file`` exporter's JSON lines (of one trace if ``trace_id`` is given);
    a line still being written by another process is skipped."""
    want = None if trace_id is None else f"0x{trace_id:032x}"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            span = json.loads(line)
        except ValueError:
            continue  # a line being written by another process
        if want is None or span["context"]["trace_id"] == want:
            out.append(span)
    return out


def _node(span: Span) -> str:
    return str(span["attributes"].get("k8s.node.name", ""))


def formations(
    spans: list[Span],
    workload: list[PodTimes],
    daemons: list[PodTimes],
    harness: dict[str, dict[str, float]],
    *,
    labelled: dict[str, float] | None = None,
    daemon_set: float | None = None,
) -> list[NodeFormation]:
    """One :class:`NodeFormation` per workload pod's node.

    ``harness`` holds, per node, the milestones the kubelet stand-in recorded itself
    (``prepare_start``, ``final_attempt_start``, ``prepare_end``, ``daemon_prepare_start``,
    ``daemon_prepare_end``, ``daemon_process``, ``imex_listening``); spans fill in the rest.
    ``labelled`` holds, per node, when a watch first saw the node labelled for the domain,
    ``daemon_set`` when a watch first saw the domain's DaemonSet: a node can get its daemon pod
    only once both are there (see :func:`label_milestones`)."""

    def children(parent: Span, name: str) -> list[Span]:
        pid = parent["context"]["span_id"]
        return [s for s in spans if s["parent_id"] == pid and s["name"] == name]

    out = []
    daemon_pods = {p.node: p for p in daemons if p.node}
    for pod in workload:
        f = NodeFormation(pod.node)
        m = f.milestones
        for key, value in (("bound", pod.bound), ("pod_ready", pod.ready)):
            if value is not None:
                m[key] = value
        d = daemon_pods.get(pod.node)
        if d is not None:
            for key, value in (
                ("daemon_created", d.seen),
                ("daemon_bound", d.bound),
                ("daemon_ip", d.ip),
            ):
                if value is not None:
                    m[key] = value
        mine = [s for s in spans if _node(s) == pod.node]
        attempts = sorted(
            (s for s in mine if s["name"] == "prepare channel claim"),
            key=lambda s: span_time(s["start_time"]),
        )
        labels = [x for a in attempts for x in children(a, "label node")]
        m.update(harness.get(pod.node, {}))
        plugin = min((span_time(x["end_time"]) for x in labels), default=None)
        watched = (labelled or {}).get(pod.node)
        if daemon_set is not None:  # no daemon pod before its DaemonSet, whoever labelled
            plugin = None if plugin is None else max(plugin, daemon_set)
            watched = None if watched is None else max(watched, daemon_set)
        m.update(label_milestones(m, watched, plugin))
        imex = sorted(
            (s for s in mine if s["name"] == "IMEX daemon"),
            key=lambda s: span_time(s["start_time"]),
        )
        if imex:
            m["daemon_start"] = span_time(imex[0]["start_time"])
            for step, key in (
                ("join", "joined"),
                ("start IMEX", "imex_started"),
                ("IMEX ready on the node", "imex_ready"),
                ("IMEX ready", "imex_ready"),
            ):
                found = children(imex[0], step)
                if found:  # Ready: the node-local record, else the entry, whichever came first
                    end = span_time(found[0]["end_time"])
                    m[key] = min(end, m.get(key, end))
        out.append(f)
    return out


def label_milestones(
    m: dict[str, float], watched: float | None, plugin: float | None
) -> dict[str, float]:
    """``label_start`` and ``labelled`` of one node.

    The DaemonSet controller creates the node's daemon pod once the node carries the domain's
    label and the domain's DaemonSet exists. Our controller labels the node when it sees the
    workload claim's allocation (``watched``, the first time a watch saw it); the plugin's
    channel Prepare labels it too, as upstream's does (``plugin``: its ``label node`` span
    ended, or the DaemonSet appeared if later; when the label was already there that span is
    only a read, off the critical path).
    Whichever came first labelled the node. If it was the controller, the whole wait from the
    pod's binding is the driver's (the kubelet calling Prepare meanwhile changes nothing); if
    it was the plugin, the wait for the kubelet's call is the simulation's."""
    if watched is not None and (plugin is None or watched <= plugin):
        return {"labelled": watched, "label_start": m["bound"]} if "bound" in m else {}
    if plugin is None:
        return {}
    out = {"labelled": plugin}
    if "prepare_start" in m:
        out["label_start"] = m["prepare_start"]
    return out


def summarize(nodes: list[NodeFormation]) -> dict[str, Any]:
    """Per stage: median and max over nodes, and the breakdown of the last node to be Ready."""
    complete = [n for n in nodes if n.total() is not None]
    if not complete:
        return {"error": "no node with both bound and Ready"}
    last = max(complete, key=lambda n: n.milestones["pod_ready"])
    per_stage: dict[str, dict[str, Any]] = {}
    per_node = [n.stage_seconds() for n in complete]
    for name, owner, _a, _b in STAGES:
        values = [s[name] for s in per_node if name in s]
        per_stage[name] = {
            "owner": owner,
            "p50": statistics.median(values) if values else None,
            "max": max(values) if values else None,
            "last_node": last.stage_seconds().get(name),
        }
    owner_totals = dict.fromkeys(OWNERS, 0.0)
    for name, seconds in last.stage_seconds().items():
        owner_totals[_owner(name)] += seconds
    p50_owner = {
        o: statistics.median(
            sum(v for k, v in n.stage_seconds().items() if _owner(k) == o) for n in complete
        )
        for o in OWNERS
    }
    first_bound = min(n.milestones["bound"] for n in complete)
    return {
        "nodes": len(nodes),
        "complete": len(complete),
        "last_node": last.node,
        "last_node_total": last.total(),
        "all_bound_to_all_ready": last.milestones["pod_ready"]
        - max(n.milestones["bound"] for n in complete),
        "first_bound_to_all_ready": last.milestones["pod_ready"] - first_bound,
        "stages": per_stage,
        "last_node_by_owner": owner_totals,
        "p50_node_by_owner": p50_owner,
        "missing": sorted({k for n in nodes for k in _all_milestones() - set(n.milestones)}),
        "milestones": {n.node: _in_order(n.milestones) for n in nodes},
    }


def _in_order(milestones: dict[str, float]) -> dict[str, float]:
    return dict(sorted(milestones.items(), key=lambda kv: kv[1]))


def _owner(stage: str) -> str:
    return next((o for n, o, _a, _b in STAGES if n == stage), "unattributed")


def _all_milestones() -> set[str]:
    return {x for _n, _o, a, b in STAGES for x in (a, b)}
