"""Every key the controller's event handlers enqueue names an object its caches hold.

The caches key objects with :func:`pkg.informers.store.meta_namespace_key` and a reconcile
looks its key up there: a handler that spelled a key another way (``None/name`` for a
cluster-scoped object, say) would enqueue keys that never resolve, and the object would
silently never be reconciled. These tests fill a manager's caches directly (no informer runs)
and check that each mapper's keys resolve, and that no module of ``pkg/`` builds an object's
key by hand.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from cdctl_fakes import (  # type: ignore[import-not-found, unused-ignore]
    DRIVER_NS,
    RecordedEvents,
    clique,
    compute_domain,
    daemon_entry,
    daemon_pod,
    node,
)
from opentelemetry import trace
from prometheus_client import CollectorRegistry

from pkg.api import constants as c
from pkg.base.clock import RealClock
from pkg.base.types import JSON
from pkg.informers.store import DeletedFinalStateUnknown, meta_namespace_key
from pkg.kube.client import RestClient
from pkg.reconcilers.config import ControllerConfig
from pkg.reconcilers.hostmanaged import HostManagedManager
from pkg.reconcilers.manager import ControllerManager

UID = "uid-1"
REPO = Path(__file__).resolve().parents[3]


def _domain() -> JSON:
    cd: JSON = compute_domain("cd1", "team", numNodes=2)
    cd["metadata"]["uid"] = UID
    return cd


@pytest.fixture
def manager(
    client: RestClient,
    config: ControllerConfig,
    registry: CollectorRegistry,
    events: RecordedEvents,
) -> Iterator[ControllerManager]:
    mgr = ControllerManager(
        client=client,
        config=config,
        registry=registry,
        tracer=trace.NoOpTracer(),
        clock=RealClock(),
        informer_clock=RealClock(),
        events=events,
    )
    informers = mgr._informers
    informers["compute_domains"].indexer.add(_domain())
    informers["nodes"].indexer.add(node("n1", labels={c.COMPUTE_DOMAIN_LABEL: UID}))
    informers["pods[0]"].indexer.add(daemon_pod(UID, "n1", clique="cl.1"))
    informers["cliques[0]"].indexer.add(clique(UID, "cl.1", [daemon_entry("n1", index=0)]))
    yield mgr


def test_the_store_key_is_namespace_slash_name_or_name_when_cluster_scoped() -> None:
    assert meta_namespace_key(_domain()) == "team/cd1"
    assert meta_namespace_key(node("n1")) == "n1"
    assert meta_namespace_key(DeletedFinalStateUnknown("team/cd1", _domain())) == "team/cd1"


def test_domain_keys_from_every_kind_resolve_in_the_domain_cache(
    manager: ControllerManager,
) -> None:
    pod = daemon_pod(UID, "n1", clique="cl.1")
    sources = {
        "pod": manager._domain_keys(pod),
        "node": manager._domain_keys_of_node(node("n1", labels={c.COMPUTE_DOMAIN_LABEL: UID})),
        "waiting": manager._waiting_domain_keys(),
    }
    for source, keys in sources.items():
        assert keys == ["team/cd1"], source
        assert manager.caches.compute_domains.get_by_key(keys[0]) is not None, source


def test_clique_keys_resolve_in_the_clique_cache(manager: ControllerManager) -> None:
    for keys in (
        manager.prune.keys_for_pod(daemon_pod(UID, "n1", clique="cl.1")),
        manager.prune.keys_for_node(node("n1")),
    ):
        assert keys == [f"{DRIVER_NS}/{c.clique_object_name(UID, 'cl.1')}"]
        assert manager.caches.cliques.get_by_key(keys[0]) is not None


def test_a_cluster_scoped_object_is_keyed_by_its_name(manager: ControllerManager) -> None:
    key = meta_namespace_key(node("n1"))
    assert manager.caches.nodes.get_by_key(key) is not None


def test_host_managed_keys_resolve_in_its_domain_cache(
    client: RestClient,
    config: ControllerConfig,
    registry: CollectorRegistry,
    events: RecordedEvents,
) -> None:
    mgr = HostManagedManager(
        client=client,
        config=config,
        registry=registry,
        tracer=trace.NoOpTracer(),
        clock=RealClock(),
        informer_clock=RealClock(),
        events=events,
    )
    mgr._informers["compute_domains"].indexer.add(_domain())
    key = meta_namespace_key(_domain())
    assert mgr.caches.compute_domains.get_by_key(key) is not None


# An f-string joining a namespace and a name read from an object's metadata, such as
# f"{meta['namespace']}/{meta['name']}" or f"{m.get('namespace')}/{m.get('name')}".
_HAND_MADE_KEY = re.compile(r"namespace['\"]\]?\)?\}/\{[^}]*\bname['\"]")


def test_no_module_builds_an_object_key_by_hand() -> None:
    offenders = [
        f"{path.relative_to(REPO)}:{n}"
        for path in sorted((REPO / "pkg").rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if _HAND_MADE_KEY.search(line)
    ]
    assert offenders == [], "use pkg.informers.store.meta_namespace_key"
