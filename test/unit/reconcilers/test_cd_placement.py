"""Placement SingleClique (pkg.api.placement, pkg.reconcilers.placement): a domain that asks for
it gets a workload ResourceClaimTemplate pinned to one NVLink clique with room for it, chosen
once; while none has room it waits (Ready=False/NoCliqueFits) and no template exists.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
from cdctl_fakes import (  # type: ignore[import-not-found, unused-ignore]
    LaggingCache,
    RecordedEvents,
    compute_domain,
    node,
    resource_slice,
)

from pkg.api import constants as c
from pkg.api.computedomain import InvalidComputeDomainError, parse_compute_domain
from pkg.api.placement import (
    PINNED_CLIQUE_ANNOTATION,
    PLACEMENT_ANNOTATION,
    clique_selector,
    valid_clique_id,
)
from pkg.base.types import JSON
from pkg.kube import resources as res
from pkg.kube.errors import NotFoundError
from pkg.kube.resources import Resource
from pkg.reconcilers.cache import Caches
from pkg.reconcilers.computedomain import ComputeDomainReconciler
from pkg.reconcilers.conditions import REASON_INVALID_SPEC, REASON_NO_CLIQUE_FITS
from pkg.reconcilers.objects import render_workload_rct
from pkg.reconcilers.placement import REASON_PINNED_TO_CLIQUE, RECHECK, choose_clique
from pkg.testing.fakeapiserver import FakeApiServer

A, B = "00000000-0000-0000-0000-00000000c11e.1", "00000000-0000-0000-0000-00000000c11e.2"


def single(name: str = "cd1", **spec: object) -> JSON:
    cd: JSON = compute_domain(name, **spec)
    cd["metadata"]["annotations"] = {PLACEMENT_ANNOTATION: "SingleClique"}
    return cd


def nodes(server: FakeApiServer, clique: str, *names: str) -> None:
    for name in names:
        server.seed(res.NODES, node(name))
        server.seed(res.RESOURCE_SLICES, resource_slice(name, clique_id=clique))


def workload_rct(server: FakeApiServer, name: str = "cd1") -> JSON | None:
    try:
        return server.store.get(res.RESOURCE_CLAIM_TEMPLATES, "team", f"{name}-channel")
    except NotFoundError:
        return None


def edit(server: FakeApiServer, resource: Resource, name: str, fn: Callable[[JSON], None]) -> None:
    obj = copy.deepcopy(server.store.get(resource, None, name))
    fn(obj)
    server.store.replace(resource, None, name, obj)


def ready(server: FakeApiServer, name: str = "cd1") -> JSON:
    cd = server.store.get(res.COMPUTE_DOMAINS, "team", name)
    assert cd is not None
    return dict(next(x for x in cd["status"]["conditions"] if x["type"] == "Ready"))


def test_the_annotation_is_the_opt_in_and_a_bad_value_names_the_field() -> None:
    assert not parse_compute_domain(compute_domain()).single_clique
    assert parse_compute_domain(single()).single_clique
    bad = compute_domain()
    bad["metadata"]["annotations"] = {PLACEMENT_ANNOTATION: "singleclique"}
    with pytest.raises(
        InvalidComputeDomainError,
        match=r"annotations\[resource.nvidia.com/"
        r'placement\]: Unsupported value "singleclique"',
    ):
        parse_compute_domain(bad)


def test_selector_admits_one_clique_and_never_takes_a_crafted_id() -> None:
    assert clique_selector(A) == {
        "cel": {"expression": f"device.attributes['{c.DRIVER_NAME}'].cliqueID == '{A}'"}
    }
    for crafted in ("", "x' || true || '", "a b", "a\\b", ".starts-with-dot"):
        assert not valid_clique_id(crafted)
        with pytest.raises(ValueError):
            clique_selector(crafted)
    rct = render_workload_rct(parse_compute_domain(single()), clique=A)
    (request,) = rct["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["selectors"] == [clique_selector(A)]
    assert request["exactly"]["deviceClassName"] == c.CHANNEL_DEVICE_CLASS
    assert rct["metadata"]["annotations"] == {PINNED_CLIQUE_ANNOTATION: A}
    plain = render_workload_rct(parse_compute_domain(compute_domain()))
    assert "selectors" not in plain["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert "annotations" not in plain["metadata"]


def test_most_room_wins_and_nodes_of_other_domains_do_not_count(
    server: FakeApiServer, caches: Caches
) -> None:
    nodes(server, A, "a1", "a2", "a3")
    nodes(server, B, "b1", "b2")
    cd = parse_compute_domain(
        {
            **single(numNodes=2),
            "metadata": {
                "name": "cd1",
                "namespace": "team",
                "uid": "me",
                "annotations": {PLACEMENT_ANNOTATION: "SingleClique"},
            },
        }
    )
    assert choose_clique(cd, caches) == (A, None)
    # Two of A's nodes go to another domain (label on one, the channel's taint on the other).
    edit(
        server,
        res.NODES,
        "a1",
        lambda n: n["metadata"]["labels"].update({c.COMPUTE_DOMAIN_LABEL: "other"}),
    )

    def taint(value: str) -> Callable[[JSON], None]:
        def fn(s: JSON) -> None:
            s["spec"]["devices"][0]["taints"] = [
                {"key": c.COMPUTE_DOMAIN_LABEL, "value": value, "effect": "NoSchedule"}
            ]

        return fn

    edit(server, res.RESOURCE_SLICES, "a2-cd", taint("other"))
    assert choose_clique(cd, caches) == (B, None)  # A: 1 free, B: 2
    # Our own taint is room, not a conflict (A: 2, B: 2: the tie goes to the smaller ID, so a
    # choice is repeatable); a node without a clique never counts.
    edit(server, res.RESOURCE_SLICES, "a2-cd", taint("me"))
    nodes(server, "", "plain")
    assert A < B and choose_clique(cd, caches) == (A, None)
    edit(
        server,
        res.NODES,
        "a1",
        lambda n: n["metadata"]["labels"].update({c.COMPUTE_DOMAIN_LABEL: "me"}),
    )
    assert choose_clique(cd, caches) == (A, None)
    cd3 = parse_compute_domain(
        {
            **single(numNodes=4),
            "metadata": {
                "name": "cd3",
                "namespace": "team",
                "uid": "u3",
                "annotations": {PLACEMENT_ANNOTATION: "SingleClique"},
            },
        }
    )
    clique, problem = choose_clique(cd3, caches)
    assert clique == "" and problem is not None and problem.reason == REASON_NO_CLIQUE_FITS


def test_no_clique_fits_waits_without_a_template_then_pins_once_one_has_room(
    server: FakeApiServer,
    events: RecordedEvents,
    make_reconciler: Callable[..., ComputeDomainReconciler],
) -> None:
    reconciler = make_reconciler()
    nodes(server, A, "a1", "a2")
    nodes(server, B, "b1")
    server.seed(res.COMPUTE_DOMAINS, single(numNodes=3))
    result = reconciler.reconcile("team/cd1")
    assert workload_rct(server) is None
    cond = ready(server)
    assert (cond["status"], cond["reason"]) == ("False", REASON_NO_CLIQUE_FITS)
    assert f"clique {A}: 2 free" in cond["message"] and f"clique {B}: 1 free" in cond["message"]
    assert result.requeue_after == RECHECK
    assert REASON_NO_CLIQUE_FITS in events.reasons()

    nodes(server, B, "b2", "b3")
    reconciler.reconcile("team/cd1")
    reconciler.reconcile("team/cd1")
    rct = workload_rct(server)
    assert rct is not None
    assert rct["metadata"]["annotations"][PINNED_CLIQUE_ANNOTATION] == B
    (request,) = rct["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["selectors"] == [clique_selector(B)]
    assert events.reasons().count(REASON_PINNED_TO_CLIQUE) == 1
    assert ready(server)["reason"] != REASON_NO_CLIQUE_FITS

    # Chosen once: the template is adopted as it is even after the room moved elsewhere.
    nodes(server, A, "a3", "a4", "a5")
    reconciler.reconcile("team/cd1")
    again = workload_rct(server)
    assert again is not None and again["metadata"]["uid"] == rct["metadata"]["uid"]


def test_a_domain_pinned_but_not_yet_cached_holds_its_room(
    server: FakeApiServer,
    caches: Caches,
    make_reconciler: Callable[..., ComputeDomainReconciler],
) -> None:
    rcts = LaggingCache(caches.rcts, "rcts")
    reconciler = make_reconciler(caches=Caches(**{**caches.__dict__, "rcts": rcts}))
    nodes(server, A, "a1", "a2")
    nodes(server, B, "b1", "b2")
    rcts.freeze()  # the template cache shows no create of this test
    server.seed(res.COMPUTE_DOMAINS, single("cd1", numNodes=2))
    server.seed(res.COMPUTE_DOMAINS, single("cd2", numNodes=2))
    for name in ("cd1", "cd2"):
        reconciler.reconcile(f"team/{name}")
    first, second = workload_rct(server, "cd1"), workload_rct(server, "cd2")
    assert first is not None and second is not None
    pinned = {r["metadata"]["annotations"][PINNED_CLIQUE_ANNOTATION] for r in (first, second)}
    assert pinned == {A, B}, "both domains were sent to one clique that holds only one of them"


def test_an_unknown_placement_is_an_invalid_spec(
    server: FakeApiServer,
    events: RecordedEvents,
    make_reconciler: Callable[..., ComputeDomainReconciler],
) -> None:
    bad = compute_domain()
    bad["metadata"]["annotations"] = {PLACEMENT_ANNOTATION: "Anywhere"}
    server.seed(res.COMPUTE_DOMAINS, bad)
    with pytest.raises(Exception, match="invalid spec"):
        make_reconciler().reconcile("team/cd1")
    assert ready(server)["reason"] == REASON_INVALID_SPEC
    assert workload_rct(server) is None
    assert REASON_INVALID_SPEC in events.reasons()
