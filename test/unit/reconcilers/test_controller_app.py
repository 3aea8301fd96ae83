"""The controller process: flags/env, readiness, leader handover, SIGTERM → lease released."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from cdctl_fakes import DRIVER_NS, channel_claim, compute_domain  # type: ignore[import-not-found, unused-ignore]
from kubernetes import client as k8s_client

from pkg.api import constants as c
from pkg.api.constants import GROUP
from pkg.kube import resources as res
from pkg.kube.client import RestClient
from pkg.kube.config import Connection
from pkg.reconcilers.app import run
from pkg.reconcilers.flags import Options, parse_duration, parse_options
from pkg.testing.eventually import eventually
from pkg.testing.fakeapiserver import FakeApiServer

REPO = Path(__file__).resolve().parents[3]
BINARY = REPO / "cmd" / "compute-domain-controller" / "compute_domain_controller.py"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("15s", 15.0), ("1m30s", 90.0), ("500ms", 0.5), ("2", 2.0), ("1h", 3600.0)],
)
def test_go_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_env_fills_missing_flags_and_flags_win() -> None:
    env = {
        "IMAGE_NAME": "img:env",
        "NAMESPACE": "drv",
        "LEADER_ELECTION_ENABLED": "true",
        "LEADER_ELECTION_LEASE_DURATION": "20s",
        "CD_DAEMON_IMAGE_PULL_SECRET_NAMES": "a, b c",
        "POD_NAME": "ctl-0",
        "MAX_NODES_PER_IMEX_DOMAIN": "36",
    }
    opts = parse_options(["-image-name", "img:flag", "--v=4", "--kube-api-qps=20"], env)
    assert opts.controller.image_name == "img:flag"
    assert opts.controller.namespace == "drv" and opts.lease_namespace == "drv"
    assert opts.leader_election and opts.lease_duration == 20.0
    assert opts.controller.image_pull_secret_names == ("a", "b", "c")
    assert opts.controller.max_nodes_per_imex_domain == 36
    assert (opts.pod_name, opts.verbosity, opts.kube_api_qps) == ("ctl-0", 4, 20.0)
    assert "ComputeDomainCliques=true" in opts.controller.feature_gates
    assert parse_options(["--image-name=x", "--leader-election-enabled"], {}).leader_election


def test_default_client_limits_are_upstreams_one_budget_per_clientset() -> None:
    """QPS 5 and burst 10, as upstream's controller: the Kubernetes API groups share one bucket
    (one clientset), resource.nvidia.com has its own (the generated clientset beside it)."""
    opts = parse_options(["--image-name=x"], {})
    assert (opts.kube_api_qps, opts.kube_api_burst) == (5.0, 10)
    slept: list[float] = []
    client = RestClient(
        Connection(k8s_client.Configuration()),
        qps=opts.kube_api_qps,
        burst=opts.kube_api_burst,
        separate_groups=(GROUP,),
        monotonic=lambda: 0.0,
        sleep=slept.append,
    )
    core = client._throttle_for("/api/v1/nodes/n")
    assert client._throttle_for("/apis/apps/v1/namespaces/d/daemonsets") is core
    assert client._throttle_for("/apis/coordination.k8s.io/v1/namespaces/d/leases/l") is core
    assert client._throttle_for(f"/apis/{GROUP}/v1beta1/computedomains") is not core
    for _ in range(10):
        core.wait()
    assert slept == []
    core.wait()  # the bucket is empty: one token every 1/qps seconds
    assert slept == [pytest.approx(1 / opts.kube_api_qps)]


def test_daemon_defaults_and_extra_env() -> None:
    opts = parse_options(["--image-name=x"], {})
    assert opts.controller.daemon_service_account == "compute-domain-daemon"
    assert opts.controller.daemon_extra_env == ()
    assert opts.controller.clique_entry_grace_period == 30.0
    assert opts.controller.node_loss_grace_period == 60.0
    assert opts.controller.domain_batch_period == 0.2
    assert (
        parse_options(
            ["--image-name=x"], {"DOMAIN_BATCH_PERIOD": "0"}
        ).controller.domain_batch_period
        == 0.0
    )
    env = {
        "CD_DAEMON_EXTRA_ENV": "IMEX_BIN_DIR=/opt/sim/bin",
        "CLIQUE_ENTRY_GRACE_PERIOD": "1m",
        "NODE_LOSS_GRACE_PERIOD": "2m30s",
    }
    opts = parse_options(["--image-name=x"], env)
    assert opts.controller.daemon_extra_env == (("IMEX_BIN_DIR", "/opt/sim/bin"),)
    assert opts.controller.clique_entry_grace_period == 60.0
    assert opts.controller.node_loss_grace_period == 150.0
    opts = parse_options(["--image-name=x", "--cd-daemon-extra-env=A=1,B=2"], env)
    assert opts.controller.daemon_extra_env == (("A", "1"), ("B", "2"))


@pytest.mark.parametrize(
    ("gates", "cliques", "dns"),
    [
        ("", True, True),
        ("ComputeDomainCliques=false", False, True),
        ("ComputeDomainCliques=false,IMEXDaemonsWithDNSNames=false", False, False),
    ],
    ids=["defaults", "cliques-off", "ip-mode"],
)
def test_every_upstream_gate_mode_is_accepted(gates: str, cliques: bool, dns: bool) -> None:
    opts = parse_options(["--image-name=x"], {"FEATURE_GATES": gates})
    assert opts.controller.compute_domain_cliques is cliques
    assert opts.gates.enabled("IMEXDaemonsWithDNSNames") is dns
    # The daemons get the whole effective map, so they pick the same membership and IMEX mode.
    rendered = dict(kv.split("=") for kv in opts.controller.feature_gates.split(","))
    assert rendered["ComputeDomainCliques"] == str(cliques).lower()
    assert rendered["IMEXDaemonsWithDNSNames"] == str(dns).lower()


def test_additional_namespaces_from_flag_or_env() -> None:
    opts = parse_options(
        ["--image-name=x", "--namespace=drv"], {"ADDITIONAL_NAMESPACES": "old, older,,old drv"}
    )
    assert opts.controller.additional_namespaces == ("old", "older")
    assert opts.controller.managed_namespaces == ("drv", "old", "older")
    opts = parse_options(
        ["--image-name=x", "--additional-namespaces=x1"], {"ADDITIONAL_NAMESPACES": "ignored"}
    )
    assert opts.controller.managed_namespaces == ("default", "x1")
    assert parse_options(["--image-name=x"], {}).controller.additional_namespaces == ()


def test_repeated_namespace_and_gate_flags_accumulate_as_upstreams() -> None:
    """``--additional-namespaces`` is urfave/cli's string slice (repeats add up and replace the
    env's list); ``--feature-gates`` component-base's map (each repeat and the env set keys)."""
    opts = parse_options(
        ["--image-name=x", "--additional-namespaces=a", "--additional-namespaces", "b,c"],
        {"ADDITIONAL_NAMESPACES": "ignored"},
    )
    assert opts.controller.additional_namespaces == ("a", "b", "c")
    opts = parse_options(
        [
            "--image-name=x",
            "--feature-gates=ComputeDomainCliques=false",
            "--feature-gates",
            "IMEXDaemonsWithDNSNames=false",
        ],
        {"FEATURE_GATES": "HostManagedIMEXDaemon=true,ComputeDomainCliques=true"},
    )
    assert not opts.gates.enabled("ComputeDomainCliques")
    assert not opts.gates.enabled("IMEXDaemonsWithDNSNames")
    assert opts.gates.enabled("HostManagedIMEXDaemon")


@pytest.mark.parametrize(("given", "served"), [("/m", "/m"), ("m", "/m"), ("/m/", "/m"), ("", "")])
def test_metrics_path_is_rooted_and_cleaned_as_upstreams(given: str, served: str) -> None:
    assert parse_options(["--image-name=x", f"--metrics-path={given}"], {}).metrics_path == served
    assert parse_options(
        ["--image-name=x"], {"METRICS_PATH": given or "/metrics"}
    ).metrics_path == (served or "/metrics")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "--image-name"),
        (["--image-name=x", "--feature-gates=Nope=true"], "unrecognized feature gate: Nope"),
        (
            ["--image-name=x", "--feature-gates=IMEXDaemonsWithDNSNames=false"],
            "feature gate ComputeDomainCliques requires IMEXDaemonsWithDNSNames to also be "
            "enabled (set IMEXDaemonsWithDNSNames=true or ComputeDomainCliques=false)",
        ),
        (
            ["--image-name=x", "--additional-namespaces=old,Bad_NS"],
            "additional-namespaces: 'Bad_NS' is not a valid namespace name",
        ),
        (["--image-name=x", "--leader-election-retry-period=soon"], "invalid duration"),
        (["--image-name=x", "--cd-daemon-extra-env=POD_NAME=x"], "cd-daemon-extra-env"),
        (["--image-name=x", "--cd-daemon-extra-env=bad name=x"], "cd-daemon-extra-env"),
        (["--image-name=x", "--clique-entry-grace-period=-1s"], "clique-entry-grace-period"),
        (["--image-name=x", "--node-loss-grace-period=-1"], "node-loss-grace-period"),
        (["--image-name=x", "--domain-batch-period=-1s"], "domain-batch-period"),
    ],
    ids=[
        "no-image",
        "bad-gate",
        "dns-off-needs-cliques-off",
        "additional-ns-invalid",
        "bad-duration",
        "extra-env-core",
        "extra-env-name",
        "negative-grace",
        "negative-node-loss",
        "negative-batch-period",
    ],
)
def test_bad_flags_fail_fast_naming_the_flag(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_options(argv, {})
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (
            ["--image-name=x"],
            {"LEADER_ELECTION_ENABLED": "yes"},
            '--leader-election-enabled (or LEADER_ELECTION_ENABLED): invalid boolean "yes"',
        ),
        (
            ["--image-name=x", "--leader-election-enabled", "false"],
            {},
            "unrecognized arguments: false",
        ),
        (
            ["--image-name=x"],
            {"KUBE_API_BURST": "many"},
            '--kube-api-burst (or KUBE_API_BURST): "many" is not an integer',
        ),
    ],
    ids=["env-bool-yes", "bool-takes-no-separate-value", "env-int"],
)
def test_shared_flag_rules_exit_2(
    argv: list[str], env: dict[str, str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_options(argv, env)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_go_booleans_and_the_start_up_dump() -> None:
    opts = parse_options(
        ["--image-name=x", "--debug-endpoints=T"], {"LEADER_ELECTION_ENABLED": "1"}
    )
    assert opts.debug_endpoints and opts.leader_election
    dump = dict(opts.flag_values)
    assert (dump["v"], dump["logging_format"], dump["image_name"]) == (0, "text", "x")
    assert list(dump) == sorted(dump)


def options(*extra: str) -> Options:
    return parse_options(
        [
            "--image-name=img",
            f"--namespace={DRIVER_NS}",
            "--leader-election-enabled",
            "--leader-election-lease-duration=1.5s",
            "--leader-election-renew-deadline=1s",
            "--leader-election-retry-period=0.2s",
            "--http-endpoint=127.0.0.1:0",
            *extra,
        ],
        {},
    )


def get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code


class Instance:
    """One in-process controller run in a thread."""

    def __init__(self, server: FakeApiServer, name: str) -> None:
        self.stop = threading.Event()
        self.port = 0
        self.rc: int | None = None
        started = threading.Event()

        def ready(port: int) -> None:
            self.port = port
            started.set()

        def target() -> None:
            self.rc = run(
                options(f"--pod-name={name}"),
                stop=self.stop,
                env={},
                client_factory=lambda _o: server.client(),
                ready=ready,
            )

        self.thread = threading.Thread(target=target, daemon=True)
        self.thread.start()
        assert started.wait(10)

    def readyz(self) -> int:
        return get(f"http://127.0.0.1:{self.port}/readyz")


def holder(server: FakeApiServer) -> str:
    leases = server.objects(res.LEASES)
    return str(leases[0]["spec"].get("holderIdentity") or "") if leases else ""


def test_two_instances_hand_over_the_lease_on_clean_shutdown(server: FakeApiServer) -> None:
    server.seed(res.COMPUTE_DOMAINS, compute_domain())
    a = Instance(server, "a")
    eventually(lambda: holder(server).startswith("a-"))
    eventually(lambda: a.readyz() == 200)  # leading with synced caches
    eventually(lambda: server.objects(res.COMPUTE_DOMAINS)[0]["metadata"].get("finalizers"))
    b = Instance(server, "b")
    eventually(lambda: b.readyz() == 200)  # healthy standby
    assert holder(server).startswith("a-")
    lease = server.objects(res.LEASES)[0]
    assert lease["spec"]["renewTime"].endswith("Z") and len(lease["spec"]["renewTime"]) == 27
    a.stop.set()
    a.thread.join(10)
    assert a.rc == 0
    eventually(lambda: holder(server).startswith("b-"), timeout=3.0)  # released, not expired
    assert server.objects(res.LEASES)[0]["spec"]["leaseTransitions"] >= 1
    b.stop.set()
    b.thread.join(10)
    assert b.rc == 0 and holder(server) == ""


def test_lost_lease_steps_down_and_campaigns_again_in_the_same_process(
    server: FakeApiServer,
) -> None:
    a = Instance(server, "a")
    eventually(lambda: holder(server).startswith("a-"))
    ours = holder(server)
    lease = server.objects(res.LEASES)[0]
    lease["spec"]["holderIdentity"] = "usurper"
    server.seed(res.LEASES, lease)
    # a steps down (its manager stops), waits out the usurper's 1.5 s lease, leads again.
    eventually(lambda: holder(server) == ours, timeout=10)
    assert a.thread.is_alive() and a.rc is None
    server.seed(res.COMPUTE_DOMAINS, compute_domain("cd2"))
    # the new term reconciles
    eventually(lambda: len(server.objects(res.RESOURCE_CLAIM_TEMPLATES)) == 1)
    eventually(lambda: a.readyz() == 200)
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{a.port}/metrics", timeout=5).read()
    assert b"nvidia_dra_reconcile_total" in metrics  # the new term's metrics are served
    a.stop.set()
    a.thread.join(10)
    assert a.rc == 0


def lease_requests(server: FakeApiServer) -> int:
    return sum(1 for _method, path in server.request_log if "/leases" in path)


def test_api_server_outage_shorter_than_the_renew_deadline_costs_nothing(
    server: FakeApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    a = Instance(server, "a")
    eventually(lambda: holder(server).startswith("a-"))
    ours = holder(server)
    transitions = server.objects(res.LEASES)[0]["spec"]["leaseTransitions"]
    tried = lease_requests(server)
    server.set_available(False)
    # An API server restart inside the 1 s renew deadline: one renewal fails, the next works.
    eventually(lambda: lease_requests(server) > tried)
    server.set_available(True)
    server.seed(res.COMPUTE_DOMAINS, compute_domain())
    eventually(lambda: len(server.objects(res.RESOURCE_CLAIM_TEMPLATES)) == 1)
    assert a.thread.is_alive()
    lease = server.objects(res.LEASES)[0]["spec"]
    assert lease["holderIdentity"] == ours and lease["leaseTransitions"] == transitions
    assert "leadership lost" not in caplog.text
    # A longer outage loses the term; the process campaigns again instead of exiting.
    server.set_available(False)
    eventually(lambda: "leadership lost" in caplog.text)
    server.set_available(True)
    eventually(lambda: holder(server) == ours, timeout=10)
    server.seed(res.COMPUTE_DOMAINS, compute_domain("cd2"))
    eventually(lambda: len(server.objects(res.RESOURCE_CLAIM_TEMPLATES)) == 2)
    assert a.thread.is_alive() and a.rc is None
    a.stop.set()
    a.thread.join(10)
    assert a.rc == 0


def test_binary_runs_from_any_cwd_and_exits_zero_on_sigterm(
    server: FakeApiServer, tmp_path: Path
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: fake\n"
        f"clusters: [{{name: fake, cluster: {{server: '{server.url}'}}}}]\n"
        "users: [{name: fake, user: {}}]\n"
        "contexts: [{name: fake, context: {cluster: fake, user: fake}}]\n"
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server.seed(res.COMPUTE_DOMAINS, compute_domain())
    proc = subprocess.Popen(
        [
            sys.executable,
            str(BINARY),
            f"--kubeconfig={kubeconfig}",
            f"--namespace={DRIVER_NS}",
            "--image-name=img",
            "--leader-election-enabled",
            f"--http-endpoint=127.0.0.1:{port}",
            "--pod-name=bin",
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": ""},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        eventually(lambda: len(server.objects(res.RESOURCE_CLAIM_TEMPLATES)) == 1, timeout=30)
        eventually(lambda: get(f"http://127.0.0.1:{port}/readyz") == 200)
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
        assert b"nvidia_dra_reconcile_total" in metrics and b"workqueue_depth" in metrics
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert holder(server) == ""
    assert 'key="team/cd1' in err  # structured logs carry the object key
    assert c.FINALIZER in server.objects(res.COMPUTE_DOMAINS)[0]["metadata"]["finalizers"]


def test_without_leader_election_runs_directly_and_stops_cleanly(server: FakeApiServer) -> None:
    server.seed(res.COMPUTE_DOMAINS, compute_domain())
    opts = parse_options(
        ["--image-name=img", f"--namespace={DRIVER_NS}", "--http-endpoint=127.0.0.1:0"], {}
    )
    stop = threading.Event()
    ports: list[int] = []
    rc: list[int] = []
    thread = threading.Thread(
        target=lambda: rc.append(
            run(
                opts,
                stop=stop,
                env={},
                ready=ports.append,
                client_factory=lambda _o: server.client(),
            )
        ),
    )
    thread.start()
    eventually(lambda: ports and get(f"http://127.0.0.1:{ports[0]}/readyz") == 200)
    eventually(lambda: len(server.objects(res.RESOURCE_CLAIM_TEMPLATES)) == 1)
    assert server.objects(res.LEASES) == []
    assert get(f"http://127.0.0.1:{ports[0]}/debug/informers") == 404  # off by default
    stop.set()
    thread.join(10)
    assert rc == [0]


def test_debug_endpoint_serves_every_cache_as_keys_and_resource_versions(
    server: FakeApiServer,
) -> None:
    uid = server.seed(res.COMPUTE_DOMAINS, compute_domain())["metadata"]["uid"]
    # In use (a channel claim allocated), so the domain has its DaemonSet too.
    server.seed(res.RESOURCE_CLAIMS, channel_claim("w0", ns="team", uid=uid, node_name="a"))
    opts = parse_options(
        ["--image-name=img", f"--namespace={DRIVER_NS}", "--http-endpoint=127.0.0.1:0"],
        {"DEBUG_ENDPOINTS": "true"},
    )
    assert opts.debug_endpoints and not parse_options(["--image-name=img"], {}).debug_endpoints
    stop = threading.Event()
    ports: list[int] = []
    thread = threading.Thread(
        target=lambda: run(
            opts, stop=stop, env={}, ready=ports.append, client_factory=lambda _o: server.client()
        ),
    )
    thread.start()

    def document() -> dict[str, Any]:
        url = f"http://127.0.0.1:{ports[0]}/debug/informers"
        with urllib.request.urlopen(url, timeout=5) as resp:
            out: dict[str, Any] = json.loads(resp.read())
            return out

    def by_resource() -> dict[tuple[str, str | None], dict[str, Any]]:
        return {(i["resource"], i["labelSelector"]): i for i in document()["informers"]}

    def rvs(resource: res.Resource) -> dict[str, str]:
        return {
            f"{o['metadata']['namespace']}/{o['metadata']['name']}": o["metadata"][
                "resourceVersion"
            ]
            for o in server.objects(resource)
        }

    try:
        eventually(lambda: ports and get(f"http://127.0.0.1:{ports[0]}/readyz") == 200)
        eventually(lambda: len(server.objects(res.DAEMONSETS)) == 1)
        doc = document()
        assert doc["component"] == "compute-domain-controller" and doc["leading"]
        assert len(doc["informers"]) == 9 and all(i["synced"] for i in doc["informers"])
        label = c.COMPUTE_DOMAIN_LABEL
        assert set(by_resource()) == {
            ("computedomains", None),
            ("daemonsets", label),
            ("pods", label),
            ("computedomaincliques", label),
            ("resourceclaimtemplates", label),
            ("nodes", None),
            ("resourceclaims", None),
            ("resourceslices", None),
            ("nodes", label),
        }
        assert by_resource()[("nodes", None)]["metadataOnly"] is True
        assert by_resource()[("daemonsets", label)]["namespace"] == DRIVER_NS
        eventually(
            lambda: by_resource()[("computedomains", None)]["objects"] == rvs(res.COMPUTE_DOMAINS)
        )
        eventually(
            lambda: by_resource()[("daemonsets", label)]["objects"] == rvs(res.DAEMONSETS) != {}
        )
    finally:
        stop.set()
        thread.join(10)


def test_go_driver_gates_are_accepted_and_passed_to_the_daemons() -> None:
    """A FEATURE_GATES shared with the Go driver's GPU plugin must not stop the controller."""
    opts = parse_options(["--image-name=x"], {"FEATURE_GATES": "MPSSupport=true,AllAlpha=false"})
    rendered = opts.controller.feature_gates.split(",")
    assert "MPSSupport=true" in rendered and "AllAlpha=false" in rendered
    assert "ComputeDomainCliques=true" in rendered
