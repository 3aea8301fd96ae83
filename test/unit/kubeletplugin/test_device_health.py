"""Device health (KEP-4680): the ``DRAResourceHealth`` stream the kubelet reads.

Two levels: `DeviceHealthMonitor` alone with a `FakeClock` and a scripted readiness (what is
sent when, resends, cancellation), and the running plugin over its real DRA socket with the
in-process fake API server and a kubelet-side gRPC client of both proto versions (a clique entry
turning NotReady, disappearing and coming back changes the prepared devices' health; nothing
polls - every message is caused by an informer event or a checkpoint change).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from testsupport.kp_harness import (
    CLIQUE,
    DRIVER_NS,
    NODE,
    channel_params,
    running_plugin,
    seed_claim,
    seed_domain,
    set_daemon_ready,
)

from pkg.api import constants as c
from pkg.draplugin import resourcehealth as rh
from pkg.draplugin.client import DraClient
from pkg.draplugin.proto.gen import kubelet_dra_health_v1_pb2 as h1
from pkg.kube import resources as res
from pkg.kubeletplugin import devicehealth as dh
from pkg.kubeletplugin.checkpoint import ClaimEntry, ClaimState, DeviceGroup, PreparedDevice
from pkg.kubeletplugin.computedomains import DaemonReadiness
from pkg.kubeletplugin.driver import KubeletPlugin, PluginConfig
from pkg.testing.clock import FakeClock
from pkg.testing.eventually import eventually
from pkg.testing.fakeapiserver import FakeApiServer

TIMEOUT = 5.0  # real-time bound on a message that an event must cause at once


def entry(uid: str, kind: str, domain: str, device: str, *, completed: bool = True) -> ClaimEntry:
    dev = PreparedDevice(
        request_names=(kind,), pool_name=NODE, device_name=device, cdi_device_ids=("x/y=z",)
    )
    return ClaimEntry(
        uid=uid,
        state=ClaimState.PREPARE_COMPLETED if completed else ClaimState.PREPARE_STARTED,
        groups=(DeviceGroup(kind, domain, (dev,)),) if completed else (),
        namespace="team",
        name=f"claim-{uid}",
    )


class Readiness:
    """Scripted `DomainTracker.daemon_readiness`."""

    def __init__(self) -> None:
        self.ready: dict[str, bool | None] = {}

    def __call__(self, cd_uid: str) -> DaemonReadiness:
        ready = self.ready.get(cd_uid)
        return DaemonReadiness(ready, f"{cd_uid} is {ready}")


class Stream:
    """Consumes a watch in a thread, like the kubelet's receive loop."""

    def __init__(self, source: Iterator[Any]) -> None:
        self.messages: queue.Queue[Any] = queue.Queue()
        self._thread = threading.Thread(target=self._run, args=(source,), daemon=True)
        self._thread.start()

    def _run(self, source: Iterator[Any]) -> None:
        try:
            for item in source:
                self.messages.put(item)
        except grpc.RpcError as err:
            self.messages.put(err)
        self.messages.put(StopIteration)

    def next(self) -> Any:
        item = self.messages.get(timeout=TIMEOUT)
        assert not isinstance(item, grpc.RpcError), item
        return item

    def idle(self) -> bool:
        return self.messages.empty()

    def ended(self) -> bool:
        self._thread.join(TIMEOUT)
        return not self._thread.is_alive()


# -- the monitor ----------------------------------------------------------------------------------


@pytest.fixture
def monitor() -> Iterator[tuple[dh.DeviceHealthMonitor, Readiness, FakeClock]]:
    clock = FakeClock()
    readiness = Readiness()
    mon = dh.DeviceHealthMonitor(readiness=readiness, clock=clock, resend_interval=30.0)
    yield mon, readiness, clock
    mon.close()


def test_full_state_on_connect_then_only_changes(
    monitor: tuple[dh.DeviceHealthMonitor, Readiness, FakeClock],
) -> None:
    mon, readiness, clock = monitor
    readiness.ready = {"cd-1": True, "cd-2": False}
    mon.set_prepared(
        [
            entry("a", "channel", "cd-1", "channel-0"),
            entry("b", "daemon", "cd-2", "daemon-0"),
            entry("c", "channel", "cd-3", "channel-0", completed=False),  # holds no device yet
        ]
    )
    stream = Stream(mon.watch())
    assert stream.next() == [
        rh.DeviceHealth(NODE, "channel-0", rh.HEALTHY, "cd-1 is True"),
        rh.DeviceHealth(NODE, "daemon-0", rh.UNHEALTHY, "cd-2 is False"),
    ]
    # An event that changes nothing sends nothing.
    mon.changed()
    assert clock.block_until_waiters(1)
    assert stream.idle()
    readiness.ready["cd-1"] = False
    mon.changed()
    first = stream.next()[0]
    assert (first.health, first.message) == (rh.UNHEALTHY, "cd-1 is False")
    readiness.ready["cd-1"] = None  # cannot tell
    mon.changed()
    assert stream.next()[0].health == rh.UNKNOWN
    mon.set_prepared([])  # unprepared: the list is complete, so the devices simply go
    assert stream.next() == []
    mon.close()
    assert stream.ended()
    assert mon.streams() == 0


def test_unchanged_state_is_resent_before_the_kubelet_times_it_out(
    monitor: tuple[dh.DeviceHealthMonitor, Readiness, FakeClock],
) -> None:
    mon, readiness, clock = monitor
    assert rh.RESEND_INTERVAL * 2 < rh.HEALTH_TIMEOUT
    readiness.ready = {"cd-1": True}
    mon.set_prepared([entry("a", "channel", "cd-1", "channel-0")])
    stream = Stream(mon.watch())
    initial = stream.next()
    assert clock.block_until_waiters(1)
    clock.step(29.0)
    assert clock.block_until_waiters(1)
    assert stream.idle()
    clock.step(1.0)
    assert stream.next() == initial


def test_nothing_to_report_waits_for_a_change_with_no_timer(
    monitor: tuple[dh.DeviceHealthMonitor, Readiness, FakeClock],
) -> None:
    """An empty list times nothing out on the kubelet, so while no device is
    prepared a stream sleeps until a change instead of resending ``[]`` every 30 s."""
    mon, readiness, clock = monitor
    readiness.ready = {"cd-1": True}
    stream = Stream(mon.watch())
    assert stream.next() == []
    assert clock.block_until_untimed_waiters(1), "the empty stream did not wait for a change"
    assert clock.waiters() == 0 and clock.waits == []  # no resend timer
    clock.step(rh.RESEND_INTERVAL * 10)
    assert clock.block_until_untimed_waiters(1)
    assert stream.idle()
    mon.set_prepared([entry("a", "channel", "cd-1", "channel-0")])  # a prepare wakes it
    assert stream.next() == [rh.DeviceHealth(NODE, "channel-0", rh.HEALTHY, "cd-1 is True")]
    assert clock.block_until_waiters(1)  # resends while a device is reported
    mon.set_prepared([])
    assert stream.next() == []
    eventually(lambda: clock.waiters() == 0 and clock.untimed_waiters() == 1)


def test_cancel_callback_ends_the_watch(
    monitor: tuple[dh.DeviceHealthMonitor, Readiness, FakeClock],
) -> None:
    mon, _readiness, clock = monitor
    stops: list[Any] = []

    def on_cancel(stop: Any) -> bool:
        stops.append(stop)
        return True

    stream = Stream(mon.watch(on_cancel=on_cancel))
    assert stream.next() == []
    assert clock.block_until_untimed_waiters(1)
    assert mon.streams() == 1
    stops[0]()  # the kubelet went away
    assert stream.ended()
    assert mon.streams() == 0
    # A caller that is already gone (add_callback answers False) gets nothing.
    assert list(mon.watch(on_cancel=lambda _stop: False)) == []
    mon.close()
    assert list(mon.watch()) == []


def test_one_verdict_per_domain_and_one_entry_per_device() -> None:
    calls: list[str] = []

    def readiness(uid: str) -> DaemonReadiness:
        calls.append(uid)
        return DaemonReadiness(True, "ok")

    mon = dh.DeviceHealthMonitor(readiness=readiness, clock=FakeClock())
    mon.set_prepared(
        [
            entry("a", "channel", "cd-1", "channel-0"),
            entry("b", "channel", "cd-1", "channel-0"),  # e.g. a stale duplicate record
            entry("c", "daemon", "", "daemon-0"),
        ]
    )
    assert mon.snapshot() == [
        rh.DeviceHealth(NODE, "channel-0", rh.HEALTHY, "ok"),
        rh.DeviceHealth(NODE, "daemon-0", rh.UNKNOWN, "the claim names no ComputeDomain"),
    ]
    assert calls == ["cd-1"]


# -- the running plugin over its DRA socket ------------------------------------------------------


@contextmanager
def kubelet_stream(config: PluginConfig, version: str) -> Iterator[Stream]:
    with DraClient(config.dra_socket) as client:
        call = client.node_watch_resources(service=f"{version}.DRAResourceHealth")
        stream = Stream(call)
        try:
            yield stream
        finally:
            call.cancel()


def health(message: Any) -> dict[tuple[str, str], tuple[int, str]]:
    return {
        (d.device.pool_name, d.device.device_name): (d.health, d.message) for d in message.devices
    }


def set_clique(api: FakeApiServer, cd_uid: str, daemons: list[dict[str, Any]]) -> None:
    client = api.client()
    name = c.clique_object_name(cd_uid, CLIQUE)
    obj = client.get(res.COMPUTE_DOMAIN_CLIQUES, name, namespace=DRIVER_NS)
    obj["daemons"] = daemons
    client.update(res.COMPUTE_DOMAIN_CLIQUES, obj)


@pytest.mark.parametrize("version", ["v1", "v1alpha1"])
def test_channel_device_follows_the_nodes_imex_daemon(
    api: FakeApiServer, root: Path, version: str
) -> None:
    cd = seed_domain(api)
    claim = seed_claim(api, params=channel_params(cd))
    uid = claim["metadata"]["uid"]
    key = (NODE, c.CHANNEL_DEVICE_NAME)
    with running_plugin(api, root) as (plugin, kubelet):
        with kubelet_stream(plugin.config, version) as stream:
            first = stream.next()
            assert list(first.devices) == []  # nothing prepared yet: an empty, complete list
            assert kubelet.prepare(claim).claims[uid].error == ""
            msg = stream.next()
            (dev,) = msg.devices
            assert dev.health == h1.HEALTHY
            assert dev.health_check_timeout_seconds == rh.HEALTH_TIMEOUT
            assert dev.last_updated_time > 0
            # The daemon crashed: its clique entry turns NotReady.
            set_daemon_ready(api, cd, ready=False)
            health_now, text = health(stream.next())[key]
            assert health_now == h1.UNHEALTHY
            assert f"IMEX daemon on node {NODE} is NotReady" in text
            # The node left the domain: its entry is gone.
            set_clique(api, cd, [])
            health_now, text = health(stream.next())[key]
            assert health_now == h1.UNHEALTHY
            assert f"node {NODE} is not a member of ComputeDomain {cd}" in text
            # Back and Ready.
            set_daemon_ready(api, cd, ready=True)
            assert health(stream.next())[key] == (
                h1.HEALTHY,
                f"IMEX daemon on node {NODE} is Ready",
            )
            assert kubelet.unprepare(claim).claims[uid].error == ""
            assert list(stream.next().devices) == []
        # The kubelet left: its stream ended and released its worker.
        assert stream.ended()
    assert plugin.device_health.streams() == 0


def test_daemon_device_and_plugin_stop_ends_streams(api: FakeApiServer, root: Path) -> None:
    cd = seed_domain(api, ready=False)
    params = {"apiVersion": c.API_VERSION, "kind": c.DAEMON_CONFIG_KIND, "domainID": cd}
    claim = seed_claim(
        api, namespace=DRIVER_NS, device=c.DAEMON_DEVICE_NAME, request="daemon", params=params
    )
    uid = claim["metadata"]["uid"]
    plugin: KubeletPlugin
    with running_plugin(api, root) as (plugin, kubelet):
        assert kubelet.prepare(claim).claims[uid].error == ""  # daemon claims do not wait
        with kubelet_stream(plugin.config, "v1") as stream:
            assert health(stream.next()) == {
                (NODE, c.DAEMON_DEVICE_NAME): (
                    h1.UNHEALTHY,
                    f"IMEX daemon on node {NODE} is NotReady in ComputeDomain {cd}",
                )
            }
            set_daemon_ready(api, cd, ready=True)
            assert health(stream.next())[(NODE, c.DAEMON_DEVICE_NAME)][0] == h1.HEALTHY
            plugin.stop()  # the kubelet sees the stream end (and retries after 5 s)
            assert stream.ended()
            assert stream.messages.get_nowait() is StopIteration


def test_unknown_without_the_domain(api: FakeApiServer, root: Path) -> None:
    """A prepared claim whose ComputeDomain is gone: the plugin cannot tell (non-clique node)."""
    cd = seed_domain(api, clique="")
    claim = seed_claim(api, params=channel_params(cd))
    uid = claim["metadata"]["uid"]
    with running_plugin(api, root, clique="") as (plugin, kubelet):
        assert kubelet.prepare(claim).claims[uid].error == ""
        with kubelet_stream(plugin.config, "v1") as stream:
            assert health(stream.next())[(NODE, c.CHANNEL_DEVICE_NAME)][0] == h1.HEALTHY
            client = api.client()
            domain = api.objects(res.COMPUTE_DOMAINS)[0]["metadata"]
            client.delete(res.COMPUTE_DOMAINS, domain["name"], namespace=domain["namespace"])
            assert health(stream.next())[(NODE, c.CHANNEL_DEVICE_NAME)] == (
                h1.UNKNOWN,
                f"ComputeDomain {cd} not found",
            )
