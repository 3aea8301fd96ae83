"""Bad input, counted: generated ComputeDomains against the real apiserver and our controller.

hypothesis writes ComputeDomain documents (valid ones with mutated ``numNodes``,
``allocationMode``, ResourceClaimTemplate names, unknown fields, wrong types, huge or invalid
object names) and submits each to the real kube-apiserver with the driver's CRDs. Every case
must end where the user looks:

* rejected with 422 whose causes name the field (the CRD schema), or
* accepted, and then the controller either reconciles it (ResourceClaimTemplate created,
  ``Ready`` condition written) or writes ``Ready=False`` whose reason and message name the
  field (``InvalidSpec``, ``ResourceClaimTemplateConflict``, ``NumNodesUnreachable``), with a
  Warning Event of that reason on the domain.

The controller must never exit nor log a traceback. Needs no nodes (no ``fleet``); the seed is
fixed (`badinput.SEED`) and the outcomes are counted for docs/reliability.md
(``make badinput``).
"""

from __future__ import annotations

import contextlib
import itertools
import re
import secrets
import time
from typing import Any

import pytest
from badinput import SEED, Tally, examples
from hypothesis import HealthCheck, example, given, seed, settings
from hypothesis import strategies as st
from testsupport.e2e_support import Driver, events_for, wait_for

from pkg.api import constants as c
from pkg.kube.client import KubeClient
from pkg.kube.errors import ApiError, InvalidError, NotFoundError
from pkg.kube.resources import (
    COMPUTE_DOMAINS,
    DAEMONSETS,
    NAMESPACES,
    RESOURCE_CLAIM_TEMPLATES,
)

pytestmark = pytest.mark.e2e

MISSING = object()  # a field left out of the document
FIELD_REASONS = {
    "InvalidSpec": "spec.",
    "ResourceClaimTemplateConflict": "spec.channel.resourceClaimTemplate.name",
    "NumNodesUnreachable": "numNodes",
}


def mostly(good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``good`` three times in four, else ``bad``: most documents get far enough to test the
    next field (and the controller), every field still gets its bad values."""
    # Not i == 0: hypothesis favours the ends of a range.
    return st.integers(0, 7).flatmap(lambda i: bad if i in (2, 5) else good)


BAD_NUM_NODES = [-1, 5001, 2**31, 2**62, 2**63, 2**64, -(2**63), 1.5, 1e30, "3", "", True, None]
num_nodes = mostly(
    st.sampled_from([MISSING, 0, 1, 4, 5000, 2.0]) | st.integers(0, 5000),
    st.sampled_from([*BAD_NUM_NODES, [], {}]) | st.integers(-10, 6000),
)
allocation_modes = mostly(
    st.sampled_from([MISSING, "Single", "All"]),
    st.sampled_from(["all", "single", "", "Many", " All", 1, None, [], {"x": 1}]),
)
BAD_RCT_NAMES = ["Bad_Name", "UPPER", "-lead", "a..b", "", "x" * 254, 7, None, ["a"], {"n": 1}]
rct_names = mostly(
    # "unique" and "unique 253" become names no other case uses (see `_unique`).
    st.sampled_from(["unique", "unique", "unique 253", "shared-rct"]),
    st.sampled_from([MISSING, *BAD_RCT_NAMES]),
)
unknown_fields = mostly(
    st.none(), st.sampled_from(["spec", "spec.channel", "top", "resourceClaimTemplate"])
)
name_kinds = mostly(
    st.sampled_from(["short", "253 chars"]),
    st.sampled_from(["254 chars", "300 chars", "uppercase", "underscore", "empty", "dot start"]),
)
shapes = mostly(
    st.just("full"),
    st.sampled_from(
        ["no channel", "channel is a string", "spec is a list", "no spec", "rct is a string"]
    ),
)


@st.composite
def compute_domains(draw: st.DrawFn) -> dict[str, Any]:
    """A ComputeDomain document without metadata.name (the name kind is in ``_name_kind``)."""
    channel: dict[str, Any] = {}
    rct = draw(rct_names)
    if rct is not MISSING:
        channel["resourceClaimTemplate"] = {"name": rct}
    mode = draw(allocation_modes)
    if mode is not MISSING:
        channel["allocationMode"] = mode
    spec: Any = {"channel": channel}
    nodes = draw(num_nodes)
    if nodes is not MISSING:
        spec["numNodes"] = nodes
    shape = draw(shapes)
    if shape == "no channel":
        del spec["channel"]
    elif shape == "channel is a string":
        spec["channel"] = "Single"
    elif shape == "rct is a string":
        channel["resourceClaimTemplate"] = "rct"
    doc: dict[str, Any] = {
        "apiVersion": c.API_VERSION,
        "kind": c.COMPUTE_DOMAIN_KIND,
        "metadata": {"_name_kind": draw(name_kinds)},
    }
    unknown = draw(unknown_fields)
    if unknown == "spec":
        spec["numnodes"] = 3
    elif unknown == "spec.channel" and isinstance(spec.get("channel"), dict):
        spec["channel"]["mode"] = "All"
    elif unknown == "resourceClaimTemplate" and isinstance(
        channel.get("resourceClaimTemplate"), dict
    ):
        channel["resourceClaimTemplate"]["namespace"] = "elsewhere"
    elif unknown == "top":
        doc["specs"] = {"numNodes": 1}
    if shape == "spec is a list":
        spec = [spec]
    if shape != "no spec":
        doc["spec"] = spec
    return doc


def _name(kind: str, n: int) -> str:
    suffix = f"cd-{n}"
    return {
        "short": suffix,
        "253 chars": "a" * (253 - len(suffix)) + suffix,
        "254 chars": "a" * (254 - len(suffix)) + suffix,
        "300 chars": "a" * (300 - len(suffix)) + suffix,
        "uppercase": f"CD-{n}",
        "underscore": f"cd_{n}",
        "empty": "",
        "dot start": f".cd-{n}",
    }[kind]


def _doc(name_kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    """An explicit case: Events must reach domains with the longest names too."""
    return {
        "apiVersion": c.API_VERSION,
        "kind": c.COMPUTE_DOMAIN_KIND,
        "metadata": {"_name_kind": name_kind},
        "spec": spec,
    }


def _unique(doc: dict[str, Any], n: int) -> None:
    """Replace the "unique" ResourceClaimTemplate name tokens by names of case ``n``."""
    spec = doc.get("spec")
    channel = spec.get("channel") if isinstance(spec, dict) else None
    rct = channel.get("resourceClaimTemplate") if isinstance(channel, dict) else None
    if isinstance(rct, dict) and rct.get("name") in ("unique", "unique 253"):
        suffix = f"rct-{n}"
        rct["name"] = suffix if rct["name"] == "unique" else "r" * (253 - len(suffix)) + suffix


def _condition(client: KubeClient, ns: str, name: str) -> dict[str, Any] | None:
    obj = client.get(COMPUTE_DOMAINS, name, namespace=ns)
    gen = obj["metadata"].get("generation")
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready" and cond.get("observedGeneration") == gen:
            return dict(cond)
    return None


def _causes(err: ApiError) -> list[str]:
    """Fields a 422 names, in the apiserver's order; without the "<nil>" notice that CEL rules
    were skipped because of the other errors."""
    details = (err.body or {}).get("details") or {}
    fields = [str(cause.get("field") or "") for cause in details.get("causes") or []]
    return [f for f in dict.fromkeys(fields) if f and f != "<nil>"]


def _tracebacks(driver: Driver) -> int:
    if driver.controller_log is None or not driver.controller_log.exists():
        return 0
    return driver.controller_log.read_text(errors="replace").count("Traceback")


def test_generated_compute_domains_end_in_422_or_a_condition(
    admin: KubeClient, driver: Driver
) -> None:
    ns = f"bad-input-{secrets.token_hex(2)}"
    admin.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    tally = Tally(
        "ComputeDomain specs",
        what="ComputeDomains on the real kube-apiserver + controller: numNodes (negative, "
        "0..6000, 2^31..2^64, floats, strings, bools, null), allocationMode (enum, case, "
        "types), ResourceClaimTemplate names (valid, shared, invalid, 254 chars, types), "
        "unknown fields, wrong shapes, object names (253/254/300 chars, invalid)",
        where="422 naming the field; or Ready=False reason + message naming the field and a "
        "Warning Event; or reconciled",
    )
    tracebacks_before = _tracebacks(driver)
    counter = itertools.count()
    started = time.monotonic()

    @seed(SEED)
    @settings(
        max_examples=examples(100),
        database=None,
        deadline=None,
        print_blob=True,
        suppress_health_check=list(HealthCheck),
    )
    @example(doc=_doc("253 chars", {"channel": {"resourceClaimTemplate": {"name": "Bad_Name"}}}))
    @example(
        doc=_doc(
            "253 chars",
            {"numNodes": 4, "channel": {"resourceClaimTemplate": {"name": "unique 253"}}},
        )
    )
    @given(doc=compute_domains())
    def case(doc: dict[str, Any]) -> None:
        tally.case()
        n = next(counter)
        name = _name(doc["metadata"].pop("_name_kind"), n)
        doc["metadata"] = {"name": name, "namespace": ns}
        _unique(doc, n)
        try:
            created = admin.create(COMPUTE_DOMAINS, doc, namespace=ns)
        except InvalidError as err:
            fields = _causes(err)
            assert fields, f"422 without a field: {err}"
            for field in fields:
                assert f"{field}: " in err.message, (field, err.message)
            tally.count(f"422 naming {fields[0]}")
            return
        assert driver.controller_alive(), "controller exited"
        cd_name = created["metadata"]["name"]
        cond = wait_for(
            f"Ready condition of {cd_name}",
            lambda: _condition(admin, ns, cd_name),
            timeout=20,
            every=0.1,
        )
        reason = str(cond["reason"])
        if reason in FIELD_REASONS:
            assert FIELD_REASONS[reason] in cond["message"], cond
            wait_for(
                f"{reason} Event on {cd_name}",
                lambda: any(
                    e.get("reason") == reason and e.get("type") == "Warning"
                    for e in events_for(admin, ns, cd_name)
                ),
                timeout=20,
                every=0.2,
            )
            found = re.search(r"spec(\.\w+)+", cond["message"]) if reason == "InvalidSpec" else None
            tally.count(f"accepted, Ready=False {reason}" + (f" ({found[0]})" if found else ""))
        else:
            rct = created["spec"]["channel"]["resourceClaimTemplate"]["name"]
            obj = admin.get(RESOURCE_CLAIM_TEMPLATES, rct, namespace=ns)
            assert obj["metadata"]["labels"][c.COMPUTE_DOMAIN_LABEL] == created["metadata"]["uid"]
            tally.count(f"accepted, reconciled (Ready={cond['status']} {reason})")

    try:
        case()
        assert driver.controller_alive(), "controller exited"
        assert _tracebacks(driver) == tracebacks_before, "the controller logged a traceback"
        took = time.monotonic() - started
        print(
            f"bad-input ComputeDomains: {tally.cases} cases in {took:.1f}s: {dict(tally.outcomes)}"
        )
    finally:
        _delete_all(admin, driver, ns)
    tally.save()


def _delete_all(admin: KubeClient, driver: Driver, ns: str) -> None:
    """Delete every domain of ``ns``; the controller must finalize each, leaving nothing."""
    uids = set()
    for cd in admin.list(COMPUTE_DOMAINS, namespace=ns).get("items", []):
        uids.add(cd["metadata"]["uid"])
        with contextlib.suppress(NotFoundError):
            admin.delete(COMPUTE_DOMAINS, cd["metadata"]["name"], namespace=ns)

    def clean() -> bool:
        left = admin.list(COMPUTE_DOMAINS, namespace=ns).get("items", [])
        rcts = admin.list(RESOURCE_CLAIM_TEMPLATES, namespace=ns).get("items", [])
        ds = admin.list(
            DAEMONSETS, namespace=driver.namespace, label_selector=c.COMPUTE_DOMAIN_LABEL
        ).get("items", [])
        ours = [d for d in ds if d["metadata"]["labels"].get(c.COMPUTE_DOMAIN_LABEL) in uids]
        return not (left or rcts or ours)

    wait_for(f"all ComputeDomains of {ns} finalized, nothing left", clean, timeout=60, every=0.5)
    admin.delete(NAMESPACES, ns)
