"""``kubectl computedomain``: one screen that says what a ComputeDomain is doing and why.

Installed as the console script ``kubectl-computedomain`` (kubectl runs any ``kubectl-<name>``
on ``PATH`` as ``kubectl <name>``). Subcommands:

``get [-n NS | -A] [-o json|yaml]``
    a table of domains: namespace, name, status, nodes ready/total, cliques, age; with ``-o``
    kubectl's ``List`` of the objects;
``describe NAME [-n NS] [-o json|yaml]``
    the domain's status and nodes, its conditions, its cliques with every daemon's IMEX state
    (index, readiness, peers connected / unreachable, from the clique entries the daemons
    write), its daemon pods, its workload pods (pods of the domain's namespace whose claims come
    from its ResourceClaimTemplate) and its most recent Events; with ``-o`` the same objects as
    one document (``computeDomain``, ``cliques``, ``daemonPods``, ``workloadPods``, ``events``,
    ``hidden``).

Credentials are kubectl's: ``--kubeconfig``, else ``$KUBECONFIG``, else ``~/.kube/config``,
with ``--context``; the namespace defaults to the context's. Reads only; nothing is written.
A user with rights in one namespace only gets what those rights allow: the cliques and daemon
pods live in the driver's namespace, so each section the API server refuses is left out and
named under ``Hidden``, never an error. The rendering functions are pure (objects in, text
out) so tests need no cluster.

Dependencies: the API client (``pkg.kube``) and PyYAML only, never the driver's gRPC, NVML,
metrics or tracing stacks, so the ``kubectl-computedomain`` distribution
(``hack/build-cli-dist.py``) installs on a laptop with nothing else.
"""

from __future__ import annotations

import argparse
import calendar
import importlib.metadata
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pkg.api import constants as c
from pkg.api.daemonentry import DaemonEntry, clique_daemons, status_nodes
from pkg.base.types import JSON
from pkg.kube import resources as res
from pkg.kube.client import KubeClient, RestClient
from pkg.kube.config import KubeConfigError, load_api_client
from pkg.kube.errors import ApiError, ForbiddenError, NotFoundError

__all__ = [
    "DomainView",
    "collect",
    "main",
    "render_describe",
    "render_describe_document",
    "render_get",
    "render_get_list",
]

RECENT_EVENTS = 12


def _epoch(value: object) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return float(calendar.timegm(time.strptime(value[:19], "%Y-%m-%dT%H:%M:%S")))
    except ValueError:
        return None


def age(timestamp: object, now: float) -> str:
    """kubectl's short age (``45s``, ``12m``, ``3h``, ``2d``); ``<unknown>`` without a time."""
    then = _epoch(timestamp)
    if then is None:
        return "<unknown>"
    secs = max(0, int(now - then))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if secs >= 2 * size or (unit == "m" and secs >= size):
            return f"{secs // size}{unit}"
    return f"{secs}s"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "") -> list[str]:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    lines = []
    for row in (header, *rows):
        cells = [str(x).ljust(w) for x, w in zip(row, widths, strict=False)]
        lines.append((indent + "   ".join(cells)).rstrip())
    return lines


def _cliques_of(cd: JSON) -> list[str]:
    return sorted({e.clique_id or "-" for e in status_nodes(cd.get("status"))})


def render_get(domains: list[JSON], *, now: float) -> str:
    """The ``get`` table for ``domains`` (sorted by namespace and name)."""
    rows = []
    for cd in sorted(
        domains, key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"])
    ):
        meta, status = cd["metadata"], cd.get("status") or {}
        rows.append(
            (
                meta.get("namespace", ""),
                meta["name"],
                status.get("status") or "-",
                f"{status.get('readyNodes', 0)}/{status.get('nodeCount', 0)}",
                ",".join(_cliques_of(cd)) or "-",
                age(meta.get("creationTimestamp"), now),
            )
        )
    if not rows:
        return "No ComputeDomains found.\n"
    header = ("NAMESPACE", "NAME", "STATUS", "NODES", "CLIQUES", "AGE")
    return "\n".join(_table(header, rows)) + "\n"


@dataclass
class DomainView:
    """Everything ``describe`` shows about one domain, as read from the API server."""

    domain: JSON
    cliques: list[JSON]
    daemon_pods: list[JSON]
    workload_pods: list[JSON]
    events: list[JSON]
    hidden: list[str] = field(default_factory=list)  # sections the API server refused


def _items(client: KubeClient, resource: res.Resource, **kw: Any) -> list[JSON]:
    return list(client.list(resource, **kw).get("items") or [])


def uses_template(pod: JSON, template: str) -> bool:
    """Whether ``pod`` has a claim made from ResourceClaimTemplate ``template``."""
    claims = (pod.get("spec") or {}).get("resourceClaims") or []
    return any(
        isinstance(x, dict) and x.get("resourceClaimTemplateName") == template for x in claims
    )


def collect(client: KubeClient, namespace: str, name: str) -> DomainView:
    """Read the domain ``namespace/name`` and everything around it.

    Raises NotFoundError / ForbiddenError for the domain itself; a section the caller may not
    read (cliques and daemon pods across namespaces, pods, events) is empty and named in
    ``hidden``."""
    cd = client.get(res.COMPUTE_DOMAINS, name, namespace=namespace)
    uid = str(cd["metadata"].get("uid", ""))
    by_uid = f"{c.COMPUTE_DOMAIN_LABEL}={uid}"
    template = str(
        (((cd.get("spec") or {}).get("channel") or {}).get("resourceClaimTemplate") or {}).get(
            "name", ""
        )
    )
    hidden: list[str] = []

    def read(what: str, resource: res.Resource, **kw: Any) -> list[JSON]:
        try:
            return _items(client, resource, **kw)
        except ForbiddenError:
            where = f'namespace "{kw["namespace"]}"' if kw.get("namespace") else "all namespaces"
            hidden.append(f"{what}: you may not list {resource.plural} in {where}")
            return []

    pods = read("workload pods", res.PODS, namespace=namespace)
    events = read(
        "events", res.EVENTS, namespace=namespace, field_selector=f"involvedObject.uid={uid}"
    )
    events.sort(key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
    return DomainView(
        domain=cd,
        cliques=read(
            "cliques (IMEX state per daemon)", res.COMPUTE_DOMAIN_CLIQUES, label_selector=by_uid
        ),
        daemon_pods=read("daemon pods", res.PODS, label_selector=by_uid),
        workload_pods=[p for p in pods if template and uses_template(p, template)],
        events=events[-RECENT_EVENTS:],
        hidden=hidden,
    )


def _with_kind(obj: JSON, resource: res.Resource) -> JSON:
    """``obj`` with ``apiVersion``/``kind`` (list items arrive without them), as kubectl shows."""
    return {"apiVersion": resource.api_version, "kind": resource.kind, **obj}


def render_get_list(domains: list[JSON]) -> JSON:
    """``get -o json|yaml``: kubectl's ``List`` of ``domains`` (sorted by namespace and name)."""
    items = sorted(
        domains, key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"])
    )
    return {
        "apiVersion": "v1",
        "kind": "List",
        "metadata": {"resourceVersion": ""},
        "items": [_with_kind(cd, res.COMPUTE_DOMAINS) for cd in items],
    }


def render_describe_document(view: DomainView) -> JSON:
    """``describe -o json|yaml``: every object the screen is made of, in one document."""
    return {
        "computeDomain": _with_kind(view.domain, res.COMPUTE_DOMAINS),
        "cliques": [_with_kind(x, res.COMPUTE_DOMAIN_CLIQUES) for x in view.cliques],
        "daemonPods": [_with_kind(x, res.PODS) for x in view.daemon_pods],
        "workloadPods": [_with_kind(x, res.PODS) for x in view.workload_pods],
        "events": [_with_kind(x, res.EVENTS) for x in view.events],
        "hidden": list(view.hidden),
    }


def _serialize(doc: JSON, output: str) -> str:
    if output == "json":
        return json.dumps(doc, indent=4) + "\n"
    import yaml  # noqa: PLC0415  (only -o yaml needs it)

    text: str = yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)
    return text


def _pod_state(pod: JSON) -> tuple[str, str, str]:
    """(ready containers "n/m", phase or waiting reason, restarts)."""
    status = pod.get("status") or {}
    statuses = [s for s in status.get("containerStatuses") or [] if isinstance(s, dict)]
    ready = sum(1 for s in statuses if s.get("ready"))
    restarts = sum(int(s.get("restartCount") or 0) for s in statuses)
    phase = str(status.get("phase") or "Unknown")
    for s in statuses:
        waiting = (s.get("state") or {}).get("waiting")
        if isinstance(waiting, dict) and waiting.get("reason"):
            phase = str(waiting["reason"])
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        phase = "Terminating"
    total = len(statuses) or len((pod.get("spec") or {}).get("containers") or [])
    return f"{ready}/{total}", phase, str(restarts)


def _pods_table(pods: list[JSON], *, now: float, with_ns: bool) -> list[str]:
    if not pods:
        return ["  <none>"]
    rows = []
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        meta = pod["metadata"]
        ready, phase, restarts = _pod_state(pod)
        row = [
            meta["name"],
            str((pod.get("spec") or {}).get("nodeName") or "<none>"),
            ready,
            phase,
            restarts,
            age(meta.get("creationTimestamp"), now),
        ]
        rows.append([meta.get("namespace", ""), *row] if with_ns else row)
    header = ["NAME", "NODE", "READY", "STATUS", "RESTARTS", "AGE"]
    return _table(["NAMESPACE", *header] if with_ns else header, rows, indent="  ")


def _imex_state(daemon: DaemonEntry) -> str:
    unreachable, connected = daemon.unreachable_peers, daemon.connected_peers
    if unreachable is None and connected is None:
        return "not reported"
    text = f"{connected or 0} peers connected"
    if unreachable:
        text += "; cannot reach " + ", ".join(str(n) for n in unreachable)
    return text


def render_describe(view: DomainView, *, now: float) -> str:
    """The ``describe`` screen of one domain: its header, then one section each for the
    conditions, the members and their IMEX daemons, the pods, the Events and what could not be
    read."""
    status = view.domain.get("status") or {}
    out = _describe_header(view.domain, now=now)
    out.append("Conditions:")
    out += _conditions_table(status)
    out.append("Nodes and IMEX daemons (per clique):")
    out += _members_table(status, view.cliques)
    out.append("Daemon pods:")
    out += _pods_table(view.daemon_pods, now=now, with_ns=True)
    out.append("Workload pods:")
    out += _pods_table(view.workload_pods, now=now, with_ns=False)
    out.append("Events:")
    out += _events_table(view.events, now=now)
    if view.hidden:
        out.append("Hidden (your account may not read these; ask for read access):")
        out += [f"  {note}" for note in view.hidden]
    return "\n".join(out) + "\n"


def _describe_header(cd: JSON, *, now: float) -> list[str]:
    meta, spec, status = cd["metadata"], cd.get("spec") or {}, cd.get("status") or {}
    channel = spec.get("channel") or {}
    num_nodes = f", numNodes {spec['numNodes']}" if spec.get("numNodes") else ""
    out = [
        f"Name:            {meta['name']}",
        f"Namespace:       {meta.get('namespace', '')}",
        f"UID:             {meta.get('uid', '')}",
        f"Age:             {age(meta.get('creationTimestamp'), now)}",
        f"Status:          {status.get('status') or '-'} "
        f"({status.get('readyNodes', 0)}/{status.get('nodeCount', 0)} nodes ready{num_nodes})",
        f"Channel:         ResourceClaimTemplate "
        f"{(channel.get('resourceClaimTemplate') or {}).get('name', '-')}, "
        f"allocationMode {channel.get('allocationMode') or c.ALLOCATION_MODE_SINGLE}",
    ]
    if meta.get("deletionTimestamp"):
        out.append(f"Deleting since:  {meta['deletionTimestamp']}")
    return out


def _conditions_table(status: JSON) -> list[str]:
    conds = [x for x in status.get("conditions") or [] if isinstance(x, dict)]
    if not conds:
        return ["  <none>"]
    rows = [
        (x.get("type", ""), x.get("status", ""), x.get("reason", ""), x.get("message", ""))
        for x in conds
    ]
    return _table(("TYPE", "STATUS", "REASON", "MESSAGE"), rows, indent="  ")


def _members_table(status: JSON, cliques: list[JSON]) -> list[str]:
    """Each clique's daemons (by clique, then index) and how the domain counts them, then the
    members without a clique entry (non-NVLink nodes)."""
    nodes = {e.node_name: e for e in status_nodes(status)}
    rows = []
    seen: set[str] = set()
    for clique in sorted(cliques, key=lambda o: o["metadata"]["name"]):
        clique_id = (clique["metadata"].get("labels") or {}).get(c.CLIQUE_ID_LABEL, "")
        for d in sorted(clique_daemons(clique), key=lambda d: d.index):
            seen.add(d.node_name)
            domain_view = nodes[d.node_name].status if d.node_name in nodes else "(not counted)"
            daemon = (clique_id or d.clique_id, d.node_name, str(d.index), d.ip_address, d.status)
            rows.append((*daemon, domain_view, _imex_state(d)))
    for name, n in sorted(nodes.items()):
        if name not in seen:  # non-NVLink members have no clique entry
            member = (n.clique_id or "-", name, str(n.index), n.ip_address, "-", n.status)
            rows.append((*member, "no IMEX (no clique)"))
    if not rows:
        return ["  <none>"]
    header = ("CLIQUE", "NODE", "INDEX", "IP", "DAEMON", "IN DOMAIN", "IMEX")
    return _table(header, rows, indent="  ")


def _events_table(events: list[JSON], *, now: float) -> list[str]:
    if not events:
        return ["  <none>"]
    rows = [
        (
            e.get("type", ""),
            e.get("reason", ""),
            age(e.get("lastTimestamp") or e.get("eventTime"), now),
            str(e.get("count") or 1),
            str(e.get("message", "")).replace("\n", " "),
        )
        for e in events
    ]
    return _table(("TYPE", "REASON", "AGE", "COUNT", "MESSAGE"), rows, indent="  ")


def _context_namespace(kubeconfig: str | None, context: str | None) -> str:
    from kubernetes import config as k8s_config  # noqa: PLC0415  (only the CLI needs it)

    list_contexts: Callable[..., tuple[list[JSON], JSON]] = k8s_config.list_kube_config_contexts
    try:
        contexts, current = list_contexts(config_file=kubeconfig)
    except (k8s_config.ConfigException, OSError):
        return "default"
    chosen = next((x for x in contexts if x.get("name") == context), None) if context else current
    return str(((chosen or {}).get("context") or {}).get("namespace") or "default")


# The distribution the command came from: the CLI's own wheel, else the driver's (a checkout).
_DISTRIBUTIONS = ("kubectl-computedomain", "compute-domain-driver")


def cli_version() -> str:
    """The installed version of this command (``unknown`` outside any installed
    distribution)."""
    for name in _DISTRIBUTIONS:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kubectl computedomain", description="Show ComputeDomains and why they are not Ready."
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"kubectl-computedomain version {cli_version()}",
        help="print the version, then exit",
    )
    parser.add_argument("--kubeconfig", help="path of the kubeconfig file (default: $KUBECONFIG)")
    parser.add_argument("--context", help="kubeconfig context to use")
    parser.add_argument("-n", "--namespace", help="namespace (default: the context's)")
    sub = parser.add_subparsers(dest="command", required=True)
    get = sub.add_parser("get", help="list ComputeDomains")
    get.add_argument(
        "-A", "--all-namespaces", action="store_true", help="list them in every namespace"
    )
    describe = sub.add_parser("describe", help="show one ComputeDomain in detail")
    describe.add_argument("name", help="the ComputeDomain's name")
    for command in (get, describe):
        command.add_argument(
            "-n",
            "--namespace",
            dest="sub_namespace",
            metavar="NAMESPACE",
            default=None,
            help="namespace (default: the context's)",
        )
        command.add_argument(
            "-o", "--output", choices=["json", "yaml"], default=None, help="print the objects"
        )
    return parser


def _kubeconfig(flag: str | None) -> str | None:
    if flag:
        return flag
    if os.environ.get("KUBECONFIG"):
        return os.environ["KUBECONFIG"]
    default = os.path.expanduser("~/.kube/config")
    return default if os.path.exists(default) else None


def run(
    argv: Sequence[str], client: KubeClient | None = None, *, now: float | None = None
) -> tuple[int, str]:
    """Run the command line ``argv``; (exit code, text to print). ``client`` replaces the
    kubeconfig's (tests)."""
    args = _parser().parse_args(list(argv))
    kubeconfig = _kubeconfig(args.kubeconfig)
    if client is None:
        try:
            connection = load_api_client(kubeconfig, context=args.context)
        except KubeConfigError as err:
            return 1, f"Error: {err}\n"
        client = RestClient(connection, user_agent="kubectl-computedomain")
    namespace = args.sub_namespace or args.namespace
    if (
        namespace is None
        and client is not None
        and not (args.command == "get" and args.all_namespaces)
    ):
        namespace = _context_namespace(kubeconfig, args.context) if kubeconfig else "default"
    when = time.time() if now is None else now
    try:
        if args.command == "get":
            ns = None if args.all_namespaces else namespace
            domains = _items(client, res.COMPUTE_DOMAINS, namespace=ns)
            if args.output:
                return 0, _serialize(render_get_list(domains), args.output)
            return 0, render_get(domains, now=when)
        view = collect(client, str(namespace), args.name)
    except NotFoundError:
        return 1, f'Error: computedomain "{args.name}" not found in namespace "{namespace}"\n'
    except ForbiddenError:
        where = "all namespaces" if namespace is None else f'namespace "{namespace}"'
        hint = "; name one with -n NAMESPACE" if namespace is None else ""
        return 1, f"Error: you may not read ComputeDomains in {where}{hint}\n"
    except ApiError as err:
        return 1, f"Error: {err}\n"
    if args.output:
        return 0, _serialize(render_describe_document(view), args.output)
    return 0, render_describe(view, now=when)


def main(argv: Sequence[str] | None = None) -> int:
    """Console-script entry point (``kubectl-computedomain``)."""
    code, text = run(sys.argv[1:] if argv is None else argv)
    (sys.stdout if code == 0 else sys.stderr).write(text)
    return code


if __name__ == "__main__":
    sys.exit(main())
