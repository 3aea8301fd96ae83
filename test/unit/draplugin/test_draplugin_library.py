"""The kubelet-plugin library on its own, with a toy driver that is not ComputeDomain.

Proves the library/driver boundary from the library's side: a driver of another name gets
whole, allocated ResourceClaims (the library fetched them and checked the UID), bad references
and unfetchable claims never reach it, duplicates are answered once, every claim error becomes
upstream's per-claim text, the slice publisher publishes exactly the devices it is handed, and
the liveness service answers the driver's own checks - all over real sockets with the one
kubelet-side client (`pkg.draplugin.client`).
"""

from __future__ import annotations

import copy
import shutil
import tempfile
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from pkg.base.clock import RealClock
from pkg.base.types import JSON
from pkg.draplugin.claims import ClaimRef
from pkg.draplugin.client import DraClient, RegistrationClient
from pkg.draplugin.errors import RetryableError
from pkg.draplugin.fanout import ClaimFanOut
from pkg.draplugin.health import NOT_SERVING, SERVING, HealthServicer
from pkg.draplugin.registration import RegistrationServicer
from pkg.draplugin.server import PluginServers
from pkg.draplugin.slices import SlicePublisher
from pkg.informers import Lister, SharedInformerFactory
from pkg.kube import resources as res
from pkg.testing.eventually import eventually
from pkg.testing.fakeapiserver import FakeApiServer

DRIVER = "gpu.example.com"
NODE = "node-x"


@dataclass(frozen=True)
class ToyDevice:
    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]


class ToyDriver:
    """Prepares every claim as one device named after the claim; fails claims named bad-*."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.prepared: list[JSON] = []
        self.unprepared: list[ClaimRef] = []

    def prepare_claim(self, claim: JSON, *, deadline: float) -> Sequence[ToyDevice]:
        with self.lock:
            self.prepared.append(claim)
        name = claim["metadata"]["name"]
        if name.startswith("bad-"):
            raise RetryableError("toy device busy")
        return [ToyDevice(("req/sub",), NODE, f"dev-{name}", (f"{DRIVER}/gpu={name}",))]

    def unprepare_claim(self, claim: ClaimRef, *, deadline: float) -> None:
        with self.lock:
            self.unprepared.append(claim)


class Observer:
    def __init__(self) -> None:
        self.requests: list[str] = []
        self.failures: list[tuple[str, bool]] = []

    @contextmanager
    def track(self, operation: str) -> Iterator[None]:
        self.requests.append(operation)
        yield

    def claim_failed(self, operation: str, *, permanent: bool) -> None:
        self.failures.append((operation, permanent))


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        server.seed(res.NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        yield server


@pytest.fixture
def sockets() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="dl", dir="/tmp"))  # Unix socket paths stay short
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def claim(api: FakeApiServer, name: str, *, allocated: bool = True) -> JSON:
    status: JSON = {}
    if allocated:
        result = {"request": "req", "driver": DRIVER, "pool": NODE, "device": "gpu-0"}
        status = {"allocation": {"devices": {"results": [result]}}}
    return api.seed(
        res.RESOURCE_CLAIMS,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "team"},
            "spec": {"devices": {"requests": [{"name": "req"}]}},
            "status": status,
        },
    )


def ref(obj: JSON) -> ClaimRef:
    return ClaimRef.of(obj)


@contextmanager
def serving(
    api: FakeApiServer, sockets: Path, driver: ToyDriver, observer: Observer
) -> Iterator[PluginServers]:
    fanout = ClaimFanOut(driver=driver, client=api.client(), observer=observer)
    servers = PluginServers(
        handler=fanout,
        registration=RegistrationServicer(driver_name=DRIVER, endpoint=str(sockets / "dra.sock")),
        dra_socket=sockets / "dra.sock",
        registration_socket=sockets / "reg.sock",
    )
    servers.start()
    try:
        yield servers
    finally:
        servers.stop()
        fanout.shutdown()


def test_a_foreign_driver_gets_whole_checked_claims_and_per_claim_answers(
    api: FakeApiServer, sockets: Path
) -> None:
    good, bad = claim(api, "good"), claim(api, "bad-1")
    unallocated = claim(api, "pending", allocated=False)
    replaced = ClaimRef(namespace="team", uid="not-the-uid", name="good")
    missing = ClaimRef(namespace="team", uid="u-missing", name="gone")
    invalid = ClaimRef(namespace="Team/..", uid="u-invalid", name="x")
    driver, observer = ToyDriver(), Observer()
    with serving(api, sockets, driver, observer), DraClient(sockets / "dra.sock") as kubelet:
        refs = [ref(good), ref(good), ref(bad), ref(unallocated), replaced, missing, invalid]
        response = kubelet.node_prepare_resources(refs)

    answers = dict(response.claims)
    assert set(answers) == {r.uid for r in refs}  # one entry per UID, duplicates once
    [device] = answers[good["metadata"]["uid"]].devices
    assert (device.device_name, list(device.request_names)) == ("dev-good", ["req"])
    assert list(device.cdi_device_ids) == [f"{DRIVER}/gpu=good"]
    assert answers[good["metadata"]["uid"]].error == ""
    expected = {
        bad["metadata"]["uid"]: "retryable error: toy device busy",
        unallocated["metadata"]["uid"]: "permanent error: ResourceClaim team/pending is not "
        "allocated",
        "not-the-uid": "permanent error: ResourceClaim team/good has UID",
        "u-missing": "permanent error: ResourceClaim team/gone not found",
        "u-invalid": "permanent error: invalid claim reference: namespace 'Team/..'",
    }
    by_uid = {r.uid: r for r in refs}
    for uid, text in expected.items():
        prefix = f"error preparing devices for claim '{by_uid[uid]}': "
        assert answers[uid].error.startswith(prefix + text), answers[uid].error

    # The driver saw only the two fetched, allocated claims with the right UID - whole objects.
    seen = sorted(driver.prepared, key=lambda c: c["metadata"]["name"])
    assert [c["metadata"]["name"] for c in seen] == ["bad-1", "good"]
    assert all(c["status"]["allocation"] for c in seen)
    assert observer.requests == ["prepare"]
    assert sorted(observer.failures) == [("prepare", False)] + [("prepare", True)] * 4


def test_unprepare_hands_references_on_and_empty_requests_are_not_counted(
    api: FakeApiServer, sockets: Path
) -> None:
    driver, observer = ToyDriver(), Observer()
    gone = ClaimRef(namespace="team", uid="u-1", name="deleted-long-ago")
    with (
        serving(api, sockets, driver, observer),
        DraClient(sockets / "dra.sock", service="v1beta1.DRAPlugin") as kubelet,
    ):
        assert dict(kubelet.node_prepare_resources([]).claims) == {}
        response = kubelet.node_unprepare_resources([gone, gone])
    assert {uid: r.error for uid, r in response.claims.items()} == {"u-1": ""}
    assert driver.unprepared == [gone]
    assert observer.requests == ["unprepare"]


def test_registration_and_liveness_through_the_kubelet_client(
    api: FakeApiServer, sockets: Path
) -> None:
    healthy = {"custom": True}
    with serving(api, sockets, ToyDriver(), Observer()) as servers:
        with RegistrationClient(servers.registration_socket) as reg:
            info = reg.get_info()
            assert (info.type, info.name, info.endpoint) == (
                "DRAPlugin",
                DRIVER,
                str(servers.dra_socket),
            )
        health = HealthServicer(
            registration_socket=servers.registration_socket,
            dra_socket=servers.dra_socket,
            registration=RegistrationServicer(driver_name=DRIVER, endpoint=""),
            checks={"custom": lambda: healthy["custom"]},
        )
        assert health.status_of("liveness") == SERVING
        assert health.status_of("custom") == SERVING
        healthy["custom"] = False
        assert health.status_of("custom") == NOT_SERVING
        assert health.status_of("checkpoint") is None  # the library knows no driver's names
    assert health.status_of("liveness") == NOT_SERVING  # sockets gone


def test_a_client_never_rides_another_clients_connection(api: FakeApiServer, sockets: Path) -> None:
    """Each client dials the socket itself, as each kubelet ClientConn does: while another
    client still holds a connection to the plugin, a client of a socket path that is gone
    fails (from gRPC's global subchannel pool it would reuse that connection and succeed, and a
    liveness probe would call a deleted socket healthy)."""
    with serving(api, sockets, ToyDriver(), Observer()) as servers:
        moved = servers.registration_socket.with_name("moved.sock")
        with RegistrationClient(servers.registration_socket) as held:
            held.get_info()
            servers.registration_socket.rename(moved)
            try:
                with (
                    RegistrationClient(servers.registration_socket) as fresh,
                    pytest.raises(grpc.RpcError),
                ):
                    fresh.get_info(timeout=2)
                with RegistrationClient(moved) as elsewhere:
                    elsewhere.get_info()
            finally:
                moved.rename(servers.registration_socket)


def test_slice_publisher_publishes_exactly_the_devices_it_is_handed(api: FakeApiServer) -> None:
    devices: list[JSON] = [{"name": "gpu-0", "attributes": {"model": {"string": "toy"}}}]
    factory = SharedInformerFactory(api.client(), clock=RealClock())
    publisher = SlicePublisher(
        client=api.client(),
        informers=factory,
        driver_name=DRIVER,
        node_name=NODE,
        devices=devices,
        retry_delay=0.02,
    )
    devices[0]["name"] = "mutated-after-construction"  # the publisher keeps its own copy
    publisher.start()
    try:
        [obj] = eventually(lambda: api.objects(res.RESOURCE_SLICES), what="the slice")
    finally:
        publisher.stop()
        factory.shutdown()
    assert obj["metadata"]["name"] == f"{NODE}-{DRIVER}"
    assert obj["spec"]["driver"] == DRIVER
    assert obj["spec"]["devices"] == [{"name": "gpu-0", "attributes": {"model": {"string": "toy"}}}]


class _DroppingClient:
    """A client whose API server drops a device field its feature gates turn off (as a 1.35
    server drops ``allowMultipleAllocations``); counts the slice writes."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.writes = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _write(self, verb: str, resource: Any, obj: JSON) -> JSON:
        self.writes += 1
        body = copy.deepcopy(obj)
        for device in body["spec"]["devices"]:
            device.pop("allowMultipleAllocations", None)
        stored: JSON = getattr(self._inner, verb)(resource, body)
        return stored

    def create(self, resource: Any, obj: JSON, **kw: Any) -> JSON:
        return self._write("create", resource, obj)

    def update(self, resource: Any, obj: JSON, **kw: Any) -> JSON:
        return self._write("update", resource, obj)


def test_slice_publisher_accepts_the_servers_form_of_its_last_write(api: FakeApiServer) -> None:
    """A field the API server drops is written once, not rewritten on every pass; a real
    change of the devices is still written."""
    client = _DroppingClient(api.client())
    devices: list[JSON] = [{"name": "gpu-0", "allowMultipleAllocations": True}]
    factory = SharedInformerFactory(api.client(), clock=RealClock())
    publisher = SlicePublisher(
        client=client,
        informers=factory,
        driver_name=DRIVER,
        node_name=NODE,
        devices=devices,
        retry_delay=0.02,
    )
    factory.start()
    try:
        assert factory.wait_for_cache_sync(10)
        lister = Lister(
            factory.informer_for(
                res.RESOURCE_SLICES, field_selector=f"spec.nodeName={NODE}"
            ).indexer,
            res.RESOURCE_SLICES,
        )

        def generation() -> int:
            return max([int(s["spec"]["pool"]["generation"]) for s in lister.list()] or [0])

        publisher.sync()
        eventually(lambda: generation() == 1, what="the created slice in the cache")
        for _ in range(3):
            publisher.sync()
        assert client.writes == 1
        publisher.set_devices([{"name": "gpu-1", "allowMultipleAllocations": True}])
        publisher.sync()
        assert client.writes == 2
        eventually(lambda: generation() == 2, what="the updated slice in the cache")
        publisher.sync()
        assert client.writes == 2
        [obj] = api.objects(res.RESOURCE_SLICES)
        assert obj["spec"]["devices"] == [{"name": "gpu-1"}]
    finally:
        factory.shutdown()
