"""``status.nodes`` is omitted when empty, as upstream's ``omitempty`` does (its e2e tests check
that ``.status`` has no ``nodes`` once the workload is gone)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from cdctl_fakes import (  # type: ignore[import-not-found, unused-ignore]
    RecordedEvents,
    clique,
    compute_domain,
    daemon_entry,
    daemon_pod,
)
from prometheus_client import CollectorRegistry

from pkg.api.computedomain import parse_compute_domain
from pkg.api.daemonentry import status_nodes
from pkg.kube import resources as res
from pkg.kube.client import RestClient
from pkg.reconcilers.cache import Caches
from pkg.reconcilers.computedomain import ComputeDomainReconciler
from pkg.reconcilers.config import ControllerConfig
from pkg.reconcilers.controller import TerminalError
from pkg.reconcilers.metrics import DomainMetrics
from pkg.reconcilers.status import collect_members, render_status
from pkg.testing.clock import FakeClock
from pkg.testing.fakeapiserver import FakeApiServer


@pytest.fixture
def reconciler(
    client: RestClient,
    caches: Caches,
    config: ControllerConfig,
    events: RecordedEvents,
    clock: FakeClock,
    registry: CollectorRegistry,
) -> ComputeDomainReconciler:
    return ComputeDomainReconciler(
        client=client,
        caches=caches,
        config=config,
        events=events,
        metrics=DomainMetrics(registry),
        clock=clock,
    )


def the_cd(server: FakeApiServer) -> Any:
    (cd,) = server.objects(res.COMPUTE_DOMAINS)
    return cd


def test_domain_without_members_has_no_nodes_field(
    server: FakeApiServer, reconciler: ComputeDomainReconciler
) -> None:
    server.seed(res.COMPUTE_DOMAINS, compute_domain(numNodes=1))
    reconciler.reconcile("team/cd1")  # workload template and finalizer
    reconciler.reconcile("team/cd1")
    status = the_cd(server)["status"]
    assert status["status"] == "NotReady" and status["nodeCount"] == 0
    assert "nodes" not in status


def test_invalid_domain_has_no_nodes_field(
    server: FakeApiServer, reconciler: ComputeDomainReconciler
) -> None:
    server.seed(
        res.COMPUTE_DOMAINS,
        compute_domain(channel={"resourceClaimTemplate": {"name": "x"}, "allocationMode": "Bogus"}),
    )
    with pytest.raises(TerminalError):
        reconciler.reconcile("team/cd1")
    assert "nodes" not in the_cd(server)["status"]


def test_last_member_leaving_removes_the_field() -> None:
    cd = parse_compute_domain(
        {
            "metadata": {"namespace": "t", "name": "cd", "uid": "u", "generation": 1},
            "spec": {"channel": {"resourceClaimTemplate": {"name": "r"}}},
        }
    )
    entries = [daemon_entry("a", index=0)]
    members = collect_members(
        cliques=[clique("u", "cl.1", entries)], pods=[daemon_pod("u", "a", clique="cl.1")], nodes={}
    )
    with_member = render_status(cd, members=members, previous=None, problem=None, now="T1")
    assert [n["name"] for n in with_member["nodes"]] == ["a"]
    empty = render_status(cd, members=[], previous=with_member, problem=None, now="T2")
    assert "nodes" not in empty and status_nodes(empty) == []
    # upstream's e2e suite checks the text: `kubectl get cd -o json | jq .status | grep nodes`
    # must find nothing once the last node left, conditions included
    assert "nodes" not in json.dumps(empty), json.dumps(empty)
