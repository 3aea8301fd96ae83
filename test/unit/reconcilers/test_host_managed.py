"""The controller in host-managed IMEX mode: flags, the reconciler and the wired manager.

Upstream v0.5 (#1236): no daemon machinery at all; finalizer, a workload template whose
allocationMode is always Single, ``status.status: Ready`` at once and never ``status.nodes``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from cdctl_fakes import (  # type: ignore[import-not-found, unused-ignore]
    DRIVER_NS,
    RecordedEvents,
    compute_domain,
    live_caches,
    node,
)
from opentelemetry import trace
from prometheus_client import CollectorRegistry

from pkg import featuregates as fg
from pkg.api import constants as c
from pkg.base.clock import RealClock
from pkg.imex.mode import ImexModeConfig
from pkg.kube import resources as res
from pkg.kube.client import RestClient
from pkg.reconcilers.conditions import REASON_HOST_MANAGED
from pkg.reconcilers.config import ControllerConfig
from pkg.reconcilers.flags import parse_options
from pkg.reconcilers.hostmanaged import (
    HostManagedDomainReconciler,
    HostManagedManager,
    host_managed_caches,
)
from pkg.reconcilers.metrics import DomainMetrics
from pkg.testing.clock import FakeClock
from pkg.testing.eventually import eventually
from pkg.testing.fakeapiserver import FakeApiServer

REPO = Path(__file__).resolve().parents[3]
BINARY = REPO / "cmd" / "compute-domain-controller" / "compute_domain_controller.py"
BASE = ["--image-name=img", f"--namespace={DRIVER_NS}"]
HOST_ENV = {"IMEX_MODE": "hostManaged", "FEATURE_GATES": "HostManagedIMEXDaemon=true"}


# -- flags --------------------------------------------------------------------------------------


def test_host_managed_flags_force_the_daemon_gates_off() -> None:
    opts = parse_options(BASE, HOST_ENV)
    assert opts.controller.imex == ImexModeConfig(mode="hostManaged", isolation="domain")
    assert not opts.gates.enabled(fg.COMPUTE_DOMAIN_CLIQUES)
    assert not opts.gates.enabled(fg.IMEX_DAEMONS_WITH_DNS_NAMES)
    assert "IMEXDaemonsWithDNSNames=false" in opts.controller.feature_gates
    assert "ComputeDomainCliques=false" in opts.controller.feature_gates
    flags = parse_options([*BASE, "--imex-mode=hostManaged", "--imex-isolation="], HOST_ENV)
    assert flags.controller.imex.host_managed


def test_defaults_are_driver_managed_domain() -> None:
    opts = parse_options(BASE, {})
    assert opts.controller.imex == ImexModeConfig(mode="driverManaged", isolation="domain")
    assert opts.gates.enabled(fg.COMPUTE_DOMAIN_CLIQUES)
    # An empty isolation variable means domain, as upstream.
    assert parse_options(BASE, {"IMEX_ISOLATION": ""}).controller.imex.isolation == "domain"


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (
            [],
            {"IMEX_MODE": "hostManaged"},
            'imex.mode="hostManaged" requires the HostManagedIMEXDaemon feature gate to be enabled',
        ),
        ([], {"IMEX_MODE": ""}, 'unknown imex.mode ""'),
        (["--imex-mode=driver"], {}, 'unknown imex.mode "driver"'),
        (
            ["--imex-isolation=channel"],
            {},
            'imex.isolation="channel" is not supported yet: per-workload IMEX channel allocation '
            "is not implemented",
        ),
        (
            [],
            {"IMEX_ISOLATION": "pod"},
            'unknown imex.isolation "pod": must be "domain" or "channel"',
        ),
    ],
    ids=["no-gate", "empty-env-mode", "unknown-mode", "channel", "unknown-isolation"],
)
def test_bad_imex_config_exits_1_with_upstreams_line(
    argv: list[str], env: dict[str, str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse_options([*BASE, *argv], env)
    assert exit_.value.code == 1
    assert capsys.readouterr().err == f"Error: imex configuration validation failed: {message}\n"


def test_binary_exits_1_on_bad_imex_config(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("FEATURE_GATES", "PYTHONPATH")}
    done = subprocess.run(
        [sys.executable, str(BINARY), *BASE],
        env={**env, "IMEX_MODE": "hostManaged"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.endswith(
        'Error: imex configuration validation failed: imex.mode="hostManaged" requires the '
        "HostManagedIMEXDaemon feature gate to be enabled\n"
    )


# -- reconciler ---------------------------------------------------------------------------------


@pytest.fixture
def host_config(config: ControllerConfig) -> ControllerConfig:
    return replace(config, imex=ImexModeConfig(mode="hostManaged"))


@pytest.fixture
def reconciler(
    server: FakeApiServer,
    client: RestClient,
    host_config: ControllerConfig,
    events: RecordedEvents,
    clock: FakeClock,
    registry: CollectorRegistry,
) -> HostManagedDomainReconciler:
    full = live_caches(server)
    return HostManagedDomainReconciler(
        client=client,
        caches=host_managed_caches(compute_domains=full.compute_domains, rcts=full.rcts),
        config=host_config,
        events=events,
        metrics=DomainMetrics(registry),
        clock=clock,
    )


def only(server: FakeApiServer, resource: res.Resource) -> dict[str, Any]:
    (obj,) = server.objects(resource)
    return obj


def test_one_pass_gives_finalizer_single_template_and_ready(
    server: FakeApiServer,
    reconciler: HostManagedDomainReconciler,
    clock: FakeClock,
    registry: CollectorRegistry,
) -> None:
    server.seed(res.NODES, node("a"))
    spec = {
        "numNodes": 4,
        "channel": {"resourceClaimTemplate": {"name": "cd1-channel"}, "allocationMode": "All"},
    }
    uid = str(server.seed(res.COMPUTE_DOMAINS, compute_domain(**spec))["metadata"]["uid"])
    assert reconciler.reconcile("team/cd1").requeue_after == 0
    cd = only(server, res.COMPUTE_DOMAINS)
    assert cd["metadata"]["finalizers"] == [c.FINALIZER]
    assert cd["status"]["status"] == "Ready"
    assert "nodes" not in cd["status"]
    (cond,) = cd["status"]["conditions"]
    assert (cond["type"], cond["status"], cond["reason"]) == ("Ready", "True", REASON_HOST_MANAGED)
    rct = only(server, res.RESOURCE_CLAIM_TEMPLATES)
    assert rct["metadata"]["name"] == "cd1-channel" and rct["metadata"]["namespace"] == "team"
    (config,) = rct["spec"]["spec"]["devices"]["config"]
    params = config["opaque"]["parameters"]
    assert params["allocationMode"] == "Single" and params["domainID"] == uid
    # Nothing of the daemon machinery, and no node touched.
    for resource in (res.DAEMONSETS, res.COMPUTE_DOMAIN_CLIQUES, res.PODS):
        assert server.objects(resource) == []
    assert c.COMPUTE_DOMAIN_LABEL not in only(server, res.NODES)["metadata"]["labels"]
    assert registry.get_sample_value("nvidia_dra_compute_domain_info", {"status": "Ready"}) == 1
    # A second pass writes nothing new.
    rv = only(server, res.COMPUTE_DOMAINS)["metadata"]["resourceVersion"]
    clock.step(60)
    reconciler.reconcile("team/cd1")
    assert only(server, res.COMPUTE_DOMAINS)["metadata"]["resourceVersion"] == rv


def test_deletion_removes_template_its_finalizer_and_ours(
    server: FakeApiServer,
    client: RestClient,
    reconciler: HostManagedDomainReconciler,
    registry: CollectorRegistry,
) -> None:
    server.seed(res.COMPUTE_DOMAINS, compute_domain())
    reconciler.reconcile("team/cd1")
    # As the upstream controller leaves it: its finalizer on the template.
    rct = only(server, res.RESOURCE_CLAIM_TEMPLATES)
    rct["metadata"]["finalizers"] = [c.FINALIZER]
    client.update(res.RESOURCE_CLAIM_TEMPLATES, rct)
    client.delete(res.COMPUTE_DOMAINS, "cd1", namespace="team")
    assert reconciler.reconcile("team/cd1").requeue_after == 0
    assert server.objects(res.RESOURCE_CLAIM_TEMPLATES) == []
    assert server.objects(res.COMPUTE_DOMAINS) == []
    assert registry.get_sample_value("nvidia_dra_compute_domain_info", {"status": "Ready"}) == 0


def test_template_owned_by_someone_else_is_a_warning_not_ready(
    server: FakeApiServer,
    client: RestClient,
    reconciler: HostManagedDomainReconciler,
    events: RecordedEvents,
) -> None:
    server.seed(
        res.RESOURCE_CLAIM_TEMPLATES,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "cd1-channel", "namespace": "team"},
            "spec": {"spec": {"devices": {"requests": []}}},
        },
    )
    server.seed(res.COMPUTE_DOMAINS, compute_domain())
    assert reconciler.reconcile("team/cd1").requeue_after > 0
    assert "ResourceClaimTemplateConflict" in events.reasons()
    assert "status" not in only(server, res.COMPUTE_DOMAINS)


# -- wired manager ------------------------------------------------------------------------------


@pytest.fixture
def manager(
    client: RestClient,
    host_config: ControllerConfig,
    registry: CollectorRegistry,
    events: RecordedEvents,
) -> Iterator[HostManagedManager]:
    mgr = HostManagedManager(
        client=client,
        config=host_config,
        registry=registry,
        tracer=trace.NoOpTracer(),
        clock=RealClock(),
        informer_clock=RealClock(),
        events=events,
    )
    yield mgr
    mgr.stop()


def test_manager_runs_domains_to_ready_and_sweeps_orphaned_templates(
    server: FakeApiServer, client: RestClient, manager: HostManagedManager
) -> None:
    server.seed(res.COMPUTE_DOMAINS, compute_domain())
    orphan = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": "old",
            "namespace": "team",
            "labels": {c.COMPUTE_DOMAIN_LABEL: "gone-uid"},
        },
        "spec": {"spec": {"devices": {"requests": []}}},
    }
    server.seed(res.RESOURCE_CLAIM_TEMPLATES, orphan)
    assert manager.start(sync_timeout=10)
    assert manager.synced()

    def status() -> str:
        objs = server.objects(res.COMPUTE_DOMAINS)
        return str(((objs[0] if objs else {}).get("status") or {}).get("status"))

    eventually(lambda: status() == "Ready")
    eventually(
        lambda: (
            [o["metadata"]["name"] for o in server.objects(res.RESOURCE_CLAIM_TEMPLATES)]
            == ["cd1-channel"]
        )
    )
    assert server.objects(res.DAEMONSETS) == []
    assert server.objects(res.COMPUTE_DOMAIN_CLIQUES) == []
    client.delete(res.COMPUTE_DOMAINS, "cd1", namespace="team")
    eventually(lambda: server.objects(res.COMPUTE_DOMAINS) == [])
    assert server.objects(res.RESOURCE_CLAIM_TEMPLATES) == []
