"""Node labels: domain label from allocated channel claims; clique label from ResourceSlices."""

from __future__ import annotations

import pytest
from cdctl_fakes import RecordedEvents, channel_claim, compute_domain, node, resource_slice  # type: ignore[import-not-found, unused-ignore]

from pkg.api import constants as c
from pkg.kube import resources as res
from pkg.kube.client import RestClient
from pkg.reconcilers.cache import Caches
from pkg.reconcilers.cliquelabel import MANAGED_ANNOTATION, CliqueLabelReconciler
from pkg.reconcilers.events import OnceEvents, RateLimitedEvents
from pkg.reconcilers.resourceclaim import ResourceClaimReconciler
from pkg.testing.clock import FakeClock
from pkg.testing.fakeapiserver import FakeApiServer


def labels(server: FakeApiServer, name: str) -> dict[str, str]:
    obj = next(o for o in server.objects(res.NODES) if o["metadata"]["name"] == name)
    return dict(obj["metadata"].get("labels") or {})


def node_annotations(server: FakeApiServer, name: str) -> dict[str, str]:
    obj = next(o for o in server.objects(res.NODES) if o["metadata"]["name"] == name)
    return dict(obj["metadata"].get("annotations") or {})


@pytest.fixture
def claims(client: RestClient, caches: Caches, events: RecordedEvents) -> ResourceClaimReconciler:
    return ResourceClaimReconciler(client=client, caches=caches, events=OnceEvents(events))


@pytest.fixture
def cliques(client: RestClient, caches: Caches, events: RecordedEvents) -> CliqueLabelReconciler:
    return CliqueLabelReconciler(client=client, caches=caches, events=OnceEvents(events))


def domain(server: FakeApiServer, name: str = "cd1", ns: str = "team") -> str:
    return str(server.seed(res.COMPUTE_DOMAINS, compute_domain(name, ns))["metadata"]["uid"])


def test_allocation_labels_node_and_deallocation_unlabels(
    server: FakeApiServer, client: RestClient, claims: ResourceClaimReconciler
) -> None:
    uid = domain(server)
    server.seed(res.NODES, node("a"))
    server.seed(res.RESOURCE_CLAIMS, channel_claim("w0", ns="team", uid=uid, node_name="a"))
    server.seed(res.RESOURCE_CLAIMS, channel_claim("w1", ns="team", uid=uid, node_name="a"))
    assert claims.nodes_of_domain(uid) == ["a"]
    claims.reconcile("a")
    assert labels(server, "a")[c.COMPUTE_DOMAIN_LABEL] == uid
    claims.reconcile("a")  # idempotent
    w0 = client.get(res.RESOURCE_CLAIMS, "w0", namespace="team")
    w0["status"] = {}
    client.update(res.RESOURCE_CLAIMS, w0, subresource="status")
    claims.reconcile("a")
    assert labels(server, "a")[c.COMPUTE_DOMAIN_LABEL] == uid  # w1 still allocated there
    server.store.delete(res.RESOURCE_CLAIMS, "team", "w1")
    claims.reconcile("a")
    assert c.COMPUTE_DOMAIN_LABEL not in labels(server, "a")


def test_label_never_seen_allocated_is_left_alone(
    server: FakeApiServer, claims: ResourceClaimReconciler
) -> None:
    uid = domain(server)
    server.seed(res.NODES, node("a", labels={c.COMPUTE_DOMAIN_LABEL: uid}))
    claims.reconcile("a")  # e.g. the plugin labelled it; we never saw a claim here
    assert labels(server, "a")[c.COMPUTE_DOMAIN_LABEL] == uid


def test_cross_namespace_claim_warns_once_and_labels_nothing(
    server: FakeApiServer, claims: ResourceClaimReconciler, events: RecordedEvents
) -> None:
    uid = domain(server)
    server.seed(res.NODES, node("a"))
    server.seed(res.RESOURCE_CLAIMS, channel_claim("w0", ns="intruder", uid=uid, node_name="a"))
    claims.reconcile("a")
    claims.reconcile("a")
    assert c.COMPUTE_DOMAIN_LABEL not in labels(server, "a")
    assert events.reasons() == ["ComputeDomainNamespaceMismatch"] * 2  # claim and domain
    assert {e[0] for e in events.items} == {"w0", "cd1"}
    # Neither side learns anything of the other namespace.
    [(_, _, _, on_claim)] = [e for e in events.items if e[0] == "w0"]
    [(_, _, _, on_domain)] = [e for e in events.items if e[0] == "cd1"]
    assert "intruder/w0" in on_claim and "team" not in on_claim and "cd1" not in on_claim
    assert "intruder" not in on_domain and "w0" not in on_domain
    assert on_domain == (
        "a channel claim in another namespace references this ComputeDomain and is ignored; "
        "a channel claim must be in its ComputeDomain's namespace"
    )


def test_victim_warning_is_rate_limited_per_domain(
    server: FakeApiServer, client: RestClient, caches: Caches, events: RecordedEvents
) -> None:
    """Another tenant's claims pointing at a domain cannot flood it with Warnings --
    at most one per domain per interval, however many claims, nodes and namespaces; each
    claim still gets its own."""
    clock = FakeClock()
    claims = ResourceClaimReconciler(
        client=client,
        caches=caches,
        events=OnceEvents(events),
        clock=clock,
        victim_interval=600.0,
    )
    victim, other = domain(server, "cd1"), domain(server, "cd2")
    for n in ("a", "b"):
        server.seed(res.NODES, node(n))
    for i in range(20):
        server.seed(
            res.RESOURCE_CLAIMS,
            channel_claim(f"w{i}", ns=f"intruder-{i % 3}", uid=victim, node_name="ab"[i % 2]),
        )
    server.seed(res.RESOURCE_CLAIMS, channel_claim("x", ns="intruder-0", uid=other, node_name="a"))

    def on_domains() -> list[str]:
        return [e[0] for e in events.items if e[0] in ("cd1", "cd2")]

    for _ in range(3):
        claims.reconcile("a")
        claims.reconcile("b")
    assert sorted(on_domains()) == ["cd1", "cd2"]  # one each
    assert len(events.items) - 2 == 21  # one per claim
    clock.step(599)
    claims.reconcile("a")
    claims.reconcile("b")
    assert len(on_domains()) == 2
    clock.step(1)
    claims.reconcile("a")
    claims.reconcile("b")
    assert sorted(on_domains()) == ["cd1", "cd1", "cd2", "cd2"]  # the attack goes on: once more
    assert len(events.items) - 4 == 21  # the claims' own stay once per claim


def test_rate_limited_events_per_object_and_reason() -> None:
    sink = RecordedEvents()
    clock = FakeClock()
    limited = RateLimitedEvents(sink, clock, interval=10.0, size=2)
    a = {"metadata": {"name": "a", "uid": "1"}}
    b = {"metadata": {"name": "b", "uid": "2"}}
    limited.event(a, "Warning", "R", "one")
    limited.event(a, "Warning", "R", "two")  # other message, same (object, reason): dropped
    limited.event(a, "Warning", "S", "three")  # other reason: its own budget
    limited.event(b, "Warning", "R", "four")
    clock.step(9.9)
    limited.event(b, "Warning", "R", "five")
    clock.step(0.1)
    limited.event(b, "Warning", "R", "six")
    assert [m for *_, m in sink.items] == ["one", "three", "four", "six"]


def test_node_of_another_live_domain_is_not_taken(
    server: FakeApiServer, claims: ResourceClaimReconciler, events: RecordedEvents
) -> None:
    first, second = domain(server, "cd1"), domain(server, "cd2")
    server.seed(res.NODES, node("a", labels={c.COMPUTE_DOMAIN_LABEL: first}))
    server.seed(res.RESOURCE_CLAIMS, channel_claim("w0", ns="team", uid=second, node_name="a"))
    claims.reconcile("a")
    assert labels(server, "a")[c.COMPUTE_DOMAIN_LABEL] == first
    assert "NodeInUse" in events.reasons()
    # A label of a domain that no longer exists is stale and is replaced.
    server.seed(res.NODES, node("a", labels={c.COMPUTE_DOMAIN_LABEL: "deleted-uid"}))
    claims.reconcile("a")
    assert labels(server, "a")[c.COMPUTE_DOMAIN_LABEL] == second


def test_claim_for_unknown_domain_warns(
    server: FakeApiServer, claims: ResourceClaimReconciler, events: RecordedEvents
) -> None:
    server.seed(res.NODES, node("a"))
    server.seed(res.RESOURCE_CLAIMS, channel_claim("w0", ns="team", uid="nope", node_name="a"))
    claims.reconcile("a")
    assert events.reasons() == ["ComputeDomainNotFound"]
    assert c.COMPUTE_DOMAIN_LABEL not in labels(server, "a")


@pytest.mark.parametrize("qualified", [False, True], ids=["plain-key", "qualified-key"])
def test_clique_label_follows_the_slice(
    server: FakeApiServer, cliques: CliqueLabelReconciler, qualified: bool
) -> None:
    server.seed(res.NODES, node("a"))
    server.seed(res.RESOURCE_SLICES, resource_slice("a", clique_id="uuid.7", qualified=qualified))
    cliques.reconcile("a")
    assert labels(server, "a")[c.GPU_CLIQUE_NODE_LABEL] == "uuid.7"
    assert node_annotations(server, "a")[MANAGED_ANNOTATION] == "true"
    server.seed(res.RESOURCE_SLICES, resource_slice("a", clique_id="uuid.8"))
    cliques.reconcile("a")
    assert labels(server, "a")[c.GPU_CLIQUE_NODE_LABEL] == "uuid.8"  # our own stale value
    server.store.delete(res.RESOURCE_SLICES, None, "a-cd")
    cliques.reconcile("a")
    assert c.GPU_CLIQUE_NODE_LABEL not in labels(server, "a")
    assert MANAGED_ANNOTATION not in node_annotations(server, "a")


def test_foreign_clique_label_is_never_overwritten_or_removed(
    server: FakeApiServer, cliques: CliqueLabelReconciler, events: RecordedEvents
) -> None:
    server.seed(res.NODES, node("a", labels={c.GPU_CLIQUE_NODE_LABEL: "gfd.1"}))
    server.seed(res.NODES, node("b", labels={c.GPU_CLIQUE_NODE_LABEL: "uuid.7"}))
    server.seed(res.RESOURCE_SLICES, resource_slice("a", clique_id="uuid.7"))
    server.seed(res.RESOURCE_SLICES, resource_slice("b", clique_id="uuid.7"))
    for name in ("a", "b", "a"):
        cliques.reconcile(name)
    assert labels(server, "a")[c.GPU_CLIQUE_NODE_LABEL] == "gfd.1"
    assert events.reasons() == ["CliqueLabelConflict"]
    assert MANAGED_ANNOTATION not in node_annotations(server, "b")  # equal value, still not ours
    server.store.delete(res.RESOURCE_SLICES, None, "b-cd")
    cliques.reconcile("b")
    assert labels(server, "b")[c.GPU_CLIQUE_NODE_LABEL] == "uuid.7"


def test_non_fabric_node_and_invalid_values_get_no_label(
    server: FakeApiServer, cliques: CliqueLabelReconciler, events: RecordedEvents
) -> None:
    server.seed(res.NODES, node("a"))
    server.seed(res.NODES, node("b"))
    server.seed(res.RESOURCE_SLICES, resource_slice("a", clique_id=None))
    server.seed(res.RESOURCE_SLICES, resource_slice("b", clique_id="bad value!"))
    server.clear_log()
    cliques.reconcile("a")
    cliques.reconcile("b")
    cliques.reconcile("missing-node")
    assert [m for m, _ in server.request_log if m != "GET"] == []
    assert events.reasons() == ["InvalidCliqueID"]


def test_label_removed_by_plugin_unprepare_is_not_put_back(
    server: FakeApiServer, client: RestClient, claims: ResourceClaimReconciler
) -> None:
    uid = domain(server)
    server.seed(res.NODES, node("a"))
    server.seed(res.RESOURCE_CLAIMS, channel_claim("w0", ns="team", uid=uid, node_name="a"))
    claims.reconcile("a")
    assert labels(server, "a")[c.COMPUTE_DOMAIN_LABEL] == uid
    # The kubelet unprepared the claim (pod terminating): the plugin removed the label while
    # the claim is still allocated.
    obj = client.get(res.NODES, "a")
    del obj["metadata"]["labels"][c.COMPUTE_DOMAIN_LABEL]
    client.update(res.NODES, obj)
    claims.reconcile("a")
    assert c.COMPUTE_DOMAIN_LABEL not in labels(server, "a")
    # A new claim of the same domain on that node labels it again.
    server.seed(res.RESOURCE_CLAIMS, channel_claim("w1", ns="team", uid=uid, node_name="a"))
    claims.reconcile("a")
    assert labels(server, "a")[c.COMPUTE_DOMAIN_LABEL] == uid


def test_own_label_of_finished_domain_is_handed_to_the_next(
    server: FakeApiServer, claims: ResourceClaimReconciler
) -> None:
    first, second = domain(server, "cd1"), domain(server, "cd2")
    server.seed(res.NODES, node("a"))
    server.seed(res.RESOURCE_CLAIMS, channel_claim("w0", ns="team", uid=first, node_name="a"))
    claims.reconcile("a")
    assert labels(server, "a")[c.COMPUTE_DOMAIN_LABEL] == first
    # w0 went away and, before this reconcile ran, the scheduler gave channel-0 to cd2.
    server.store.delete(res.RESOURCE_CLAIMS, "team", "w0")
    server.seed(res.RESOURCE_CLAIMS, channel_claim("w1", ns="team", uid=second, node_name="a"))
    claims.reconcile("a")
    assert labels(server, "a")[c.COMPUTE_DOMAIN_LABEL] == second


def test_new_term_does_not_relabel_a_node_the_plugin_released(
    server: FakeApiServer, client: RestClient, caches: Caches, events: RecordedEvents
) -> None:
    """A new leadership term starts with no memory. A claim allocated before it may belong to a
    pod the plugin already unprepared (label removed, pod terminating): the term adopts every
    allocated claim and leaves labelling them to the plugin's Prepare; later allocations are
    labelled as usual."""
    uid = domain(server)
    server.seed(res.NODES, node("a"))
    server.seed(res.NODES, node("b"))
    server.seed(res.RESOURCE_CLAIMS, channel_claim("w0", ns="team", uid=uid, node_name="a"))
    term = ResourceClaimReconciler(client=client, caches=caches, events=OnceEvents(events))
    assert term.adopt_allocations() == 1
    term.reconcile("a")
    term.reconcile("a")
    assert c.COMPUTE_DOMAIN_LABEL not in labels(server, "a")
    server.seed(res.RESOURCE_CLAIMS, channel_claim("w1", ns="team", uid=uid, node_name="b"))
    term.reconcile("b")
    assert labels(server, "b")[c.COMPUTE_DOMAIN_LABEL] == uid
    # The adopted claim's node, once the plugin labelled it at Prepare, is this term's to unlabel.
    obj = client.get(res.NODES, "a")
    obj["metadata"].setdefault("labels", {})[c.COMPUTE_DOMAIN_LABEL] = uid
    client.update(res.NODES, obj)
    term.reconcile("a")
    server.store.delete(res.RESOURCE_CLAIMS, "team", "w0")
    term.reconcile("a")
    assert c.COMPUTE_DOMAIN_LABEL not in labels(server, "a")


def test_an_adopted_claim_allocated_again_labels_its_node(
    server: FakeApiServer, client: RestClient, caches: Caches, events: RecordedEvents
) -> None:
    """Adoption covers the allocation the term found, not the claim forever: once deallocated,
    its next allocation is a new one, labelled like any other."""
    uid = domain(server)
    server.seed(res.NODES, node("a"))
    server.seed(res.RESOURCE_CLAIMS, channel_claim("w0", ns="team", uid=uid, node_name="a"))
    term = ResourceClaimReconciler(client=client, caches=caches, events=OnceEvents(events))
    assert term.adopt_allocations() == 1
    term.reconcile("a")
    assert c.COMPUTE_DOMAIN_LABEL not in labels(server, "a")
    w0 = client.get(res.RESOURCE_CLAIMS, "w0", namespace="team")
    allocated = w0["status"]
    w0["status"] = {}
    w0 = client.update(res.RESOURCE_CLAIMS, w0, subresource="status")
    term.reconcile("a")
    w0["status"] = allocated
    client.update(res.RESOURCE_CLAIMS, w0, subresource="status")
    term.reconcile("a")
    assert labels(server, "a")[c.COMPUTE_DOMAIN_LABEL] == uid


def test_a_node_whose_plugin_keeps_the_clique_label_is_left_alone(
    server: FakeApiServer, cliques: CliqueLabelReconciler, events: RecordedEvents
) -> None:
    """A plugin with --gpu-clique-label-enabled marks the node; a slice that still shows the
    old clique changes nothing and raises no Event. Once the plugin removed label and mark on
    shutdown, the controller labels the node from its slices again."""
    plugin_labelled = node("a", labels={c.GPU_CLIQUE_NODE_LABEL: "uuid.8"})
    plugin_labelled["metadata"]["annotations"] = {
        MANAGED_ANNOTATION: c.GPU_CLIQUE_MANAGED_BY_PLUGIN
    }
    server.seed(res.NODES, plugin_labelled)
    server.seed(res.RESOURCE_SLICES, resource_slice("a", clique_id="uuid.7"))
    server.clear_log()
    cliques.reconcile("a")
    assert [m for m, _ in server.request_log if m != "GET"] == []
    assert events.reasons() == []
    assert labels(server, "a")[c.GPU_CLIQUE_NODE_LABEL] == "uuid.8"
    server.seed(res.NODES, node("a"))  # the plugin's shutdown removed both
    cliques.reconcile("a")
    assert labels(server, "a")[c.GPU_CLIQUE_NODE_LABEL] == "uuid.7"
    assert node_annotations(server, "a")[MANAGED_ANNOTATION] == "true"


def test_node_in_use_names_no_other_domain(
    server: FakeApiServer, claims: ResourceClaimReconciler, events: RecordedEvents
) -> None:
    """The holder may be another tenant's domain: its UID is a handle to it, so the Event on
    the waiting domain and its claims names only the waiting domain."""
    first, second = domain(server, "theirs", "other"), domain(server, "cd2", "team")
    server.seed(res.NODES, node("a", labels={c.COMPUTE_DOMAIN_LABEL: first}))
    server.seed(res.RESOURCE_CLAIMS, channel_claim("w0", ns="team", uid=second, node_name="a"))
    claims.reconcile("a")
    messages = [m for _, _, reason, m in events.items if reason == "NodeInUse"]
    assert messages and all(first not in m and "other/" not in m for m in messages)
    assert messages[0] == (
        "node a already belongs to another ComputeDomain; one ComputeDomain per node, "
        "so team/cd2 cannot use it yet"
    )


def test_node_conflict_names_only_the_recipients_namespace(
    server: FakeApiServer, claims: ResourceClaimReconciler, events: RecordedEvents
) -> None:
    """Claims of three domains on one node, two of them in one namespace: each domain's Event
    names the domains of its own namespace and only counts the others."""
    mine, also_mine, theirs = (
        domain(server, "cd1", "team"),
        domain(server, "cd2", "team"),
        domain(server, "x", "rival"),
    )
    server.seed(res.NODES, node("a"))
    for name, ns, uid in (("w0", "team", mine), ("w1", "team", also_mine), ("w2", "rival", theirs)):
        server.seed(res.RESOURCE_CLAIMS, channel_claim(name, ns=ns, uid=uid, node_name="a"))
    claims.reconcile("a")
    got = {obj: m for obj, _, reason, m in events.items if reason == "NodeConflict"}
    prefix = "node a has channel claims of several ComputeDomains: "
    assert got == {
        "cd1": prefix + "team/cd1, team/cd2, 1 in another namespace",
        "cd2": prefix + "team/cd1, team/cd2, 1 in another namespace",
        "x": prefix + "rival/x, 2 in other namespaces",
    }
    assert c.COMPUTE_DOMAIN_LABEL not in labels(server, "a")
