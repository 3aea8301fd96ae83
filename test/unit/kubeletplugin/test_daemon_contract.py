"""The daemon's process contract end to end (pkg.api.daemoncontract): the env the controller's
DaemonSet renders plus the env and mount the plugin's CDI spec gives a daemon claim, fed to the
daemon's own parser, arrive in the fields the daemon acts on. Renaming a variable on one side
only, or moving the mount away from the daemon's config directory, fails here."""

from __future__ import annotations

from pathlib import Path

from test_contract import cdi_spec  # type: ignore[import-not-found, unused-ignore]
from testsupport.kp_harness import (
    CLIQUE,
    DRIVER_NS,
    NODE,
    running_plugin,
    seed_claim,
    set_daemon_ready,
)

from pkg.api import constants as c
from pkg.api import daemoncontract as dc
from pkg.api.computedomain import parse_compute_domain
from pkg.daemon.options import parse
from pkg.kube import resources as res
from pkg.reconcilers.config import DAEMON_CORE_ENV, ControllerConfig
from pkg.reconcilers.objects import render_daemonset
from pkg.testing.fakeapiserver import FakeApiServer

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
POD = {
    "spec.nodeName": NODE,
    "status.podIP": "10.0.0.9",
    "metadata.uid": "pod-uid-1",
    "metadata.name": "computedomain-daemon-x",
    "metadata.namespace": DRIVER_NS,
}
"""The pod fields the kubelet resolves the DaemonSet's downward-API variables from."""


def daemonset_env(cd: dict[str, object]) -> dict[str, str]:
    """The env of a daemon container as the kubelet starts it from the controller's DaemonSet."""
    config = ControllerConfig(
        namespace=DRIVER_NS,
        image_name="img:1",
        log_verbosity_cd_daemon=5,
        feature_gates="ComputeDomainCliques=true",
    )
    ds = render_daemonset(parse_compute_domain(cd), config)
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    env = {}
    for item in container["env"]:
        ref = item.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        env[item["name"]] = POD[ref] if ref else item["value"]
    return env


def cdi_env_and_mount(api: FakeApiServer, root: Path, cd_uid: str) -> tuple[dict[str, str], str]:
    """The env and the mount target of the plugin's CDI spec for the domain's daemon claim."""
    params = {"apiVersion": c.API_VERSION, "kind": c.DAEMON_CONFIG_KIND, "domainID": cd_uid}
    claim = seed_claim(
        api, namespace=DRIVER_NS, device=c.DAEMON_DEVICE_NAME, request="daemon", params=params
    )
    uid = claim["metadata"]["uid"]
    with running_plugin(api, root) as (_plugin, kubelet):
        assert kubelet.prepare(claim).claims[uid].error == ""
        edits = cdi_spec(root, uid)["devices"][0]["containerEdits"]  # type: ignore[index]
    env = dict(str(e).split("=", 1) for e in edits["env"])
    (mount,) = edits["mounts"]
    return env, str(mount["containerPath"])


def test_what_the_daemonset_and_the_cdi_spec_set_is_what_the_daemon_parses(
    api: FakeApiServer, root: Path
) -> None:
    cd = api.seed(
        res.COMPUTE_DOMAINS,
        {
            "apiVersion": c.API_VERSION,
            "kind": c.COMPUTE_DOMAIN_KIND,
            "metadata": {
                "name": "cd-contract",
                "namespace": "team",
                "annotations": {c.TRACEPARENT_ANNOTATION: TRACEPARENT},
            },
            "spec": {"numNodes": 2, "channel": {"resourceClaimTemplate": {"name": "rct"}}},
        },
    )
    cd_uid = str(cd["metadata"]["uid"])
    set_daemon_ready(api, cd_uid, ready=True)
    from_ds = daemonset_env(cd)
    from_cdi, mount = cdi_env_and_mount(api, root, cd_uid)

    assert set(from_ds) == dc.DAEMONSET_ENV and set(from_cdi) == dc.CDI_ENV
    assert DAEMON_CORE_ENV == dc.DAEMONSET_ENV | dc.CDI_ENV  # no operator may override them
    # The container command passes the verbosity on the command line, as the DaemonSet does.
    opts = parse(["-v", from_ds[dc.LOG_VERBOSITY], "run"], {**from_ds, **from_cdi})
    opts.validate_run()
    assert opts.verbosity == 5
    assert opts.max_nodes == c.DEFAULT_MAX_NODES_PER_IMEX_DOMAIN
    assert opts.gates.enabled("ComputeDomainCliques")
    assert opts.join_by_controller is True
    assert (opts.node_name, opts.pod_ip, opts.pod_uid, opts.pod_name, opts.pod_namespace) == (
        NODE,
        "10.0.0.9",
        "pod-uid-1",
        "computedomain-daemon-x",
        DRIVER_NS,
    )
    assert (opts.clique_id, opts.domain_uid, opts.domain_name, opts.domain_namespace) == (
        CLIQUE,
        cd_uid,
        "cd-contract",
        "team",
    )
    assert opts.traceparent == TRACEPARENT
    assert opts.config_dir == mount == dc.CONFIG_DIR
