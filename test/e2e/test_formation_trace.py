"""One trace per domain formation, across every process of the driver, on the real control plane.

This module runs its own control plane and driver with tracing on: the controller, both kubelet
plugins and (through ``--cd-daemon-extra-env``) the IMEX daemons export with the ``file``
exporter (``OTEL_TRACES_EXPORTER=file``) into one JSON-lines file; nothing else differs from the
shipped configuration. A ComputeDomain with ``numNodes: 2`` and two workload pods forms; then the
file must hold exactly one trace for it:

* its root ``ComputeDomain formation`` (service ``compute-domain-controller``) from the domain's
  ``creationTimestamp`` to the moment it turned Ready, with the ids the domain's
  ``resource.nvidia.com/traceparent`` annotation announced;
* under the root, from the controller: ``ensure dependents`` and ``write status`` spans, the last
  of them writing ``Ready``;
* under the root, from each of the two plugins (service ``compute-domain-kubelet-plugin``, one
  per node): ``prepare daemon claim`` and ``prepare channel claim``, the latter with ``label
  node`` and ``wait for IMEX daemon`` inside it, one channel attempt having seen the daemon Ready;
* under the root, from each of the two daemons (service ``compute-domain-daemon``, one per
  node): ``IMEX daemon`` with ``join``, ``start IMEX`` and ``IMEX ready`` inside it, all within
  the root's time span.

The domain's namespace is also the label of its time-to-ready sample on the controller's
``/metrics``.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubeletsim import NodeFleet, config_from_cluster, layout
from kubeletsim.formation import read_spans
from localcluster import Cluster, bin_dir
from testsupport.e2e_support import Driver, free_port, leak_report, teardown_namespace, wait_for
from testsupport.workloads import create_cd, start_pods, wait_bound, wait_cd_ready, wait_running

from pkg.api import constants as c
from pkg.kube.client import KubeClient, RestClient
from pkg.kube.config import load_api_client
from pkg.kube.resources import COMPUTE_DOMAINS, NAMESPACES
from pkg.reconcilers.metrics import parse_timestamp
from pkg.runtime.tracing import FILE_PATH_VAR, parse_traceparent

pytestmark = pytest.mark.e2e

REQUIRED = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "cdi-resolve")
SPECS = layout([0, 0], prefix="tr-node", first_index=201)
NAMES = [s.name for s in SPECS]
CONTROLLER, PLUGIN, DAEMON = (
    "compute-domain-controller",
    "compute-domain-kubelet-plugin",
    "compute-domain-daemon",
)
Span = dict[str, Any]


@pytest.fixture(scope="module")
def spans_file() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="cdtr-", dir="/tmp")) / "spans.jsonl"
    yield path
    if os.environ.get("E2E_KEEP") != "1":
        shutil.rmtree(path.parent, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    if os.environ.get("SKIP_E2E") == "1":
        pytest.skip("SKIP_E2E=1")
    bins = bin_dir()
    missing = [b for b in REQUIRED if not (bins / b).is_file()]
    if missing:
        pytest.fail(
            f"e2e: control-plane binaries missing in {bins}: {', '.join(missing)}; "
            "run hack/build-control-plane.sh",
            pytrace=False,
        )
    workdir = Path(tempfile.mkdtemp(prefix="cdtr-", dir="/tmp"))
    c_ = Cluster.start(bins, workdir, node_names=NAMES)
    yield c_
    c_.stop()
    if os.environ.get("E2E_KEEP") != "1":
        shutil.rmtree(workdir, ignore_errors=True)


def tracing_env(spans_file: Path) -> dict[str, str]:
    return {"OTEL_TRACES_EXPORTER": "file", FILE_PATH_VAR: str(spans_file)}


@pytest.fixture(scope="module")
def admin(cluster: Cluster) -> KubeClient:
    return RestClient(load_api_client(str(cluster.kubeconfig("admin"))), user_agent="e2e")


@pytest.fixture(scope="module")
def driver(cluster: Cluster, spans_file: Path) -> Iterator[Driver]:
    d = Driver.deploy(cluster.kubeconfig("admin"))
    env = tracing_env(spans_file)
    # The operator's way to configure the daemons: the controller renders this into their pods.
    daemon_env = ",".join(f"{k}={v}" for k, v in env.items())
    d.start_controller(
        kubeconfig=cluster.kubeconfig("compute-domain-controller"),
        log_file=cluster.log_path("controller"),
        http_port=free_port(),
        extra_env={**env, "CD_DAEMON_EXTRA_ENV": daemon_env},
    )
    yield d
    d.kill_controller()


@pytest.fixture(scope="module")
def fleet(cluster: Cluster, driver: Driver, spans_file: Path) -> Iterator[NodeFleet]:
    f = NodeFleet(
        config_from_cluster(cluster, cluster.workdir / "n", plugin_env=tracing_env(spans_file))
    )
    f.add(SPECS)
    yield f
    f.stop()


@pytest.fixture
def ns(admin: KubeClient, fleet: NodeFleet, driver: Driver) -> Iterator[str]:
    name = f"trace-{secrets.token_hex(2)}"
    admin.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    yield name
    teardown_namespace(admin, name)
    try:
        wait_for(
            "no leaks",
            lambda: not leak_report(admin, fleet, driver.namespace, [name]),
            timeout=60,
            every=0.5,
        )
    except AssertionError:
        pytest.fail(f"leaked after test: {leak_report(admin, fleet, driver.namespace, [name])}")
    admin.delete(NAMESPACES, name)


# -- reading the exported spans -----------------------------------------------------------------


def hex_id(value: str | None) -> int | None:
    return int(value, 16) if value else None


def service(span: Span) -> str:
    return str(span["resource"]["attributes"].get("service.name", ""))


def ns_time(value: str) -> float:
    """The exporter's ISO-8601 timestamps (``...Z``, microseconds) as epoch seconds."""
    stamp = parse_timestamp(value)
    assert stamp is not None, value
    return stamp


def node_of(span: Span) -> str:
    return str(span["attributes"].get("k8s.node.name", ""))


def metric(endpoint: str, name: str, labels: dict[str, str]) -> float | None:
    with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        m = re.fullmatch(rf"{re.escape(name)}\{{([^}}]*)\}} (\S+)", line)
        if m and ",".join(sorted(m.group(1).split(","))) == want:
            return float(m.group(2))
    return None


# -- the test -----------------------------------------------------------------------------------


def test_domain_formation_is_one_trace_across_all_processes(
    admin: KubeClient, fleet: NodeFleet, driver: Driver, ns: str, spans_file: Path
) -> None:
    w = create_cd(admin, ns, "traced", num_nodes=2)
    start_pods(admin, w, 2, NAMES)
    placement = wait_bound(admin, w)
    assert sorted(placement.values()) == sorted(NAMES)
    wait_running(admin, fleet, w)
    wait_cd_ready(admin, w, 2)
    cd = admin.get(COMPUTE_DOMAINS, w.cd_name, namespace=ns)
    ids = parse_traceparent(cd["metadata"]["annotations"][c.TRACEPARENT_ANNOTATION])
    assert ids is not None
    trace_hex, root_hex = f"0x{ids.trace_id:032x}", f"0x{ids.span_id:016x}"

    def formation() -> list[Span] | None:
        spans = [s for s in read_spans(spans_file) if s["context"]["trace_id"] == trace_hex]
        names = {(service(s), s["name"]) for s in spans}
        wanted = {
            (CONTROLLER, "ComputeDomain formation"),
            (DAEMON, "IMEX daemon"),
            (PLUGIN, "wait for IMEX daemon"),
        }
        daemons = {node_of(s) for s in spans if s["name"] == "IMEX daemon"}
        return spans if wanted <= names and daemons == set(NAMES) else None

    spans = wait_for("the formation trace in the span file", formation, timeout=30, every=0.5)
    by_id = {s["context"]["span_id"]: s for s in spans}
    assert len(by_id) == len(spans), "span ids are unique"

    # The root: announced ids, creation -> Ready, emitted by the controller.
    (root,) = [s for s in spans if s["name"] == "ComputeDomain formation"]
    assert root["context"]["span_id"] == root_hex and root["parent_id"] is None
    assert service(root) == CONTROLLER
    assert root["attributes"]["computedomain.uid"] == w.cd_uid
    assert root["attributes"]["k8s.namespace.name"] == ns
    created = ns_time(cd["metadata"]["creationTimestamp"])
    root_start, root_end = ns_time(root["start_time"]), ns_time(root["end_time"])
    assert root_start == created and root_end > root_start

    def children(parent: Span, name: str, svc: str) -> list[Span]:
        found = [
            s for s in spans if s["name"] == name and s["parent_id"] == parent["context"]["span_id"]
        ]
        assert found, f"no {name!r} under {parent['name']!r}"
        assert {service(s) for s in found} == {svc}, found
        return found

    # The controller: dependents and the status writes up to Ready.
    children(root, "ensure dependents", CONTROLLER)
    statuses = children(root, "write status", CONTROLLER)
    assert [s["attributes"]["computedomain.status"] for s in statuses].count(c.STATUS_READY) == 1

    # Each plugin: its daemon claim and its channel claim (label, wait) under the root.
    for kind in ("prepare daemon claim", "prepare channel claim"):
        assert {node_of(s) for s in children(root, kind, PLUGIN)} == set(NAMES), kind
    waits_ready = set()
    for prepare in children(root, "prepare channel claim", PLUGIN):
        children(prepare, "label node", PLUGIN)
        for wait in children(prepare, "wait for IMEX daemon", PLUGIN):
            if wait["attributes"]["imex.daemon.ready"]:
                waits_ready.add(node_of(wait))
    assert waits_ready == set(NAMES)

    # Each daemon: join, IMEX start, Ready; all while the domain was forming.
    daemons = children(root, "IMEX daemon", DAEMON)
    assert sorted(node_of(d) for d in daemons) == sorted(NAMES)
    for daemon in daemons:
        assert daemon["status"]["status_code"] != "ERROR", daemon
        steps = {
            name: children(daemon, name, DAEMON) for name in ("join", "start IMEX", "IMEX ready")
        }
        assert all(len(v) == 1 for v in steps.values()), steps
        assert root_start <= ns_time(daemon["start_time"])
        join, start, ready = (steps[n][0] for n in ("join", "start IMEX", "IMEX ready"))
        # Causally before the domain's Ready: the join's answer and the start of reporting
        # Ready. (The daemon's own span ends when its Ready write is answered, which may come
        # after the controller saw that write in its watch and ended the root.)
        assert ns_time(join["end_time"]) <= root_end
        assert ns_time(ready["start_time"]) <= root_end
        assert ns_time(join["end_time"]) <= ns_time(start["start_time"])
        assert ns_time(start["end_time"]) <= ns_time(ready["end_time"])

    # Nothing of this domain's formation is outside its trace, nothing inside is orphaned.
    for span in spans:
        if span is not root:
            assert span["parent_id"] in by_id, span

    # The same formation as a histogram sample labelled with the namespace.
    ttr = "nvidia_dra_compute_domain_time_to_ready_seconds_count"
    assert metric(driver.controller_http, ttr, {"namespace": ns}) == 1
