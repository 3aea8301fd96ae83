"""Are a driver process's informer caches equal to a fresh LIST?

Owns the comparison of what a process's caches hold, read from its ``/debug/informers``
document (``pkg.informers.snapshot``; the controller and the kubelet plugin serve it with
``--debug-endpoints``), with what the API server returns for a LIST of the same slice (same
resource, namespace, label and field selector): the same keys, each with the same
resourceVersion. A process first gets up to ``ready_timeout`` to serve synced caches at all
(restarting, or a restarted controller waiting for its predecessor's lease). Caches trail
writes by a watch event, so after that a difference is only reported when it persists for
``timeout`` seconds: every attempt reads the cache first and LISTs second, so an object written
in between shows as a newer resourceVersion in the LIST and is retried. What a difference looks
like: missing (listed, not cached), stale (cached, no longer listed), resourceVersion differs,
or the informer/process itself (not synced, endpoint unreachable, no informers). Knows nothing
about ComputeDomains.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pkg.kube.client import KubeClient
from pkg.kube.resources import Resource

TIMEOUT = 10.0  # how long a difference may persist once the process serves synced caches
# How long a process may take to serve synced caches at all: a controller restarted after a
# SIGKILL first waits for the dead leader's lease to expire (15 s), then syncs.
READY_TIMEOUT = 40.0
SHOWN = 10  # keys listed per kind of difference; the rest are counted


def fetch_document(endpoint: str, timeout: float = 5.0) -> dict[str, Any]:
    """The ``/debug/informers`` document of the process serving ``host:port``."""
    url = f"http://{endpoint}/debug/informers"
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        doc: dict[str, Any] = json.loads(resp.read())
    return doc


def slice_name(inf: Mapping[str, Any]) -> str:
    """``resource.group[ns=..,labels=..,fields=..,metadata]`` of one informer entry."""
    res = f"{inf['resource']}.{inf['group']}" if inf["group"] else str(inf["resource"])
    parts = [
        f"{k}={inf[f]}"
        for k, f in (("ns", "namespace"), ("labels", "labelSelector"), ("fields", "fieldSelector"))
        if inf.get(f)
    ]
    if inf.get("metadataOnly"):
        parts.append("metadata-only")
    return f"{res}[{','.join(parts)}]" if parts else res


def list_slice(client: KubeClient, inf: Mapping[str, Any]) -> tuple[dict[str, str], str]:
    """``{key: resourceVersion}`` of a fresh (consistent) LIST of the informer's slice, and
    the LIST's resourceVersion."""
    resource = Resource(
        str(inf["group"]),
        str(inf["version"]),
        str(inf["resource"]),
        str(inf["kind"]),
        bool(inf["namespaced"]),
    )
    out: dict[str, str] = {}
    token: str | None = None
    while True:
        page = client.list(
            resource,
            namespace=inf.get("namespace"),
            label_selector=inf.get("labelSelector"),
            field_selector=inf.get("fieldSelector"),
            limit=500,
            continue_token=token,
        )
        for obj in page.get("items") or []:
            meta = obj["metadata"]
            key = f"{meta['namespace']}/{meta['name']}" if meta.get("namespace") else meta["name"]
            out[str(key)] = str(meta.get("resourceVersion", ""))
        meta = page.get("metadata") or {}
        token = meta.get("continue") or None
        if token is None:
            return out, str(meta.get("resourceVersion", ""))


def diff(cached: Mapping[str, str], listed: Mapping[str, str]) -> list[str]:
    """The differences between a cache and a LIST ([] = equal), each kind on one line."""

    def show(keys: list[str], fmt: Any) -> str:
        more = f" (+{len(keys) - SHOWN} more)" if len(keys) > SHOWN else ""
        return ", ".join(fmt(k) for k in keys[:SHOWN]) + more

    missing = sorted(set(listed) - set(cached))
    stale = sorted(set(cached) - set(listed))
    changed = sorted(k for k in set(cached) & set(listed) if cached[k] != listed[k])
    out = []
    if missing:
        out.append("missing from the cache: " + show(missing, lambda k: f"{k}@{listed[k]}"))
    if stale:
        out.append("stale in the cache (not listed): " + show(stale, lambda k: f"{k}@{cached[k]}"))
    if changed:
        out.append(
            "resourceVersion differs (cache != list): "
            + show(changed, lambda k: f"{k} {cached[k]} != {listed[k]}")
        )
    return out


def compare_once(client: KubeClient, endpoint: str) -> list[str]:
    """One attempt: every informer of the process at ``endpoint`` against a fresh LIST."""
    try:
        doc = fetch_document(endpoint)
    except OSError as exc:
        return [f"/debug/informers at {endpoint} unreachable: {exc}"]
    informers = doc.get("informers") or []
    if not informers:
        return [f"no informers (leading: {doc.get('leading', '-')})"]
    problems = []
    for inf in informers:
        name = slice_name(inf)
        if not inf.get("synced"):
            problems.append(f"{name}: not synced")
            continue
        try:
            listed, list_rv = list_slice(client, inf)
        except Exception as exc:  # the apiserver may be restarting: retried
            problems.append(f"{name}: LIST failed: {exc}")
            continue
        # The informer's last absorbed RV tells a stalled watch from a lost event.
        at = f" (informer at RV {inf.get('lastSyncResourceVersion') or '?'}, LIST at {list_rv})"
        problems += [f"{name}: {d}{at}" for d in diff(inf.get("objects") or {}, listed)]
    return problems


def not_ready(endpoint: str) -> list[str]:
    """Why the process at ``endpoint`` has no caches to compare yet ([] = it has, all synced):
    unreachable (restarting), no informers (a controller waiting for the lease), not synced."""
    try:
        doc = fetch_document(endpoint)
    except OSError as exc:
        return [f"/debug/informers at {endpoint} unreachable: {exc}"]
    informers = doc.get("informers") or []
    if not informers:
        return [f"no informers (leading: {doc.get('leading', '-')})"]
    return [f"{slice_name(i)}: not synced" for i in informers if not i.get("synced")]


def check_process(
    client: KubeClient,
    endpoint: str,
    *,
    timeout: float = TIMEOUT,
    ready_timeout: float = READY_TIMEOUT,
    every: float = 0.25,
    resolve: Callable[[], str | None] | None = None,
) -> list[str]:
    """[] once the process's caches equal a fresh LIST; else the differences of the last
    attempt. First waits up to ``ready_timeout`` for the process to serve synced caches (a
    restarted controller waits for its predecessor's lease to expire), then tries for up to
    ``timeout`` seconds. ``resolve`` (optional) names the process's endpoint again whenever it
    is unreachable: a pod that came back on a new IP (its node rebooted) is followed, not the
    address its status showed before the kubelet reported the new one."""

    def attempt(check: Callable[[str], list[str]]) -> list[str]:
        nonlocal endpoint
        problems = check(endpoint)
        if resolve is not None and any(" unreachable: " in p for p in problems):
            endpoint = resolve() or endpoint
        return problems

    deadline = time.monotonic() + ready_timeout
    while problems := attempt(not_ready):
        if time.monotonic() >= deadline:
            return problems
        time.sleep(every)
    deadline = time.monotonic() + timeout
    while True:
        problems = attempt(lambda ep: compare_once(client, ep))
        if not problems or time.monotonic() >= deadline:
            return problems
        time.sleep(every)


def check_processes(
    client: KubeClient,
    endpoints: Mapping[str, str],
    *,
    timeout: float = TIMEOUT,
    ready_timeout: float = READY_TIMEOUT,
    resolve: Callable[[], Mapping[str, str]] | None = None,
) -> dict[str, list[str]]:
    """:func:`check_process` for every ``name -> endpoint``, in parallel; only the processes
    whose caches differ are in the result (empty = every cache equals a fresh LIST).
    ``resolve`` (optional) gives every process's current endpoint again, for a process that
    became unreachable (see :func:`check_process`)."""
    if not endpoints:
        return {}

    def again(name: str) -> Callable[[], str | None] | None:
        if resolve is None:
            return None
        return lambda: resolve().get(name)

    with ThreadPoolExecutor(max_workers=len(endpoints)) as pool:
        futures = {
            name: pool.submit(
                check_process,
                client,
                ep,
                timeout=timeout,
                ready_timeout=ready_timeout,
                resolve=again(name),
            )
            for name, ep in endpoints.items()
        }
        results = {name: f.result() for name, f in futures.items()}
    return {name: problems for name, problems in results.items() if problems}
