"""Pure renderers of the workload RCT, daemon RCT and daemon DaemonSet."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

import pytest

from pkg.api import constants as c
from pkg.api import daemoncontract as dc
from pkg.api.computedomain import parse_compute_domain
from pkg.base.types import JSON
from pkg.imex.config import ImexConfig
from pkg.reconcilers.config import ControllerConfig, parse_extra_env
from pkg.reconcilers.objects import (
    SPEC_HASH_ANNOTATION,
    render_daemon_rct,
    render_daemonset,
    render_workload_rct,
)

CONFIG = ControllerConfig(
    namespace="drv",
    image_name="img:1",
    log_verbosity_cd_daemon=3,
    feature_gates="A=true",
    image_pull_secret_names=("s1", "s2"),
    node_loss_grace_period=45,
)
CD = parse_compute_domain(
    {
        "metadata": {"namespace": "team", "name": "cd1", "uid": "u-1", "generation": 1},
        "spec": {"channel": {"resourceClaimTemplate": {"name": "chan"}, "allocationMode": "All"}},
    }
)


def env(ds: JSON) -> dict[str, Any]:
    container = ds["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_workload_rct_matches_upstream_shape_and_is_owned_by_the_cd() -> None:
    rct = render_workload_rct(CD, owner={"metadata": {}})
    assert rct["apiVersion"] == "resource.k8s.io/v1"
    assert (rct["metadata"]["name"], rct["metadata"]["namespace"]) == ("chan", "team")
    devices = rct["spec"]["spec"]["devices"]
    # Upstream's request plus the toleration of its own domain's channel taint (and no other).
    toleration = {
        "key": c.COMPUTE_DOMAIN_LABEL,
        "operator": "Equal",
        "value": "u-1",
        "effect": "NoSchedule",
    }
    assert devices["requests"] == [
        {
            "name": "channel",
            "exactly": {"deviceClassName": c.CHANNEL_DEVICE_CLASS, "tolerations": [toleration]},
        }
    ]
    assert devices["config"][0]["requests"] == ["channel"]
    assert devices["config"][0]["opaque"]["parameters"]["allocationMode"] == "All"
    (ref,) = rct["metadata"]["ownerReferences"]
    assert (ref["kind"], ref["uid"], ref["controller"]) == ("ComputeDomain", "u-1", True)
    assert "finalizers" not in rct["metadata"]
    assert "ownerReferences" not in render_workload_rct(CD)["metadata"]


def test_daemon_rct_lives_in_the_driver_namespace() -> None:
    rct = render_daemon_rct(CD, CONFIG)
    assert (rct["metadata"]["name"], rct["metadata"]["namespace"]) == (
        "computedomain-daemon-u-1",
        "drv",
    )
    assert rct["metadata"]["labels"][c.TARGET_LABEL] == c.TARGET_DAEMON
    params = rct["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]
    assert params == {"apiVersion": c.API_VERSION, "kind": c.DAEMON_CONFIG_KIND, "domainID": "u-1"}


def test_daemonset_contract_with_the_daemon() -> None:
    ds = render_daemonset(CD, CONFIG)
    pod = ds["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert ds["metadata"]["labels"] == {c.COMPUTE_DOMAIN_LABEL: "u-1"}
    assert ds["spec"]["selector"]["matchLabels"] == {c.COMPUTE_DOMAIN_LABEL: "u-1"}
    assert ds["spec"]["template"]["metadata"]["labels"][c.COMPUTE_DOMAIN_LABEL] == "u-1"
    assert pod["nodeSelector"] == {c.COMPUTE_DOMAIN_LABEL: "u-1"}
    assert container["command"] == ["compute-domain-daemon", "-v", "$(LOG_VERBOSITY)", "run"]
    assert container["image"] == "img:1"
    assert container["resources"] == {"claims": [{"name": "compute-domain-daemon"}]}
    assert pod["resourceClaims"] == [
        {"name": "compute-domain-daemon", "resourceClaimTemplateName": "computedomain-daemon-u-1"}
    ]
    assert pod["imagePullSecrets"] == [{"name": "s1"}, {"name": "s2"}]
    assert pod["serviceAccountName"] == "compute-domain-daemon"  # the SA config/rbac ships
    e = env(ds)
    assert e[dc.CLIQUE_JOIN_BY_CONTROLLER] == "true"  # the controller writes their entries
    assert (e["LOG_VERBOSITY"], e["MAX_NODES_PER_IMEX_DOMAIN"], e["FEATURE_GATES"]) == (
        "3",
        "18",
        "A=true",
    )
    assert e["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert e["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert e["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    for probe, period, threshold in (
        ("startupProbe", 1, 1200),
        ("livenessProbe", 60, 20),
        ("readinessProbe", 10, 1),
    ):
        p = container[probe]
        assert p["exec"]["command"][-1] == "check"
        assert (p["periodSeconds"], p["failureThreshold"], p["timeoutSeconds"]) == (
            period,
            threshold,
            10,
        )


def test_daemon_container_runs_with_least_privilege() -> None:
    """Root (the owner of every file it writes and of the fabric-imex-mgmt device)
    without any capability, no escalation, RuntimeDefault seccomp and a read-only root
    filesystem whose only writable places are emptyDirs (/imexd comes from CDI, /etc/hosts and
    /dev/termination-log from the kubelet)."""
    pod = render_daemonset(CD, CONFIG)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["securityContext"] == {
        "runAsUser": 0,
        "runAsGroup": 0,
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert container["volumeMounts"] == [
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "var-log", "mountPath": "/var/log"},
    ]
    assert pod["volumes"] == [{"name": "tmp", "emptyDir": {}}, {"name": "var-log", "emptyDir": {}}]
    # Nothing that widens the pod: no host namespaces, no hostPath, no added capability.
    assert not {"hostNetwork", "hostPID", "hostIPC"} & set(pod)
    assert all(set(v) == {"name", "emptyDir"} for v in pod["volumes"])
    # nvidia-imex's stats file is written where an emptyDir is mounted.
    stats = ImexConfig(bind_ip="10.0.0.1", node_config_path="/imexd/nodes.cfg").stats_file_name
    assert os.path.dirname(stats) in {m["mountPath"] for m in container["volumeMounts"]}
    # A rendered context is a copy: mutating one DaemonSet never changes the next.
    container["securityContext"]["capabilities"]["drop"].append("X")
    fresh = render_daemonset(CD, CONFIG)["spec"]["template"]["spec"]["containers"][0]
    assert fresh["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_daemons_tolerate_every_taint_like_upstream() -> None:
    """Upstream's three wildcard tolerations, nothing bounded: the DaemonSet controller would
    overwrite a bounded not-ready/unreachable toleration with an infinite one anyway, and
    without the wildcard NoExecute a daemon could not follow its workload onto a node with a
    custom NoExecute taint the workload tolerates."""
    tolerations = render_daemonset(CD, CONFIG)["spec"]["template"]["spec"]["tolerations"]
    assert tolerations == [
        {"operator": "Exists", "effect": "NoSchedule"},
        {"operator": "Exists", "effect": "NoExecute"},
        {"operator": "Exists", "effect": "PreferNoSchedule"},
    ]


def test_spec_hash_changes_with_config_only() -> None:
    a = render_daemonset(CD, CONFIG)
    assert render_daemonset(CD, CONFIG) == a
    b = render_daemonset(CD, replace(CONFIG, image_name="img:2"))
    assert (
        a["metadata"]["annotations"][SPEC_HASH_ANNOTATION]
        != b["metadata"]["annotations"][SPEC_HASH_ANNOTATION]
    )


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("namespace", "", "namespace"),
        ("image_name", "", "image-name"),
        ("max_nodes_per_imex_domain", 0, "max-nodes"),
    ],
)
def test_config_validation(field: str, value: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        replace(CONFIG, **{field: value}).validate()


def test_extra_env_is_rendered_after_the_core_env() -> None:
    base = render_daemonset(CD, CONFIG)
    config = replace(CONFIG, daemon_extra_env=(("IMEX_BIN_DIR", "/sim/bin"), ("X_1", "a=b")))
    ds = render_daemonset(CD, config)
    container = ds["spec"]["template"]["spec"]["containers"][0]
    core = base["spec"]["template"]["spec"]["containers"][0]["env"]
    assert container["env"] == [
        *core,
        {"name": "IMEX_BIN_DIR", "value": "/sim/bin"},
        {"name": "X_1", "value": "a=b"},
    ]
    assert (
        ds["metadata"]["annotations"][SPEC_HASH_ANNOTATION]
        != base["metadata"]["annotations"][SPEC_HASH_ANNOTATION]
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1X=a", "not a valid variable name"),
        ("A-B=a", "not a valid variable name"),
        ("=a", "not a valid variable name"),
        ("NOVALUE", "not NAME=value"),
        ("NODE_NAME=n", "set by the controller"),
        ("POD_IP=1.2.3.4", "set by the controller"),
        ("FEATURE_GATES=A=true", "set by the controller"),
        ("COMPUTE_DOMAIN_UUID=x", "set by the controller"),
        ("A=1,A=2", "given twice"),
    ],
)
def test_extra_env_is_validated(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_extra_env(text)
    if "=" in text:  # the config built directly is held to the same rules
        pairs = tuple((n, v) for n, _, v in (i.partition("=") for i in text.split(",")))
        with pytest.raises(ValueError, match=message):
            replace(CONFIG, daemon_extra_env=pairs).validate()


def test_extra_env_parsing() -> None:
    assert parse_extra_env("") == ()
    assert parse_extra_env(" A=1 , B=x=y,,C=") == (("A", "1"), ("B", "x=y"), ("C", ""))


@pytest.mark.parametrize(
    ("extra_env", "reserved"),
    [
        ((), "50000,50005"),
        ((("IMEX_SERVER_PORT", "51000"),), "50005,51000"),
        ((("IMEX_SERVER_PORT", "51000"), ("IMEX_CMD_PORT", "51005")), "51000,51005"),
        ((("IMEX_CMD_PORT", "not-a-port"),), "50000,50005"),
    ],
    ids=["defaults", "server-port-set", "both-set", "bad-value-keeps-the-default"],
)
def test_imex_ports_are_reserved_from_outbound_connections_of_the_daemon_pod(
    extra_env: tuple[tuple[str, str], ...], reserved: str
) -> None:
    """An outbound connection of the daemon pod (an API request, a watch) that got IMEX's port
    as its local port kept IMEX from listening for as long as it lived; the pod's own netns
    keeps both ports out of the kernel's choice (a safe sysctl, allowed by every kubelet)."""
    config = replace(CONFIG, daemon_extra_env=extra_env)
    pod = render_daemonset(CD, config)["spec"]["template"]["spec"]
    assert pod["securityContext"] == {
        "sysctls": [{"name": "net.ipv4.ip_local_reserved_ports", "value": reserved}]
    }
