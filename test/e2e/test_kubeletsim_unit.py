"""The kubelet stand-in against a stub DRA plugin and the in-process fake API server.

No control plane needed (not marked e2e): a gRPC stub serves the registration and DRA v1
services on Unix sockets the way a real plugin does, the CDI resolver is a fake, and pods and
claims are seeded into ``pkg.testing.fakeapiserver``. Proves the stand-in's side of the kubelet
contract before the real components exist.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from kubeletsim.cdi import CdiError, ContainerEdits
from kubeletsim.claims import DraManager
from kubeletsim.kubelet import Kubelet
from kubeletsim.layout import NodeDirs, layout
from kubeletsim.localrun import LocalRun
from kubeletsim.podspec import Mount
from kubeletsim.podstatus import ContainerState
from kubeletsim.podworker import NodeContext
from kubeletsim.registration import PluginWatcher
from kubeletsim.runtime import DAEMON_IMAGE_PATH, LocalCommands

from pkg.base.clock import RealClock
from pkg.draplugin.proto.gen import kubelet_dra_v1_pb2 as dra
from pkg.draplugin.proto.gen import kubelet_dra_v1_pb2_grpc as dra_grpc
from pkg.draplugin.proto.gen import kubelet_pluginregistration_v1_pb2 as reg
from pkg.draplugin.proto.gen import kubelet_pluginregistration_v1_pb2_grpc as reg_grpc
from pkg.kube.events import EventRecorder
from pkg.kube.resources import EVENTS, PODS, RESOURCE_CLAIMS
from pkg.testing.eventually import eventually
from pkg.testing.fakeapiserver import FakeApiServer
from pkg.testing.fakedriverroot import FakeDriverRoot

DRIVER = "compute-domain.nvidia.com"


class StubPlugin(reg_grpc.RegistrationServicer, dra_grpc.DRAPluginServicer):
    """Registration + DRA v1 on two sockets; Prepare fails ``fail_prepare`` times first."""

    def __init__(self, registry: Path, plugin_dir: Path) -> None:
        self.reg_sock = registry / f"{DRIVER}-reg.sock"
        self.dra_sock = plugin_dir / "dra.sock"
        plugin_dir.mkdir(parents=True, exist_ok=True)
        self.prepared: list[str] = []
        self.unprepared: list[str] = []
        self.registered: list[bool] = []
        self.fail_prepare = 0
        self.fail_unprepare = 0  # like fail_prepare, for NodeUnprepareResources
        self.calls: list[str] = []  # "prepare"/"unprepare" in call order
        self._servers: list[grpc.Server] = []

    def start(self) -> StubPlugin:
        for sock, add in ((self.dra_sock, self._add_dra), (self.reg_sock, self._add_reg)):
            sock.unlink(missing_ok=True)
            server = grpc.server(futures.ThreadPoolExecutor(4))
            add(server)
            server.add_insecure_port(f"unix://{sock}")
            server.start()
            self._servers.append(server)
        return self

    def _add_dra(self, s: grpc.Server) -> None:
        dra_grpc.add_DRAPluginServicer_to_server(self, s)

    def _add_reg(self, s: grpc.Server) -> None:
        reg_grpc.add_RegistrationServicer_to_server(self, s)

    def stop(self) -> None:
        for s in self._servers:
            s.stop(0)
        self._servers.clear()

    def GetInfo(self, request: Any, context: Any) -> Any:
        return reg.PluginInfo(
            type="DRAPlugin",
            name=DRIVER,
            endpoint=str(self.dra_sock),
            supported_versions=["v1.DRAPlugin", "v1beta1.DRAPlugin"],
        )

    def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        self.registered.append(request.plugin_registered)
        return reg.RegistrationStatusResponse()

    def NodePrepareResources(self, request: Any, context: Any) -> Any:
        resp = dra.NodePrepareResourcesResponse()
        for c in request.claims:
            if self.fail_prepare > 0:
                self.fail_prepare -= 1
                resp.claims[c.uid].error = "current node not ready in ComputeDomain"
                continue
            self.prepared.append(c.uid)
            resp.claims[c.uid].devices.add(
                request_names=["channel"],
                pool_name="node",
                device_name="channel-0",
                cdi_device_ids=[f"k8s.{DRIVER}/claim={c.uid}-channel-0"],
            )
        return resp

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        resp = dra.NodeUnprepareResourcesResponse()
        for c in request.claims:
            self.calls.append("unprepare")
            if self.fail_unprepare > 0:
                self.fail_unprepare -= 1
                resp.claims[c.uid].error = "injected unprepare failure"
                continue
            self.unprepared.append(c.uid)
            resp.claims[c.uid].error = ""
        return resp


class FakeCdi:
    def __init__(self) -> None:
        self.unresolvable: set[str] = set()

    def resolve(self, spec_dirs: Sequence[Path], device_ids: Sequence[str]) -> ContainerEdits:
        bad = [i for i in device_ids if i in self.unresolvable]
        if bad:
            raise CdiError(f"unresolvable CDI devices {bad[0]}")
        nodes = tuple(
            {
                "path": "/dev/nvidia-caps-imex-channels/channel0",
                "type": "c",
                "major": 235,
                "minor": 0,
            }
            for _ in device_ids
        )
        return ContainerEdits(env=tuple(f"DEV={i}" for i in device_ids), device_nodes=nodes)


def wait_for(what: str, fn: Callable[[], Any], timeout: float = 15.0) -> Any:
    return eventually(fn, timeout, what=what, every=0.05)


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """Unix socket paths must stay under 108 bytes: pytest's tmp_path is too deep."""
    d = Path(tempfile.mkdtemp(prefix="ks-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def node(api: FakeApiServer, short_tmp: Path) -> Iterator[tuple[Kubelet, StubPlugin, FakeCdi]]:
    spec = layout([0])[0]
    dirs = NodeDirs(short_tmp, spec).create()
    plugin = StubPlugin(dirs.registry, dirs.plugins / DRIVER).start()
    watcher = PluginWatcher(dirs.registry, interval=0.05)
    watcher.start()
    assert watcher.wait_for(DRIVER, 20) is not None
    client = api.client()
    cdi = FakeCdi()
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    ctx = NodeContext(
        node_name=spec.name,
        node_ip=spec.ip,
        client=client,
        dirs=dirs,
        plugins=watcher,
        events=EventRecorder(client, "kubelet", RealClock()),
        dra=DraManager(dirs.kubelet / "dra_manager_state.json"),
        cdi=cdi,
        commands=LocalCommands(
            programs={"sleeper": sleeper, "probe-ok": [sys.executable, "-c", ""]},
            path_env={"/etc/hosts": "HOSTS"},
        ),
        kubeconfig_for=lambda pod: None,
        max_grace=2.0,
    )
    kubelet = Kubelet(ctx)
    kubelet.start()
    yield kubelet, plugin, cdi
    kubelet.stop()
    watcher.stop()
    plugin.stop()


def seed_pod_with_claim(api: FakeApiServer, node: str, *, container: dict[str, Any]) -> str:
    pod = api.seed(
        PODS,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "w", "namespace": "ns", "finalizers": ["test/hold"]},
            "spec": {
                "nodeName": node,
                "containers": [container],
                "restartPolicy": "Always",
                "resourceClaims": [{"name": "cd", "resourceClaimTemplateName": "rct"}],
            },
            "status": {"resourceClaimStatuses": [{"name": "cd", "resourceClaimName": "w-cd"}]},
        },
    )
    api.seed(
        RESOURCE_CLAIMS,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "w-cd", "namespace": "ns"},
            "spec": {"devices": {"requests": [{"name": "channel"}]}},
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {
                                "request": "channel",
                                "driver": DRIVER,
                                "pool": node,
                                "device": "channel-0",
                            }
                        ]
                    }
                },
                "reservedFor": [{"resource": "pods", "name": "w", "uid": pod["metadata"]["uid"]}],
            },
        },
    )
    return str(pod["metadata"]["uid"])


def pod_status(api: FakeApiServer) -> dict[str, Any]:
    pods = api.objects(PODS)
    return pods[0].get("status", {}) if pods else {}


WORKLOAD = {
    "name": "ctr",
    "image": "ubuntu",
    "command": ["sleep", "inf"],
    "resources": {"claims": [{"name": "cd"}]},
}


def test_plugin_registration_and_reregistration(short_tmp: Path) -> None:
    registry, plugin_dir = short_tmp / "reg", short_tmp / "plugins"
    registry.mkdir()
    plugin = StubPlugin(registry, plugin_dir).start()
    watcher = PluginWatcher(registry, interval=0.05)
    watcher.start()
    try:
        p = watcher.wait_for(DRIVER, 5)
        assert p is not None and p.endpoint == str(plugin.dra_sock) and p.service == "v1.DRAPlugin"
        assert plugin.registered == [True]
        plugin.stop()
        plugin.start()  # a restarted plugin re-creates its socket: registered again
        wait_for("re-registration", lambda: plugin.registered == [True, True])
    finally:
        watcher.stop()
        plugin.stop()


def test_workload_pod_prepared_recorded_running_then_unprepared(
    api: FakeApiServer, node: tuple[Kubelet, StubPlugin, FakeCdi]
) -> None:
    kubelet, plugin, _ = node
    plugin.fail_prepare = 1
    uid = seed_pod_with_claim(api, kubelet.ctx.node_name, container=WORKLOAD)
    status = wait_for(
        "Running", lambda: pod_status(api).get("phase") == "Running" and pod_status(api)
    )
    assert status["podIP"] == kubelet.ctx.node_ip
    assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "True"
    events = [e for e in api.objects(EVENTS) if e["reason"] == "FailedPrepareDynamicResources"]
    # Repeats of one reason fold into a single Event keeping its first message; on a loaded
    # machine that can be a transient registration gap, so check the retry itself as well.
    assert events, "a failed prepare must be reported as FailedPrepareDynamicResources"
    assert plugin.fail_prepare == 0, "the injected prepare failure was never hit"
    record = kubelet.ctx.dirs.container_record("ns", "w", "ctr")
    assert "channel0" in record.read_text()
    assert len(plugin.prepared) == 1
    api.client().delete(PODS, "w", namespace="ns")  # finalizer keeps it: deletionTimestamp set
    wait_for("unprepare", lambda: plugin.unprepared == plugin.prepared)
    assert not record.exists()
    assert kubelet.ctx.dra.prepared() == {}
    assert uid


def test_unresolvable_cdi_id_fails_container_start(
    api: FakeApiServer, node: tuple[Kubelet, StubPlugin, FakeCdi]
) -> None:
    kubelet, _, cdi = node
    seed_pod_with_claim(api, kubelet.ctx.node_name, container=WORKLOAD)
    claim_uid = api.objects(RESOURCE_CLAIMS)[0]["metadata"]["uid"]
    cdi.unresolvable.add(f"k8s.{DRIVER}/claim={claim_uid}-channel-0")
    wait_for("Failed event", lambda: any(e["reason"] == "Failed" for e in api.objects(EVENTS)))
    waiting = pod_status(api)["containerStatuses"][0]["state"]["waiting"]
    assert waiting["reason"] == "CreateContainerError"
    assert "unresolvable CDI devices" in waiting["message"]
    cdi.unresolvable.clear()
    wait_for("Running", lambda: pod_status(api).get("phase") == "Running", timeout=20)


def test_local_container_runs_with_env_and_probes(
    api: FakeApiServer, node: tuple[Kubelet, StubPlugin, FakeCdi]
) -> None:
    kubelet, _, _ = node
    container = {
        "name": "daemon",
        "image": "driver",
        "command": ["sleeper"],
        "args": ["$(NODE_NAME)"],
        "env": [
            {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        ],
        "readinessProbe": {"exec": {"command": ["probe-ok"]}, "periodSeconds": 1},
        "resources": {"claims": [{"name": "cd"}]},
    }
    seed_pod_with_claim(api, kubelet.ctx.node_name, container=container)
    wait_for("Ready", lambda: pod_status(api).get("containerStatuses", [{}])[0].get("ready"))
    worker = next(iter(kubelet.workers().values()))
    run = worker._local["daemon"]
    assert run.argv[-1] == kubelet.ctx.node_name
    assert run.env["POD_IP"] == kubelet.ctx.node_ip
    assert run.env["DEV"].endswith("-channel-0")
    assert Path(run.env["HOSTS"]).read_text().startswith("# Kubernetes-managed hosts file.")
    pid = run.pid
    assert pid is not None
    api.client().delete(PODS, "w", namespace="ns")
    wait_for("process stopped", lambda: not Path(f"/proc/{pid}").exists() or _zombie(pid))


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_threads_do_not_leak(node: tuple[Kubelet, StubPlugin, FakeCdi]) -> None:
    names = {t.name for t in threading.enumerate()}
    assert any(n.startswith("pods:") for n in names)


# -- the emulated container filesystem: CDI mounts, PATH, termination message -----------------


def _local_run(tmp: Path, argv: list[str], mounts: list[Mount]) -> LocalRun:
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u"}, "spec": {"nodeName": "n"}}
    commands = LocalCommands(
        programs={"prog": argv},
        image_path=DAEMON_IMAGE_PATH,
        path_env={"/dev/termination-log": "TLOG"},
    )
    hosts = tmp / "hosts"
    hosts.write_text("127.0.0.1\tlocalhost\n")
    return LocalRun.create(
        ctx_commands=commands,
        pod=pod,
        container={"name": "c", "command": ["prog"]},
        edits=ContainerEdits(),
        mounts=mounts,
        hosts_file=hosts,
        node_ip="127.0.0.9",
        kubeconfig=None,
        log_file=tmp / "c.log",
        cwd=tmp,
    )


def test_programs_are_found_only_where_cdi_mounted_them(tmp_path: Path) -> None:
    root = FakeDriverRoot.create(tmp_path / "driver-root", python=sys.executable)
    imex = Mount("/usr/bin/nvidia-imex", str(root.binary("nvidia-imex")), read_only=True)
    run = _local_run(tmp_path, [sys.executable, "-c", "pass"], [imex])
    found = shutil.which("nvidia-imex", path=run.env["PATH"])
    assert found is not None and Path(found).resolve() == root.binary("nvidia-imex")
    assert found.startswith(str(tmp_path / "rootfs" / "c"))
    assert shutil.which("nvidia-imex-ctl", path=run.env["PATH"]) is None  # not mounted
    assert shutil.which("sh", path=run.env["PATH"]) is None  # the host's programs are not seen
    done = subprocess.run([found, "--help"], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and "nvidia-imex (simulated)" in done.stdout


def test_termination_message_reaches_state_and_last_state(tmp_path: Path) -> None:
    script = "import os; open(os.environ['TLOG'], 'w').write('Boom: detail'); raise SystemExit(3)"
    run = _local_run(tmp_path, [sys.executable, "-c", script], [])
    state = ContainerState(name="c")

    def tick() -> ContainerState:
        run.tick(state, restart_policy="Always")
        return state

    run.start(state)
    wait_for("exit", lambda: tick().terminated)
    terminated = state.to_status()["state"]["terminated"]
    assert (terminated["exitCode"], terminated["message"]) == (3, "Boom: detail")
    wait_for("restart", lambda: tick().restart_count == 1 and not state.terminated)
    status = state.to_status()
    assert status["lastState"]["terminated"]["message"] == "Boom: detail"
    assert status["restartCount"] == 1
    run.stop(1.0)


# -- finalization under faults: never give up, back off, unprepare before the final DELETE ----


def _final_deletes(api: FakeApiServer, since: int = 0) -> list[Any]:
    """DELETEs of pod ns/w with gracePeriodSeconds=0 logged after request number ``since``."""
    return [r for r in api.requests[since:] if r.method == "DELETE" and r.path.endswith("/pods/w")]


def _running_pod(api: FakeApiServer, kubelet: Kubelet) -> str:
    uid = seed_pod_with_claim(api, kubelet.ctx.node_name, container=WORKLOAD)
    wait_for("Running", lambda: pod_status(api).get("phase") == "Running")
    return uid


def test_final_delete_waits_for_a_failing_unprepare_and_retries_it(
    api: FakeApiServer, node: tuple[Kubelet, StubPlugin, FakeCdi]
) -> None:
    kubelet, plugin, _ = node
    uid = _running_pod(api, kubelet)
    plugin.fail_unprepare = 3
    start = len(api.requests)
    api.client().delete(PODS, "w", namespace="ns")
    wait_for("unprepare retried until it succeeded", lambda: plugin.unprepared, timeout=20)
    assert plugin.calls.count("unprepare") == 4, plugin.calls  # 3 failures, then success
    deletes = wait_for("final DELETE", lambda: _final_deletes(api, start)[1:])
    assert len(deletes) == 1, "the final DELETE comes once, after the unprepare succeeded"
    worker = kubelet.workers()[uid]
    wait_for("worker finished", lambda: worker.done)
    assert worker.finalize_failures == 3
    assert kubelet.ctx.dra.prepared() == {}


def test_finalization_survives_an_api_outage_with_backoff(
    api: FakeApiServer, node: tuple[Kubelet, StubPlugin, FakeCdi]
) -> None:
    kubelet, plugin, _ = node
    uid = _running_pod(api, kubelet)
    plugin.fail_unprepare = 10**6  # hold the worker in finalization until the API is down
    api.client().delete(PODS, "w", namespace="ns")
    wait_for("finalization started", lambda: plugin.calls.count("unprepare") >= 1)
    worker = kubelet.workers()[uid]
    api.set_available(False)
    down_at = len(api.requests)
    plugin.fail_unprepare = 0
    time.sleep(4.0)  # every status PATCH / DELETE in here is dropped
    attempts = [
        r
        for r in api.requests[down_at:]
        if r.method in ("PATCH", "DELETE") and r.path.startswith("/api/v1/namespaces/ns/pods/w")
    ]
    assert attempts, "the worker kept trying while the API server was down"
    # Backoff 0.25 s doubling to 2 s: about 5 tries in 4 s (a retry every 0.25 s tick: 16).
    assert len(attempts) <= 8, attempts
    assert not worker.done, "a worker must not give up on its pod during an outage"
    up_at = len(api.requests)
    api.set_available(True)
    wait_for("final DELETE after the outage", lambda: _final_deletes(api, up_at), timeout=10)
    wait_for("worker finished", lambda: worker.done)
    status = pod_status(api)
    assert status["containerStatuses"][0]["state"].get("terminated"), status
    assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "False"
    assert plugin.unprepared == plugin.prepared


def test_a_pod_that_outlives_its_worker_is_finalized_again(
    api: FakeApiServer, node: tuple[Kubelet, StubPlugin, FakeCdi]
) -> None:
    """A relist that missed the pod ends its worker without a final DELETE; when the pod shows up
    again (here: its deletion), the kubelet finishes it like the kubelet's status manager would,
    instead of ignoring every later event of that UID (a pod stuck in Terminating for good)."""
    kubelet, plugin, _ = node
    uid = _running_pod(api, kubelet)
    worker = kubelet.workers()[uid]
    worker.deleted()  # what the relist does for a pod it did not see
    wait_for("worker finished", lambda: worker.done)
    assert not worker.pod_removed
    start = len(api.requests)
    api.client().delete(PODS, "w", namespace="ns")
    wait_for("final DELETE by a new worker", lambda: _final_deletes(api, start)[1:])
    fresh = kubelet.workers()[uid]
    assert fresh is not worker
    wait_for("new worker finished", lambda: fresh.done and fresh.pod_removed)
    assert plugin.unprepared == plugin.prepared


def test_a_final_delete_that_left_the_pod_is_sent_again(
    api: FakeApiServer, node: tuple[Kubelet, StubPlugin, FakeCdi]
) -> None:
    """A final DELETE answered while the API server still holds the pod for the kubelet (a
    chaos lifecycle killed the apiserver at that moment and the pod stayed Terminating for
    good): the worker believes the API server, not the answer, and deletes again after a
    backoff. (The fake server deletes a pod without finalizers at once, so "still there" is
    given to the worker twice; what the check reads is tested below.)"""
    kubelet, plugin, _ = node
    uid = _running_pod(api, kubelet)
    worker = kubelet.workers()[uid]
    real, still_there = worker._released_by_api, [True, True]

    def released() -> bool:
        return False if still_there and still_there.pop() else real()

    worker._released_by_api = released  # type: ignore[method-assign]
    start = len(api.requests)
    api.client().delete(PODS, "w", namespace="ns")
    wait_for("worker finished", lambda: worker.done and worker.pod_removed, timeout=20)
    assert len(_final_deletes(api, start)[1:]) == 3, "sent again until the API server agreed"
    assert worker.finalize_failures == 2
    assert plugin.unprepared == plugin.prepared


def test_the_pod_is_released_when_gone_replaced_or_held_by_finalizers_only(
    api: FakeApiServer, node: tuple[Kubelet, StubPlugin, FakeCdi]
) -> None:
    kubelet, _, _ = node
    uid = _running_pod(api, kubelet)
    worker = kubelet.workers()[uid]
    assert worker._released_by_api()  # kept only by the test's finalizer
    api.client().patch(PODS, "w", {"metadata": {"finalizers": None}}, namespace="ns")
    assert not worker._released_by_api()  # the same pod, nothing but the kubelet holds it
    api.client().delete(PODS, "w", namespace="ns")
    assert worker._released_by_api()  # gone
