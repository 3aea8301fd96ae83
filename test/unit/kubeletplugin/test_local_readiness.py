"""Prepare's wait for this node's IMEX daemon with the node-local readiness record.

`DomainTracker.wait_ready` releases a channel Prepare on a Ready membership entry *or* on a
live daemon's record (:mod:`pkg.api.localready`) that names the entry's node and IP; every
other record (dead writer, other IP, other domain, no entry) leaves the decision to the entry.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pkg.api import constants as c
from pkg.api import localready
from pkg.api.localready import LocalReady, Publisher
from pkg.base.clock import RealClock
from pkg.base.types import JSON
from pkg.informers import SharedInformerFactory
from pkg.kube import resources as res
from pkg.kubeletplugin.computedomains import DomainTracker, LocalRecordReader
from pkg.kubeletplugin.state import domain_dir
from pkg.testing.clock import FakeClock
from pkg.testing.eventually import eventually
from pkg.testing.fakeapiserver import FakeApiServer

NODE = "node-a"
NS = "nvidia-dra-driver"
UID = "cd-uid-1"
IP = "10.0.0.1"


def clique(status: str, ip: str = IP, node: str = NODE) -> JSON:
    return {
        "apiVersion": c.API_VERSION,
        "kind": c.COMPUTE_DOMAIN_CLIQUE_KIND,
        "metadata": {"name": f"{UID}.cl.1", "namespace": NS},
        "daemons": [
            {"nodeName": node, "ipAddress": ip, "cliqueID": "cl.1", "index": 0, "status": status}
        ],
    }


def domain(nodes: list[JSON]) -> JSON:
    return {
        "apiVersion": c.API_VERSION,
        "kind": c.COMPUTE_DOMAIN_KIND,
        "metadata": {"name": "cd", "namespace": "team", "uid": UID},
        "spec": {"numNodes": 1},
        "status": {"nodes": nodes},
    }


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as srv:
        yield srv


def tracker(api: FakeApiServer, plugin_dir: Path, *, clique_id: str = "cl.1") -> DomainTracker:
    client = api.client()
    t = DomainTracker(
        client=client,
        informers=SharedInformerFactory(client, clock=RealClock()),
        node_name=NODE,
        driver_namespace=NS,
        clique_id=lambda: clique_id,
        clock=RealClock(),
        local_ready=lambda uid: localready.read(domain_dir(plugin_dir, uid)),
        local_poll=0.02,
    )
    t.start()
    assert t.wait_synced(5)
    return t


def daemon(plugin_dir: Path, record: LocalReady | None = None, uid: str = UID) -> Publisher:
    """A live daemon process's side of the record (its lock held)."""
    pub = Publisher(domain_dir(plugin_dir, uid))
    assert pub.acquire()
    if record is not None:
        pub.publish(record)
    return pub


def soon() -> float:
    return time.monotonic() + 0.3


def test_a_live_daemons_record_releases_the_wait_before_its_entry_says_ready(
    api: FakeApiServer, tmp_path: Path
) -> None:
    api.seed(res.COMPUTE_DOMAIN_CLIQUES, clique(c.STATUS_NOT_READY))
    t = tracker(api, tmp_path)
    pub = daemon(tmp_path)
    try:
        assert not t.wait_ready(UID, deadline=soon())
        released = threading.Event()

        def prepare() -> None:
            if t.wait_ready(UID, deadline=time.monotonic() + 10):
                released.set()

        waiter = threading.Thread(target=prepare)
        waiter.start()
        time.sleep(0.1)  # the waiter is waiting; no API event will come
        pub.publish(LocalReady(UID, NODE, IP))
        waiter.join(5)
        assert released.is_set()
        pub.withdraw()  # IMEX lost READY: the entry (NotReady) decides again
        assert not t.wait_ready(UID, deadline=soon())
    finally:
        pub.release()
        t.stop()


def test_a_dead_daemons_record_holds_prepare_like_its_not_ready_entry(
    api: FakeApiServer, tmp_path: Path
) -> None:
    """The controller marks the entry of a daemon whose container died NotReady; the record
    that daemon left behind must not release workloads against it."""
    api.seed(res.COMPUTE_DOMAIN_CLIQUES, clique(c.STATUS_NOT_READY))
    t = tracker(api, tmp_path)
    pub = daemon(tmp_path, LocalReady(UID, NODE, IP))
    try:
        assert t.wait_ready(UID, deadline=soon())
        pub.abandon()  # SIGKILL: the file stays, the lock goes
        assert (domain_dir(tmp_path, UID) / localready.FILE_NAME).exists()
        assert not t.wait_ready(UID, deadline=soon())
    finally:
        t.stop()


@pytest.mark.parametrize(
    ("record", "entry"),
    [
        (LocalReady(UID, NODE, "10.0.0.9"), clique(c.STATUS_NOT_READY)),  # replaced pod
        (LocalReady("other-uid", NODE, IP), clique(c.STATUS_NOT_READY)),
        (LocalReady(UID, "node-b", IP), clique(c.STATUS_NOT_READY)),
        (LocalReady(UID, NODE, IP), clique(c.STATUS_NOT_READY, node="node-b")),  # no entry
        (LocalReady(UID, NODE, IP), None),  # no clique, no domain status
    ],
)
def test_a_record_that_does_not_speak_for_the_entry_releases_nothing(
    api: FakeApiServer, tmp_path: Path, record: LocalReady, entry: JSON | None
) -> None:
    if entry is not None:
        api.seed(res.COMPUTE_DOMAIN_CLIQUES, entry)
    t = tracker(api, tmp_path)
    pub = daemon(tmp_path, record)
    try:
        assert not t.wait_ready(UID, deadline=soon())
    finally:
        pub.release()
        t.stop()


def test_the_status_mode_entry_works_with_the_record_too(
    api: FakeApiServer, tmp_path: Path
) -> None:
    """Cliques gate off (or a node without a clique object): ``status.nodes`` holds the entry."""
    api.seed(
        res.COMPUTE_DOMAINS,
        domain(
            [
                {
                    "name": NODE,
                    "ipAddress": IP,
                    "cliqueID": "cl.1",
                    "index": 0,
                    "status": c.STATUS_NOT_READY,
                }
            ]
        ),
    )
    [cd] = api.objects(res.COMPUTE_DOMAINS)
    uid = cd["metadata"]["uid"]  # the fake API server assigns it
    t = tracker(api, tmp_path, clique_id="")
    pub = daemon(tmp_path, uid=uid)
    try:
        assert not t.wait_ready(uid, deadline=soon())
        pub.publish(LocalReady(uid, NODE, IP))
        assert t.wait_ready(uid, deadline=soon())
    finally:
        pub.release()
        t.stop()


def test_the_record_is_polled_only_while_an_entry_it_could_speak_for_exists(
    api: FakeApiServer, tmp_path: Path
) -> None:
    """Before the daemon has joined no record can count: the wait sleeps until an event."""
    client = api.client()
    clock = FakeClock(advance_on_wait=True)
    t = DomainTracker(
        client=client,
        informers=SharedInformerFactory(client, clock=RealClock()),
        node_name=NODE,
        driver_namespace=NS,
        clique_id=lambda: "cl.1",
        clock=clock,
        local_ready=lambda uid: localready.read(domain_dir(tmp_path, uid)),
        local_poll=0.05,
    )
    t.start()
    try:
        assert t.wait_synced(5)
        assert not t.wait_ready(UID, deadline=clock.monotonic() + 10)
        assert clock.waits == [10.0]  # one wait for an event, no polling
        api.seed(res.COMPUTE_DOMAIN_CLIQUES, clique(c.STATUS_NOT_READY))
        eventually(lambda: t._entry(UID) is not None)
        clock.waits.clear()
        assert not t.wait_ready(UID, deadline=clock.monotonic() + 1)
        assert len(clock.waits) == 20 and all(w == pytest.approx(0.05) for w in clock.waits)
    finally:
        t.stop()


# -- the record is the daemon's file: read outside the lock, refused safely -----------


def test_the_record_is_read_outside_the_trackers_lock(api: FakeApiServer, tmp_path: Path) -> None:
    """While the record is read, an informer event handler (which takes the tracker's
    condition) runs to completion: a slow or hostile file can never stall the plugin's watch
    dispatch or another Prepare."""
    api.seed(res.COMPUTE_DOMAIN_CLIQUES, clique(c.STATUS_NOT_READY))
    client = api.client()
    reads: list[bool] = []  # per read: an event handler ran to completion meanwhile
    t: DomainTracker

    def reader(uid: str) -> LocalReady | None:
        handler = threading.Thread(target=lambda: t._on_update({}, {}), daemon=True)
        handler.start()
        handler.join(2)  # only a safety net: with the lock held this times out and fails
        reads.append(not handler.is_alive())
        return None

    t = DomainTracker(
        client=client,
        informers=SharedInformerFactory(client, clock=RealClock()),
        node_name=NODE,
        driver_namespace=NS,
        clique_id=lambda: "cl.1",
        clock=RealClock(),
        local_ready=reader,
        local_poll=0.02,
    )
    t.start()
    try:
        assert t.wait_synced(5)
        assert not t.wait_ready(UID, deadline=time.monotonic() + 0.1)
        assert not t.is_ready(UID)
        assert reads and all(reads), reads
    finally:
        t.stop()


def record_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "pkg.kubeletplugin.computedomains" and r.levelno == logging.WARNING
    ]


def test_a_hostile_record_counts_as_absent_with_one_warning(
    api: FakeApiServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A FIFO in place of the record (a plain read would hang the plugin): the wait ends at its
    deadline, the file is named in one warning however often it is polled (again only after the
    interval), and the membership entry still decides."""
    api.seed(res.COMPUTE_DOMAIN_CLIQUES, clique(c.STATUS_NOT_READY))
    warn_clock = FakeClock()
    client = api.client()
    t = DomainTracker(
        client=client,
        informers=SharedInformerFactory(client, clock=RealClock()),
        node_name=NODE,
        driver_namespace=NS,
        clique_id=lambda: "cl.1",
        clock=RealClock(),
        local_ready=LocalRecordReader(
            lambda uid: domain_dir(tmp_path, uid), clock=warn_clock, interval=600
        ),
        local_poll=0.01,
    )
    pub = daemon(tmp_path)
    fifo = domain_dir(tmp_path, UID) / localready.FILE_NAME
    os.mkfifo(fifo)
    t.start()
    caplog.set_level(logging.WARNING, logger="pkg.kubeletplugin.computedomains")
    try:
        assert t.wait_synced(5)
        done: list[bool] = []
        waiter = threading.Thread(
            target=lambda: done.append(t.wait_ready(UID, deadline=time.monotonic() + 0.3)),
            daemon=True,
        )
        waiter.start()
        waiter.join(5)  # safety net only
        if waiter.is_alive():
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            pytest.fail("the wait blocked on the FIFO")
        assert done == [False]
        warnings = record_warnings(caplog)
        assert len(warnings) == 1, warnings
        assert str(fifo) in warnings[0] and "FIFO" in warnings[0]
        assert not t.is_ready(UID)
        assert len(record_warnings(caplog)) == 1
        warn_clock.step(600)
        assert not t.is_ready(UID)
        assert len(record_warnings(caplog)) == 2
        api.seed(res.COMPUTE_DOMAIN_CLIQUES, clique(c.STATUS_READY))
        assert t.wait_ready(UID, deadline=time.monotonic() + 5)
    finally:
        pub.release()
        t.stop()


def test_the_reader_refuses_an_id_that_is_not_a_directory_name(tmp_path: Path) -> None:
    reader = LocalRecordReader(lambda uid: domain_dir(tmp_path, uid), clock=FakeClock())
    assert reader("../../etc") is None and reader("/etc") is None
