"""HttpWatchStream's cancellation never leaves a live watch connection in the client's pool.

A `stop()` that lands while the watch request is in flight finds no response to shut down; the
stream then ends at once, and the connection (on which the server is already streaming) must
go back to the pool closed: the next request on a live one would read watch chunks as its
response. The opener here runs `stop()` itself, so the race is won the same way every run.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest
import urllib3

from pkg.kube import resources as res
from pkg.kube.config import load_api_client
from pkg.kube.errors import ConnectionFailedError
from pkg.kube.watch import HttpWatchStream
from pkg.testing.fakeapiserver import FakeApiServer


def test_a_stop_during_the_request_returns_no_live_connection_to_the_pool() -> None:
    # Bookmarks are the only thing the server sends on this watch; until the first one the
    # connection looks idle, which is when a leaked one would be reused.
    with FakeApiServer(bookmark_interval=0.5) as api:
        pool = urllib3.PoolManager(num_pools=1, maxsize=1, retries=False)
        path = res.NODES.path()
        query = "?watch=true&allowWatchBookmarks=true&timeoutSeconds=30"
        stream: HttpWatchStream | None = None

        def opener() -> urllib3.BaseHTTPResponse:
            resp = pool.request("GET", api.url + path + query, preload_content=False)
            assert resp.status == 200 and stream is not None
            stream.stop()  # after the request, before the stream holds its response
            return resp

        stream = HttpWatchStream(opener, path=path, timeout_seconds=30)
        assert list(stream) == []
        api.clear_log()
        for _ in range(3):  # the pool's one connection slot, used again and again
            resp = pool.request("GET", api.url + path, timeout=5.0)
            assert resp.status == 200 and json.loads(resp.data)["kind"] == "NodeList"
        assert api.request_log == [("GET", path)] * 3
        pool.clear()


def test_a_silent_watch_with_bookmarks_is_dropped_after_the_idle_timeout() -> None:
    """A watch that asked for bookmarks and hears nothing, not even a bookmark, is a dead
    connection (kube-apiserver bookmarks every watch at least once a minute): the client ends
    it with ConnectionFailedError after ``watch_idle_timeout`` and the reflector watches again;
    one that hears bookmarks lives on. Real time: the deadline is the socket's read timeout
    (0.3 s and 2 s keep the test short)."""
    with FakeApiServer(bookmark_interval=60.0) as api:
        rv = str(api.store.rv)
        stream = api.client(watch_idle_timeout=0.3).watch(
            res.NODES, resource_version=rv, timeout_seconds=60
        )
        started = time.monotonic()
        with pytest.raises(ConnectionFailedError):
            next(iter(stream))
        assert time.monotonic() - started < 30, "the server's own timeout ended it, not ours"
    with FakeApiServer(bookmark_interval=0.5) as api:
        rv = str(api.store.rv)
        client = api.client(watch_idle_timeout=2.0)
        stream = client.watch(res.NODES, resource_version=rv, timeout_seconds=4)
        events = [e.type for e in stream]  # bookmarks every 0.5 s, then the server's end
        assert events and set(events) == {"BOOKMARK"}
        quiet = client.watch(
            res.NODES, resource_version=rv, timeout_seconds=3, allow_watch_bookmarks=False
        )
        assert list(quiet) == []  # no bookmarks asked: only the server's timeout ends it


def test_api_clients_keep_their_connections_alive(tmp_path: Path) -> None:
    """load_api_client turns on TCP keepalive (client-go's timings) on every pooled socket."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "c",
                "clusters": [{"name": "k", "cluster": {"server": "http://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
            }
        )
    )
    client = load_api_client(str(kubeconfig))
    options = client.rest_client.pool_manager.connection_pool_kw.get("socket_options") or []
    assert (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1) in options
